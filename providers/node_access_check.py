"""NodeAccessCheck: once per run that adds or removes workers, before any join, the
program logs in to every node of the stack already registered in the cluster.

One resource for the whole stack (run from the server's provider process), so a
run of K joins into an N-node cluster opens N connections for this, not K×N.
It runs when the stack's set of nodes changes, which is when joins (or a
removal) follow and the recorded nodes' firewalls change; the joins depend on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from node_operations.node_access import NodeAccessError, RecordedNode, check_cluster_nodes
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    other_node,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, ResourceInputs, is_known, known, nested


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecordedHost(ResourceInputs):
    """A node the stack records: where to log in to it and whether the program runs its firewall."""

    node: pulumi.Input[str]
    address: pulumi.Input[str]
    ssh_port: pulumi.Input[int] = 22
    host_key: pulumi.Input[str | None] = None
    firewall_managed: pulumi.Input[bool] = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeAccessCheckInputs(NodeInputs):
    """The server (`login`) and the recorded nodes to log in to."""

    server_firewall_managed: pulumi.Input[bool] = True
    nodes: list[RecordedHost] = dataclasses.field(metadata=nested(RecordedHost))


class NodeAccessCheckError(RuntimeError):
    """A recorded node cannot be reached or cannot take the joining workers' rules."""


def _membership(props: dict[str, Any]) -> list[tuple[str, str, int]]:
    return sorted(
        (str(node["node"]), str(node["address"]), int(node.get("ssh_port") or 22)) for node in props.get("nodes") or []
    )


def _run_check(props: dict[str, Any]) -> dict[str, Any]:
    inputs = NodeAccessCheckInputs.from_props({"nodes": [], **props})
    server = str(known(inputs.login.node))
    nodes = [
        RecordedNode(
            other_node(inputs.login, node.node, node.address, node.ssh_port, node.host_key),
            firewall_managed=known(node.firewall_managed) is not False,
        )
        for node in inputs.nodes
    ]
    try:
        checked = run_operation(
            check_cluster_nodes(
                ssh_target(inputs.login),
                nodes,
                server_firewall_managed=known(inputs.server_firewall_managed) is not False,
                progress=lambda line: progress(server, line),
            )
        )
    except NodeAccessError as error:
        raise NodeAccessCheckError(f"{server}: the joins of this run stopped at {error.check}: {error}") from None
    return {**props, "checked": sorted(checked)}


class NodeAccessCheckProvider(NodeProvider):
    """Dynamic provider of `NodeAccessCheck`; `node` is the server it reads the cluster from."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, check_connection_inputs(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Runs again only when the stack's nodes change (a worker added, removed or moved):
        # that is when the recorded nodes' firewalls change and their access matters.
        nodes = news.get("nodes")
        membership_known = isinstance(nodes, list) and all(
            isinstance(node, dict) and is_known([node.get("node"), node.get("address"), node.get("ssh_port")])
            for node in nodes
        )
        if not membership_known:
            return DiffResult(changes=True, replaces=[], delete_before_replace=False)
        changed = _membership(olds) != _membership(news) or olds.get("address") != news.get("address")
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=f"{props['node']}-node-access", outs=_run_check(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=_run_check(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A check leaves nothing behind on any host.
        return None


class NodeAccessCheck(Resource, module="hk3s", name="NodeAccessCheck"):
    """The recorded nodes, each logged in to once before this run's joins."""

    checked: pulumi.Output[list[str]]

    def __init__(
        self, resource_name: str, inputs: NodeAccessCheckInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(NodeAccessCheckProvider(), resource_name, resource_inputs(inputs, ["checked"]), opts)
