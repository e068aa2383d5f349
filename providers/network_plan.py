"""NetworkPlan: the cluster's network mode and every node's cluster address.

One per cluster, decided from the probes' addresses and routing tables
(`node_operations.network_mode`). Its outputs are the record: once a decision
had a worker in it, the mode is fixed, and a worker's private path is kept so it
rejoins without the setting that first allowed it. Paths that need proof before
use (a network that carries the default route, reused recorded addresses) are
checked by connecting over them in both directions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from node_operations.network_mode import (
    HostNetwork,
    NetworkDecision,
    NetworkRefusedError,
    NetworkSetting,
    PrivatePath,
    Recorded,
    behind_nat_refusal,
    candidate_refusal,
    check_connection,
    decide,
    local_node_ips,
)
from providers.base import progress, run_operation, ssh_target
from providers.inputs import NodeLogin, ResourceInputs, is_known, known, nested
from remote_access.ssh import SshTarget, open_session

NETWORK_MODES = ("auto", "private", "public")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanHost(ResourceInputs):
    """One node as the network decision sees it: where to log in, its addresses and routes."""

    node: pulumi.Input[str]
    ssh_address: pulumi.Input[str]
    ssh_port: pulumi.Input[int] = 22
    host_key: pulumi.Input[str | None] = None
    public_address: pulumi.Input[str]
    private_address: pulumi.Input[str | None] = None
    ipv4_addresses: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)
    ipv4_routes: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetworkPlanInputs(ResourceInputs):
    """The network settings, the login every check uses, and the server's and workers' hosts."""

    mode_setting: pulumi.Input[Literal["auto", "private", "public"]]
    private_network: pulumi.Input[str] | None = None
    pod_cidr: pulumi.Input[str]
    service_cidr: pulumi.Input[str]
    ssh_user: pulumi.Input[str] = "root"
    private_key: pulumi.Input[str]
    """A secret."""
    server: PlanHost = dataclasses.field(metadata=nested(PlanHost))
    workers: list[PlanHost] = dataclasses.field(metadata=nested(PlanHost))
    pod_network: pulumi.Input[str] | None = None
    """hk3s:cluster.pod_network; None in a state written before the plan knew it."""
    vxlan_over_public_addresses: pulumi.Input[bool] | None = None
    """hk3s:cluster.vxlan_over_public_addresses is `allowed`."""


def _network(host: PlanHost) -> HostNetwork:
    return HostNetwork.from_facts(
        str(known(host.node)),
        known(host.ipv4_addresses) or [],
        known(host.ipv4_routes) or [],
        known(host.private_address),
    )


def _target(inputs: NetworkPlanInputs, host: PlanHost) -> SshTarget:
    return ssh_target(
        NodeLogin(
            node=host.node,
            address=host.ssh_address,
            ssh_port=host.ssh_port,
            ssh_user=inputs.ssh_user,
            private_key=inputs.private_key,
            recorded_host_key=host.host_key,
        )
    )


async def _connect_from(inputs: NetworkPlanInputs, source: PlanHost, address: str, port: int) -> str | None:
    async with open_session(_target(inputs, source)) as session:
        return await check_connection(session, address, port)


def _worker(inputs: NetworkPlanInputs, node: str) -> PlanHost:
    return next(host for host in inputs.workers if known(host.node) == node)


async def _verify(inputs: NetworkPlanInputs, path: PrivatePath) -> str | None:
    """Connect both ways over the path's addresses (SSH ports: k3s may not run yet).
    None when both connect, else which connection failed and why."""
    server = inputs.server
    worker = _worker(inputs, path.worker)
    legs = (
        (server, path.worker_address, int(known(worker.ssh_port) or 22), known(worker.node)),
        (worker, path.server_address, int(known(server.ssh_port) or 22), known(server.node)),
    )
    for source, address, port, target_node in legs:
        why = await _connect_from(inputs, source, address, port)
        if why is not None:
            return f"the connection from {known(source.node)} to {target_node} at {address}:{port} failed ({why})"
    return None


def _recorded(olds: dict[str, Any] | None) -> Recorded:
    if not olds:
        return Recorded()
    paths = {name: PrivatePath.from_dict(data) for name, data in (olds.get("paths") or {}).items()}
    return Recorded(mode=olds.get("mode"), paths=paths)


def _decide(props: dict[str, Any], olds: dict[str, Any] | None) -> dict[str, Any]:
    inputs = NetworkPlanInputs.from_props(props)
    setting = NetworkSetting(
        mode=known(inputs.mode_setting),
        private_network=known(inputs.private_network) if inputs.private_network is not None else None,
        pod_cidr=str(known(inputs.pod_cidr)),
        service_cidr=str(known(inputs.service_cidr)),
    )
    server = _network(inputs.server)
    workers = [(_network(host), str(known(host.public_address))) for host in inputs.workers]
    recorded = _recorded(olds)
    server_name = str(known(inputs.server.node))

    def run(candidates_unusable: bool = False) -> NetworkDecision:
        return decide(
            setting,
            server,
            str(known(inputs.server.public_address)),
            workers,
            recorded,
            candidates_unusable=candidates_unusable,
        )

    try:
        decision = run()
        if decision.candidate is not None:
            failed = run_operation(_verify(inputs, decision.candidate))
            if failed is None:
                raise candidate_refusal(decision.candidate)
            progress(server_name, f"the default-route network {decision.candidate.network} is not usable: {failed}")
            decision = run(candidates_unusable=True)
        for worker_net, public in workers:
            if worker_net.node in decision.behind_nat:
                port = int(known(_worker(inputs, worker_net.node).ssh_port) or 22)
                why = run_operation(_connect_from(inputs, inputs.server, public, port))
                if why is not None:
                    raise behind_nat_refusal(worker_net, public, server_name, port, why)
        for path in decision.paths.values():
            if path.kind == "recorded" and path.worker not in recorded.paths:
                failed = run_operation(_verify(inputs, path))
                if failed is not None:
                    raise NetworkRefusedError(
                        f"{path.worker}: the recorded private addresses route, but {failed}. Open the port, or set "
                        "hk3s:network.mode: public to join over public addresses"
                    )
        # vxlan is unencrypted: over public addresses pod traffic would cross the internet in clear
        # into flannel.1, which every host firewall trusts. The settings refuse mode: public with it;
        # what auto decides is known only here.
        if (
            decision.mode == "public"
            and known(inputs.pod_network) == "vxlan"
            and not known(inputs.vxlan_over_public_addresses)
        ):
            why = (
                "hk3s:network.mode is public"
                if setting.mode == "public"
                else "the nodes share no private network (mode auto chose public)"
            )
            raise NetworkRefusedError(
                f"{why}, so pod traffic would travel between the nodes' public addresses, and "
                "hk3s:cluster.pod_network is vxlan, which is unencrypted; set pod_network: wireguard, or give "
                "the nodes a shared private network and set hk3s:network.mode: private"
            )
    except NetworkRefusedError as refused:
        raise NetworkRefusedError(f"{server_name}: network mode: {refused}") from None
    for note in decision.notes:
        progress(server_name, note)
    if decision.mode == "private":
        networks = sorted({path.network for path in decision.paths.values()})
        progress(server_name, f"network mode private over {', '.join(networks)}")
    else:
        progress(server_name, f"network mode {decision.mode}")
    hosts = {net.node: net for net in [server, *(net for net, _ in workers)]}
    node_ips = local_node_ips(decision.addresses, hosts)
    return {
        **props,
        "mode": decision.mode,
        "addresses": decision.addresses,
        "node_ips": node_ips,
        # Nodes others reach only at an address a NAT holds: flannel must use external addresses.
        "nat_nodes": sorted(node for node, ip in node_ips.items() if ip != decision.addresses[node]),
        "paths": {name: path.as_dict() for name, path in decision.paths.items()},
    }


class NetworkPlanProvider(pulumi.dynamic.ResourceProvider):
    """Dynamic provider of `NetworkPlan`."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = []
        mode = news.get("mode_setting")
        if is_known(mode) and mode not in NETWORK_MODES:
            failures.append(
                CheckFailure("mode_setting", f"hk3s:network.mode is {mode!r}; set one of {', '.join(NETWORK_MODES)}")
            )
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = NetworkPlanInputs.names(
            "mode_setting", "private_network", "pod_cidr", "service_cidr", "server", "workers"
        )
        changed = [key for key in keys if olds.get(key) != news.get(key)]
        # A new pod network is judged against the decided mode; a state written before the plan
        # knew the pod network is not re-decided for lacking it.
        changed += [
            key
            for key in NetworkPlanInputs.names("pod_network", "vxlan_over_public_addresses")
            if key in olds and olds.get(key) != news.get(key)
        ]
        return DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="network-plan", outs=_decide(props, None))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=_decide(news, olds))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A decision leaves nothing on any host.
        return None


class NetworkPlan(Resource, module="hk3s", name="NetworkPlan"):
    """The recorded network decision: mode, per-node cluster addresses, private paths."""

    mode: pulumi.Output[str]
    addresses: pulumi.Output[dict[str, str]]
    node_ips: pulumi.Output[dict[str, str]]
    nat_nodes: pulumi.Output[list[str]]
    paths: pulumi.Output[dict[str, dict[str, str]]]

    def __init__(
        self, resource_name: str, inputs: NetworkPlanInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = {
            **inputs.props(),
            "private_key": pulumi.Output.secret(inputs.private_key),
            "mode": None,
            "addresses": None,
            "node_ips": None,
            "nat_nodes": None,
            "paths": None,
        }
        super().__init__(NetworkPlanProvider(), resource_name, props, opts)
