"""HostFirewall: the node's own firewall (UFW, firewalld or nftables), built
from node_operations.firewall_plan so it agrees with the cloud firewall.

`check` validates the rule set now; applying it is issue #5's capability.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from providers.base import (
    CapabilityMissingError,
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    pin_recorded_host_key,
)

FIREWALL_CAPABILITY = (
    "managing host firewalls (issue #5: network mode and firewalls); set hk3s:firewall.managed: false "
    "to run the node's firewall yourself"
)


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


class HostFirewallProvider(NodeProvider):
    """Dynamic provider of `HostFirewall`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news) + _rule_failures(news.get("rules"))
        return CheckResult(pin_recorded_host_key(olds, dict(news)), failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A changed peer set is one atomic update of the same firewall, never a replace
        # (a replace would open a window with no rules at all).
        return diff_inputs(olds, news, replace_on=("node",), ignore=("recorded_host_key",))

    def create(self, props: dict[str, Any]) -> CreateResult:
        raise CapabilityMissingError(props["node"], "setting up the host firewall", FIREWALL_CAPABILITY)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        raise CapabilityMissingError(news["node"], "updating the host firewall's peer rules", FIREWALL_CAPABILITY)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        raise CapabilityMissingError(props["node"], "removing the host firewall", FIREWALL_CAPABILITY)


class HostFirewall(Resource, module="hk3s", name="HostFirewall"):
    """The rules a node's host firewall enforces."""

    rule_count: pulumi.Output[int]
    backend: pulumi.Output[str]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = {
            **props,
            "private_key": pulumi.Output.secret(props["private_key"]),
            "rule_count": None,
            "backend": None,
        }
        super().__init__(HostFirewallProvider(), resource_name, inputs, opts)
