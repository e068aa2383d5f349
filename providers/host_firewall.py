"""HostFirewall: the node's own firewall (UFW, firewalld or nftables), built
from node_operations.firewall_plan so it agrees with the cloud firewall.

`create` and `update` apply the node's rules in one atomic change (adopting
what an interrupted run left); `read` reads the rules in force back, so
`pulumi refresh` shows drift; `delete` takes away only the program's own
table, rules or zones. Outputs: `backend` and `rule_count` (rules in the
program's table, tagged UFW rules, or entries of its firewalld zones).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from node_operations.firewall_plan import PortRule
from node_operations.host_firewall.plan import NodeFirewallPlan
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    pin_recorded_host_key,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, is_known, known
from remote_access.ssh import RemoteCommandError, SshError

if TYPE_CHECKING:
    from node_operations.host_firewall.apply import AppliedFirewall

# Outputs the provider fills in; they are not inputs to compare.
OUTPUT_KEYS = ("backend", "rule_count")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostFirewallInputs(NodeInputs):
    """The node's inbound rules (dicts of port, protocol, sources, purpose) and its role."""

    role: pulumi.Input[str]
    rules: pulumi.Input[list[dict[str, Any]]]
    nodeports_open: pulumi.Input[bool] = False
    block_metadata: pulumi.Input[bool] = False
    """Drop pods' traffic to the cloud's metadata service (a server the program created at Hetzner)."""
    cluster_networks: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)
    """The pod and Service networks, closed to non-nodes outside the cluster fabric. Absent in a
    state written before the setting existed."""
    node_addresses: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)
    """Every node's cluster address: who may send to the cluster networks from outside the fabric."""
    teardown_allowed: pulumi.Input[bool] = False
    """Read by delete: a teardown goes on without a host it cannot reach."""


def _rule_failures(rules: Any) -> list[CheckFailure]:
    """The rules' known protocols and sources judged; in a preview a rule, its protocol, its
    sources or one source may be unknown (a peer's address not decided yet): those pass."""
    failures: list[CheckFailure] = []
    if not isinstance(rules, list):
        return failures
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        protocol = rule.get("protocol")
        if is_known(protocol) and protocol not in ("tcp", "udp"):
            failures.append(CheckFailure(f"rules[{index}].protocol", f"{protocol!r} is not tcp or udp"))
        sources = rule.get("sources")
        for source in sources if isinstance(sources, list) else []:
            if not is_known(source):
                continue
            try:
                ipaddress.ip_network(source)
            except ValueError:
                failures.append(CheckFailure(f"rules[{index}].sources", f"{source!r} is not an IPv4 network"))
    return failures


def firewall_plan(props: Mapping[str, Any]) -> NodeFirewallPlan:
    """The operations' plan from the inputs `check` receives."""
    return _plan(
        str(props["node"]),
        props.get("role"),
        props.get("rules"),
        props.get("nodeports_open"),
        props.get("block_metadata"),
        cluster_networks=props.get("cluster_networks"),
        node_addresses=props.get("node_addresses"),
    )


def _typed_plan(inputs: HostFirewallInputs) -> NodeFirewallPlan:
    """The operations' plan from the resource's inputs."""
    return _plan(
        str(known(inputs.login.node)),
        known(inputs.role),
        known(inputs.rules),
        known(inputs.nodeports_open),
        known(inputs.block_metadata),
        cluster_networks=known(inputs.cluster_networks),
        node_addresses=known(inputs.node_addresses),
    )


def _plan(
    node: str,
    role: Any,
    rules_data: Any,
    nodeports_open: Any,
    block_metadata: Any = False,
    *,
    cluster_networks: Any = None,
    node_addresses: Any = None,
) -> NodeFirewallPlan:
    rules = tuple(
        PortRule(
            port=str(rule["port"]),
            protocol=rule["protocol"],
            sources=tuple(str(source) for source in rule.get("sources") or ()),
            purpose=str(rule.get("purpose") or ""),
        )
        for rule in rules_data or []
    )
    return NodeFirewallPlan(
        node=node,
        role="server" if role == "server" else "worker",
        rules=rules,
        nodeports_open=bool(nodeports_open),
        block_metadata=block_metadata is True,
        cluster_networks=tuple(str(network) for network in cluster_networks or ()),
        node_addresses=tuple(sorted({str(address) for address in node_addresses or ()})),
    )


def _rule_dicts(rules: tuple[PortRule, ...] | list[PortRule]) -> list[dict[str, Any]]:
    return [
        {"port": rule.port, "protocol": rule.protocol, "sources": list(rule.sources), "purpose": rule.purpose}
        for rule in rules
    ]


