"""ConnectivityCheck: a TCP connection from one node to another's port over the
network the cluster's mode uses (server -> worker SSH, worker -> server 6443).

Run before a worker joins a private-mode cluster: when a private route exists
but a connection over it fails, the join stops naming the connection. In
public mode the check records that it was not needed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from node_operations.network_mode import check_connection
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    program_error,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, known
from remote_access.ssh import open_session


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConnectivityCheckInputs(NodeInputs):
    """A connection from `login.node` to `target_node`'s `target_address:target_port`."""

    target_node: pulumi.Input[str]
    target_address: pulumi.Input[str]
    target_port: pulumi.Input[int]
    network_mode: pulumi.Input[str]


@program_error
class ConnectionFailedError(RuntimeError):
    """A connection the private network must carry did not open."""


async def _connect(inputs: ConnectivityCheckInputs, address: str, port: int) -> str | None:
    async with open_session(ssh_target(inputs.login)) as session:
        return await check_connection(session, address, port)


def _run_check(props: dict[str, Any]) -> dict[str, Any]:
    inputs = ConnectivityCheckInputs.from_props(props)
    node, target = str(known(inputs.login.node)), str(known(inputs.target_node))
    address, port = str(known(inputs.target_address)), int(known(inputs.target_port))
    mode = known(inputs.network_mode)
    if mode != "private":
        return {**props, "verified": f"not needed in {mode} mode"}
    why = run_operation(_connect(inputs, address, port))
    if why is not None:
        raise ConnectionFailedError(
            f"{node}: the connection from {node} to {target} at {address}:{port} over the private network "
            f"failed ({why}). Open port {port}/tcp on {target} for {node}'s private address, or set "
            "hk3s:network.mode: public to join over public addresses. Nothing was joined"
        )
    progress(node, f"connected to {target} at {address}:{port} over the private network")
    return {**props, "verified": f"{node} -> {address}:{port}"}


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
            replace_on=ConnectivityCheckInputs.names(
                "node", "address", "target_node", "target_address", "target_port", "network_mode"
            ),
            ignore=ConnectivityCheckInputs.names("recorded_host_key"),
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(
            id_=f"{props['node']}->{props['target_node']}:{int(props['target_port'])}", outs=_run_check(props)
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=_run_check(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A check leaves nothing behind on any host.
        return None


class ConnectivityCheck(Resource, module="hk3s", name="ConnectivityCheck"):
    """A verified connection from one node to another's port."""

    verified: pulumi.Output[str]

    def __init__(
        self, resource_name: str, inputs: ConnectivityCheckInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(ConnectivityCheckProvider(), resource_name, resource_inputs(inputs, ["verified"]), opts)
