"""Judging a firewall the operator runs (hk3s:firewall.managed or
workers[].firewall false) against the rules the cluster needs from it.

The join reads the node with `inspect_firewall(session, operator=True)` and
calls `evaluate_operator_firewall(inspection, required)`, `required` being the
node's `inbound_rules(...)`. SSH rules and NodePort rules are not required (the
join reached SSH already; NodePorts are the operator's call), but nothing may be
open wider than the plan: every port of the plan (and of `listening`, the ports
the node listens on that the plan may not name, `firewall_plan.listening_ports`),
8888/tcp, and NodePorts unless the stack opens them, is checked against each
source class the plan does not name: every source, and a host on each of the
node's own networks that is not a node (another host on its segment; the network of each
interface's address: a /32 address, as Hetzner gives its private interfaces, names none).
What such a source reaches is `exposed`. The report's `stops_join` is true when an active
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
import fnmatch
import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from node_operations.firewall_plan import ANY_IPV4, NODEPORT_RANGE, PortRule
from node_operations.host_firewall.backend import Backend, Probe, UndeterminedError
from node_operations.host_firewall.backends import BACKENDS
from node_operations.host_firewall.inspection import FirewallBackend, FirewallInspection, inspect_firewall
from node_operations.host_firewall.plan import (
    FABRIC_INTERFACE_PATTERNS,
    FABRIC_INTERFACES,
    OPERATOR_CLOSED_PORT,
    FirewallError,
    IPNetwork,
    every_source,
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
    """Ports this firewall opens wider than the plan: each with the source class that gets in
    (0.0.0.0/0, or one of the node's own networks, whose address that is not a node the
    purpose names)."""
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
        listing = "; ".join(
            f"{rule.port}/{rule.protocol} to {'every source' if rule.sources == (ANY_IPV4,) else rule.sources[0]} "
            f"({rule.purpose})"
            for rule in self.exposed
        )
        return (
            f" {self.node}: the host firewall ({self.firewall}) opens wider than the cluster's plan: {listing}. "
            "Open each only to the sources the plan names (8888/tcp to none outside the node)."
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
    inspection: FirewallInspection,
    required: Sequence[PortRule],
    *,
    listening: Sequence[PortRule] = (),
    none_acknowledged: bool = False,
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
        node, kind, True, True, tuple(missing), exposed=_exposed(backend, inspection, required, listening)
    )


def _closed_ports(required: Sequence[PortRule], listening: Sequence[PortRule]) -> list[PortRule]:
    """Each port to judge once, with every source the plan opens it to: the plan's ports
    but SSH (open to every source on purpose), the ones the node listens on, 8888/tcp (to
    none) and the NodePorts (to every source only when the stack opens them)."""
    always = [
        PortRule(str(OPERATOR_CLOSED_PORT), "tcp", (), "must stay closed to outside traffic"),
        PortRule(NODEPORT_RANGE, "tcp", (), "NodePorts, closed unless hk3s:firewall.nodeports_open"),
        PortRule(NODEPORT_RANGE, "udp", (), "NodePorts, closed unless hk3s:firewall.nodeports_open"),
    ]
    merged: dict[tuple[str, str], PortRule] = {}
    for rule in (*required, *listening, *always):
        if is_ssh_rule(rule):
            continue
        key = (rule.port, rule.protocol)
        known = merged.get(key)
        merged[key] = (
            rule
            if known is None
            else PortRule(rule.port, rule.protocol, (*known.sources, *rule.sources), known.purpose)
        )
    return list(merged.values())


def _segments(inspection: FirewallInspection) -> list[tuple[IPNetwork, ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """The node's own IPv4 networks outside the cluster fabric, each with the node's address
    there: what a host that is not a node shares with it (a private network's other servers)."""
    segments: list[tuple[IPNetwork, ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    for entry in inspection.addresses:
        fabric = entry.interface in FABRIC_INTERFACES or any(
            fnmatch.fnmatch(entry.interface, pattern) for pattern in FABRIC_INTERFACE_PATTERNS
        )
        if entry.network.version != 4 or entry.network.prefixlen >= 31 or entry.address.is_loopback or fabric:
            continue
        segments.append((entry.network, entry.address))
    return segments


def _stranger(
    network: IPNetwork, allowed: Sequence[IPNetwork], local: set[str]
) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address on `network` that the plan does not name for the port and that is not the
    node's own: from the top of the network down, a few hundred tries at most."""
    highest = int(network.broadcast_address) - 1
    for offset in range(min(256, network.num_addresses - 2)):
        candidate = ipaddress.ip_address(highest - offset)
        if str(candidate) in local or any(candidate in net for net in allowed):
            continue
        return candidate
    return None


# Addresses on the internet, one of which is on none of the node's networks and named by no rule:
# the sample of "every source" when a rule for part of the address space (a peer) leaves the
# checker unable to judge all of it at once.
_INTERNET_SAMPLES = ("192.0.2.1", "198.51.100.1", "203.0.113.1", "100.64.0.1")


def _lets_everyone_in(
    backend: Backend,
    inspection: FirewallInspection,
    probe: Probe,
    allowed: Sequence[IPNetwork],
    segments: Sequence[tuple[IPNetwork, ipaddress.IPv4Address | ipaddress.IPv6Address]],
) -> bool:
    """Whether the firewall lets every source reach the probe's port: asked for all addresses
    at once, else (undetermined) for an address on the internet no plan rule and no network of
    the node's holds."""
    try:
        return backend.allows(inspection, probe)
    except UndeterminedError:
        pass
    for sample in map(ipaddress.ip_address, _INTERNET_SAMPLES):
        if any(sample in network for network in allowed) or any(sample in network for network, _ in segments):
            continue
        with contextlib.suppress(UndeterminedError):
            return backend.allows(inspection, replace(probe, source=ipaddress.ip_network(sample)))
        return False
    return False


def _exposed(
    backend: Backend, inspection: FirewallInspection, required: Sequence[PortRule], listening: Sequence[PortRule]
) -> tuple[PortRule, ...]:
    """What this firewall opens wider than the plan (see the module docstring). A firewall whose
    rules cannot tell is not accused."""
    everyone = ipaddress.ip_network(ANY_IPV4)
    segments = _segments(inspection)
    local = inspection.local_addresses()
    exposed: list[PortRule] = []
    for rule in _closed_ports(required, listening):
        allowed = source_networks(rule.sources) if rule.sources else ()
        if every_source(allowed):
            continue
        first, last = port_range(rule.port)
        if _lets_everyone_in(backend, inspection, Probe(everyone, rule.protocol, first, last), allowed, segments):
            exposed.append(PortRule(rule.port, rule.protocol, (ANY_IPV4,), rule.purpose))
            continue
        for network, _ in segments:
            stranger = _stranger(network, allowed, local)
            if stranger is None:
                continue
            probe = Probe(ipaddress.ip_network(stranger), rule.protocol, first, last)
            with contextlib.suppress(UndeterminedError):
                if backend.allows(inspection, probe):
                    purpose = f"{rule.purpose}; {stranger} there is not a node and gets in"
                    exposed.append(PortRule(rule.port, rule.protocol, (str(network),), purpose))
                    break
    return tuple(exposed)


async def require_host_firewall(
    target: SshTarget, required: Sequence[PortRule], *, listening: Sequence[PortRule], none_acknowledged: bool
) -> None:
    """Where the operator runs a node's firewall (the server), raise a FirewallError naming the
    node and the fix when it stops a join would stop: none active unless the stack acknowledges
    it, a rule of `required` missing, or a port open wider than the plan. Reads only, changes nothing."""
    async with open_session(target, shared=True) as session:
        inspection = await inspect_firewall(session, operator=True)
    report = evaluate_operator_firewall(inspection, required, listening=listening, none_acknowledged=none_acknowledged)
    if report.stops_join:
        raise FirewallError(report.node, report.message().strip().removeprefix(f"{report.node}: "))
