"""Judging a firewall the operator runs (hk3s:firewall.managed or
workers[].firewall false) against the rules the cluster needs from it.

The join reads the node with `inspect_firewall(session, operator=True)` and
calls `evaluate_operator_firewall(inspection, required)`, `required` being the
node's `inbound_rules(...)`. SSH rules and NodePort rules are not required (the
join reached SSH already; NodePorts are the operator's call), but what must stay
closed is checked: 8888/tcp, and NodePorts unless the stack opens them, open to
every source are `exposed`. The report's `stops_join` is true when an active
firewall (UFW active, firewalld running, or an nftables input hook with a drop
policy or drop rules) misses rules or exposes such a port, and when no firewall is
active at all unless the stack acknowledges that (`none_acknowledged`,
hk3s:firewall.none_acknowledged): every port such a node listens on, the kubelet's and
8888/tcp included, is open to whoever reaches it;
`missing` lists them (all required rules when it cannot tell, `determined`
false and `reason` saying why); `message()` is the text to show.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from node_operations.firewall_plan import ANY_IPV4, NODEPORT_RANGE, PortRule
from node_operations.host_firewall.backend import Backend, Probe, UndeterminedError
from node_operations.host_firewall.backends import BACKENDS
from node_operations.host_firewall.inspection import FirewallBackend, FirewallInspection, inspect_firewall
from node_operations.host_firewall.plan import (
    OPERATOR_CLOSED_PORT,
    FirewallError,
    is_nodeport_rule,
    is_ssh_rule,
    port_range,
    source_networks,
)
from remote_access.ssh import SshTarget, open_session

OperatorFirewallKind = Literal["none", "ufw", "firewalld", "nftables"]
# UFW and firewalld run on nftables (or iptables) themselves: their own rules
# are what the operator reads and edits, so they are judged before raw nftables.
_JUDGED_IN_ORDER: tuple[FirewallBackend, ...] = ("ufw", "firewalld", "nftables")


@dataclass(frozen=True)
class OperatorFirewallReport:
    """A firewall the operator runs, checked against what the cluster needs."""

    node: str
    firewall: OperatorFirewallKind
    active: bool
    determined: bool
    missing: tuple[PortRule, ...]
    reason: str = ""
    exposed: tuple[PortRule, ...] = ()
    """Ports the cluster keeps closed that this firewall opens to every source."""
    none_acknowledged: bool = False
    """The stack accepts nodes with no host firewall at all (hk3s:firewall.none_acknowledged)."""

    @property
    def stops_join(self) -> bool:
        """The join must stop: an active firewall lacks (or may lack) rules, or opens to every
        source a port that must stay closed; or no firewall is active and the stack has not
        acknowledged running without one."""
        if not self.active:
            return not self.none_acknowledged
        return bool(self.missing or self.exposed)

    def message(self) -> str:
        """What to tell the operator, naming the node, the rules and the way out."""
        if not self.active:
            head = (
                f"{self.node}: no active host firewall found, and hk3s does not run this node's firewall "
                "(hk3s:firewall.managed or hk3s:workers[].firewall false): every port it listens on, the "
                "kubelet's 10250/tcp, 8888/tcp and NodePorts included, is open to whoever reaches it."
            )
            if self.none_acknowledged:
                return head + " Acknowledged by hk3s:firewall.none_acknowledged."
            return (
                f"{head} Start a host firewall that allows the cluster's rules and keeps 8888/tcp closed, or let "
                "hk3s run it (hk3s:workers[].firewall or hk3s:firewall.managed true), or, if another layer "
                "filters this node's traffic, acknowledge it with hk3s:firewall.none_acknowledged true; "
                "then run again."
            )
        if not self.missing and not self.exposed:
            return f"{self.node}: the {self.firewall} firewall allows every port the cluster needs"
        if not self.missing:
            return self._exposed_sentence().lstrip() + (
                " Then run again, or let hk3s run this node's firewall (hk3s:workers[].firewall or "
                "hk3s:firewall.managed true)."
            )
        listing = "; ".join(
            f"{rule.port}/{rule.protocol} from {', '.join(rule.sources)} ({rule.purpose})" for rule in self.missing
        )
        head = f"{self.node}: the host firewall ({self.firewall}) is not managed by hk3s and " + (
            f"does not allow: {listing}."
            if self.determined
            else f"could not be checked ({self.reason}); make sure it allows: {listing}."
        )
        commands = self.suggested_commands()
        hint = f" For example: {' ; '.join(commands)}." if commands else ""
        return (
            f"{head}{hint}{self._exposed_sentence()} Then run again, or let hk3s run this node's firewall "
            "(hk3s:workers[].firewall or hk3s:firewall.managed true). Keep 8888/tcp closed to outside traffic "
            "and NodePorts limited."
        )

    def _exposed_sentence(self) -> str:
        if not self.exposed:
            return ""
        listing = "; ".join(f"{rule.port}/{rule.protocol} ({rule.purpose})" for rule in self.exposed)
        return (
            f" {self.node}: the host firewall ({self.firewall}) opens to every source what must stay closed: "
            f"{listing}; close it."
        )

    def suggested_commands(self) -> list[str]:
        """Commands that add the missing rules, for UFW and firewalld."""
        commands: list[str] = []
        for rule in self.missing:
            for source in rule.sources:
                if self.firewall == "ufw":
                    port = rule.port.replace("-", ":")
                    commands.append(
                        shlex.join(["ufw", "allow", "proto", rule.protocol, "from", source, "to", "any", "port", port])
                    )
                elif self.firewall == "firewalld":
                    family = "ipv6" if ":" in source else "ipv4"
                    rich = (
                        f'rule family="{family}" source address="{source}" '
                        f'port port="{rule.port}" protocol="{rule.protocol}" accept'
                    )
                    commands.append(shlex.join(["firewall-cmd", "--permanent", f"--add-rich-rule={rich}"]))
        if self.firewall == "firewalld" and commands:
            commands.append("firewall-cmd --reload")
        return commands


def _operator_probes(required: Sequence[PortRule]) -> list[tuple[PortRule, list[Probe]]]:
    probes: list[tuple[PortRule, list[Probe]]] = []
    for rule in required:
        if is_ssh_rule(rule) or is_nodeport_rule(rule):
            continue
        first, last = port_range(rule.port)
        networks = source_networks(rule.sources)
        probes.append((rule, [Probe(network, rule.protocol, first, last) for network in networks]))
    return probes


def evaluate_operator_firewall(
    inspection: FirewallInspection, required: Sequence[PortRule], *, none_acknowledged: bool = False
) -> OperatorFirewallReport:
    """Check an operator-run firewall against `required` (see the module docstring)."""
    node = inspection.node
    probes = _operator_probes(required)
    kind = next((name for name in _JUDGED_IN_ORDER if BACKENDS[name].filtering(inspection)), None)
    if kind is None:
        return OperatorFirewallReport(node, "none", False, True, (), none_acknowledged=none_acknowledged)
    backend = BACKENDS[kind]
    missing: list[PortRule] = []
    try:
        for rule, rule_probes in probes:
            blocked = [probe for probe in rule_probes if not backend.allows(inspection, probe)]
            if blocked:
                missing.append(PortRule(rule.port, rule.protocol, tuple(str(p.source) for p in blocked), rule.purpose))
    except UndeterminedError as why:
        return OperatorFirewallReport(
            node, kind, True, False, tuple(rule for rule, _ in probes), f"cannot tell from the {kind} rules: {why}"
        )
    return OperatorFirewallReport(
        node, kind, True, True, tuple(missing), exposed=_exposed(backend, inspection, required)
    )


def _exposed(backend: Backend, inspection: FirewallInspection, required: Sequence[PortRule]) -> tuple[PortRule, ...]:
    """What the cluster keeps closed and this firewall opens to every source: 8888/tcp always,
    NodePorts unless the stack opens them (hk3s:firewall.nodeports_open). A firewall whose
    rules cannot tell is not accused."""
    everyone = ipaddress.ip_network(ANY_IPV4)
    closed = [PortRule(str(OPERATOR_CLOSED_PORT), "tcp", (ANY_IPV4,), "must stay closed to outside traffic")]
    if not any(is_nodeport_rule(rule) for rule in required):
        closed += [
            PortRule(NODEPORT_RANGE, protocol, (ANY_IPV4,), "NodePorts, closed unless hk3s:firewall.nodeports_open")
            for protocol in ("tcp", "udp")
        ]
    exposed: list[PortRule] = []
    for rule in closed:
        first, last = port_range(rule.port)
        with contextlib.suppress(UndeterminedError):
            if backend.allows(inspection, Probe(everyone, rule.protocol, first, last)):
                exposed.append(rule)
    return tuple(exposed)


async def require_host_firewall(target: SshTarget, *, none_acknowledged: bool) -> None:
    """Where the operator runs a node's firewall and none is active, raise a FirewallError
    naming the node and the fix, unless the stack acknowledges it. Reads only, changes nothing."""
    async with open_session(target, shared=True) as session:
        inspection = await inspect_firewall(session, operator=True)
    report = evaluate_operator_firewall(inspection, (), none_acknowledged=none_acknowledged)
    if not report.active and report.stops_join:
        raise FirewallError(report.node, report.message())
