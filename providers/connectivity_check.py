"""ConnectivityCheck: a TCP connection from one node to another's port over the
network the cluster's mode uses (server -> worker SSH, worker -> server 6443).

Inputs are validated now; running the checks is issue #5's capability.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from providers.base import CapabilityMissingError, NodeProvider, check_connection_inputs, diff_inputs, resource_inputs

CHECK_CAPABILITY = "connection checks between nodes (issue #5: network mode and firewalls)"


class ConnectivityCheckProvider(NodeProvider):
    """Dynamic provider of `ConnectivityCheck`; the connection runs from `node`."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        port = news.get("target_port")
        if isinstance(port, (int, float)) and not 0 < int(port) < 65536:
            failures.append(CheckFailure("target_port", f"{port} is not a TCP port"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A check is a fact about a path; a different path is a different check.
        return diff_inputs(
            olds,
            news,
            replace_on=("node", "address", "target_node", "target_address", "target_port"),
            ignore=("recorded_host_key",),
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        raise CapabilityMissingError(
            props["node"],
            f"checking the connection to {props.get('target_node')} at "
            f"{props.get('target_address')}:{props.get('target_port')}",
            CHECK_CAPABILITY,
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        raise CapabilityMissingError(news["node"], "re-checking a connection", CHECK_CAPABILITY)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A check leaves nothing behind on any host.
        return None


class ConnectivityCheck(Resource, module="hk3s", name="ConnectivityCheck"):
    """A verified connection from one node to another's port."""

    verified_at: pulumi.Output[str]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = resource_inputs(props, ["verified_at"])
        super().__init__(ConnectivityCheckProvider(), resource_name, inputs, opts)
