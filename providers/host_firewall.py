"""HostFirewall: the node's own firewall (UFW, firewalld or nftables), built
from node_operations.firewall_plan so it agrees with the cloud firewall.

`create` and `update` apply the node's rules in one atomic change (adopting
what an interrupted run left); `read` reads the rules in force back, so
`pulumi refresh` shows drift; `delete` takes away only the program's own
table, rules or zones. Outputs: `backend` and `rule_count` (rules in the
program's table, tagged UFW rules, or entries of its firewalld zones).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from node_operations.firewall_plan import PortRule
from node_operations.host_firewall.apply import (
    AppliedFirewall,
    apply_node_firewall,
    read_node_firewall,
    remove_node_firewall,
)
from node_operations.host_firewall.plan import NodeFirewallPlan
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    is_known,
    pin_recorded_host_key,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
    teardown_allowed,
)
from remote_access.ssh import RemoteCommandError, SshError

# Outputs the provider fills in; they are not inputs to compare.
OUTPUT_KEYS = ("backend", "rule_count")


def _rule_failures(rules: Any) -> list[CheckFailure]:
    failures: list[CheckFailure] = []
    if not isinstance(rules, list):
        return failures
    for index, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        if rule.get("protocol") not in ("tcp", "udp"):
            failures.append(CheckFailure(f"rules[{index}].protocol", f"{rule.get('protocol')!r} is not tcp or udp"))
        for source in rule.get("sources") or []:
            try:
                ipaddress.ip_network(source)
            except ValueError:
                failures.append(CheckFailure(f"rules[{index}].sources", f"{source!r} is not an IPv4 network"))
    return failures


def firewall_plan(props: Mapping[str, Any]) -> NodeFirewallPlan:
    """The operations' plan from the resource's inputs."""
    rules = tuple(
        PortRule(
            port=str(rule["port"]),
            protocol=rule["protocol"],
            sources=tuple(str(source) for source in rule.get("sources") or ()),
            purpose=str(rule.get("purpose") or ""),
        )
        for rule in props.get("rules") or []
    )
    return NodeFirewallPlan(
        node=str(props["node"]),
        role="server" if props.get("role") == "server" else "worker",
        rules=rules,
        nodeports_open=bool(props.get("nodeports_open")),
    )


def _rule_dicts(rules: tuple[PortRule, ...] | list[PortRule]) -> list[dict[str, Any]]:
    return [
        {"port": rule.port, "protocol": rule.protocol, "sources": list(rule.sources), "purpose": rule.purpose}
        for rule in rules
    ]


def _plan_failures(news: Mapping[str, Any]) -> list[CheckFailure]:
    if news.get("role") not in ("server", "worker") and is_known(news.get("role")):
        return [CheckFailure("role", f"{news.get('role')!r} is not server or worker")]
    if not all(is_known(news.get(key)) for key in ("node", "role", "rules", "nodeports_open")):
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
        return diff_inputs(olds, news, replace_on=("node",), ignore=("recorded_host_key", *OUTPUT_KEYS))

    def _apply(self, props: dict[str, Any]) -> AppliedFirewall:
        node = str(props["node"])
        return run_operation(
            apply_node_firewall(ssh_target(props), firewall_plan(props), progress=lambda line: progress(node, line))
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        progress(props["node"], f"setting up the host firewall on {props['address']}")
        applied = self._apply(props)
        # Deterministic id: a create retried after a crash adopts the same firewall.
        return CreateResult(id_=f"{props['node']}-firewall", outs=_outputs(props, applied))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        plan = firewall_plan(props)
        observed = run_operation(read_node_firewall(ssh_target(props), plan))
        if not observed.present:
            progress(props["node"], "refresh: none of the program's firewall rules are on the host")
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
        progress(news["node"], "updating the host firewall")
        return UpdateResult(outs=_outputs(news, self._apply(news)))

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        node = str(props["node"])
        progress(node, "removing the program's host firewall rules")
        try:
            removed = run_operation(remove_node_firewall(ssh_target(props), progress=lambda line: progress(node, line)))
        except RemoteCommandError:
            raise
        except SshError as error:
            if not teardown_allowed(props):
                raise
            # A teardown goes on without a host it cannot reach; a person finishes that one.
            progress(node, f"could not be reached ({error}); remove the program's host firewall on it by hand")
            return
        progress(node, f"host firewall removed ({', '.join(removed.backends) or 'nothing was left'})")


class HostFirewall(Resource, module="hk3s", name="HostFirewall"):
    """The rules a node's host firewall enforces."""

    rule_count: pulumi.Output[int]
    backend: pulumi.Output[str]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = resource_inputs(props, ["rule_count", "backend"])
        super().__init__(HostFirewallProvider(), resource_name, inputs, opts)