def _plan_failures(news: Mapping[str, Any]) -> list[CheckFailure]:
    if news.get("role") not in ("server", "worker") and is_known(news.get("role")):
        return [CheckFailure("role", f"{news.get('role')!r} is not server or worker")]
    names = HostFirewallInputs.names("node", "role", "rules", "nodeports_open", "cluster_networks", "node_addresses")
    if not all(is_known(news.get(key)) for key in names):
        return []
    try:
        plan = firewall_plan(news)
        return [CheckFailure("rules", problem) for problem in plan.problems()]
    except (KeyError, TypeError, ValueError) as error:
        return [CheckFailure("rules", f"unreadable rule: {error}")]


def _outputs(props: Mapping[str, Any], applied: AppliedFirewall) -> dict[str, Any]:
    return {**props, "backend": applied.backend, "rule_count": applied.rule_count}


class HostFirewallProvider(NodeProvider):
    """Dynamic provider of `HostFirewall`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        rule_failures = _rule_failures(news.get("rules"))
        failures = check_connection_inputs(news) + rule_failures
        if not rule_failures:
            failures += _plan_failures(news)
        return CheckResult(pin_recorded_host_key(olds, dict(news)), failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A changed peer set is one atomic update of the same firewall, never a replace
        # (a replace would open a window with no rules at all).
        return diff_inputs(
            olds,
            news,
            replace_on=HostFirewallInputs.names("node"),
            ignore=(*HostFirewallInputs.names("recorded_host_key"), *OUTPUT_KEYS),
        )

    def _apply(self, props: dict[str, Any]) -> AppliedFirewall:
        from node_operations.host_firewall.apply import apply_node_firewall  # noqa: PLC0415 - loaded on first use

        inputs = HostFirewallInputs.from_props(props)
        node = str(known(inputs.login.node))
        return run_operation(
            apply_node_firewall(
                ssh_target(inputs.login), _typed_plan(inputs), progress=lambda line: progress(node, line)
            )
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        login = HostFirewallInputs.from_props(props).login
        progress(str(known(login.node)), f"setting up the host firewall on {known(login.address)}")
        applied = self._apply(props)
        # Deterministic id: a create retried after a crash adopts the same firewall.
        return CreateResult(id_=f"{props['node']}-firewall", outs=_outputs(props, applied))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from node_operations.host_firewall.apply import read_node_firewall  # noqa: PLC0415 - loaded on first use

        inputs = HostFirewallInputs.from_props(props)
        observed = run_operation(read_node_firewall(ssh_target(inputs.login), _typed_plan(inputs)))
        if not observed.present:
            progress(str(known(inputs.login.node)), "refresh: none of the program's firewall rules are on the host")
        # What differs besides port rules shows as rules of its own, so the next
        # `pulumi up` sees a change and applies the plan again.
        notes = [{"port": "", "protocol": "", "sources": [], "purpose": note} for note in observed.notes]
        outs = {
            **props,
            "rules": _rule_dicts(observed.rules) + notes,
            "backend": observed.backend,
            "rule_count": observed.rule_count,
        }
        return ReadResult(id_=id_, outs=outs)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        progress(str(news["node"]), "updating the host firewall")
        return UpdateResult(outs=_outputs(news, self._apply(news)))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        from node_operations.host_firewall.apply import remove_node_firewall  # noqa: PLC0415 - loaded on first use

        inputs = HostFirewallInputs.from_props(props)
        node = str(known(inputs.login.node))
        progress(node, "removing the program's host firewall rules")
        try:
            removed = run_operation(
                remove_node_firewall(ssh_target(inputs.login), progress=lambda line: progress(node, line))
            )
        except RemoteCommandError:
            raise
        except SshError as error:
            if known(inputs.teardown_allowed) is not True:
                raise
            # A teardown goes on without a host it cannot reach; a person finishes that one.
            progress(node, f"could not be reached ({error}); remove the program's host firewall on it by hand")
            return
        progress(node, f"host firewall removed ({', '.join(removed.backends) or 'nothing was left'})")


class HostFirewall(Resource, module="hk3s", name="HostFirewall"):
    """The rules a node's host firewall enforces."""

    rule_count: pulumi.Output[int]
    backend: pulumi.Output[str]

    def __init__(
        self, resource_name: str, inputs: HostFirewallInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(
            HostFirewallProvider(), resource_name, resource_inputs(inputs, ["rule_count", "backend"]), opts
        )
