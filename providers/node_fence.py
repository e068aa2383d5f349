"""NodeFence: fences a dead worker. Kubernetes cannot tell a dead host from one that
lost its network and may still be writing, so nothing moves until the operator says
the worker is down (hk3s:fences.<worker>) and the program has proved it.

Create runs the fence (node_operations.fence: down for a minute, recorded on the Node
before anything is touched, the host stopped or confirmed off, the Node tainted out of
service) and resumes a fence an earlier run left unfinished: the record on the Node says
so, and every step is idempotent. Update only stores changed inputs: a fence done stays
done; only accept_stale_data turned on acts, starting the workloads the fence keeps stopped for
copies that may be older (node_operations.fence_workloads). Delete (the entry removed from
hk3s:fences) lifts the fence: the worker rejoins under the validation taint and passes the join's
checks (node_operations.fence_lift), at the address the fence last stored; in a teardown the worker
is wiped instead, so nothing is lifted.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, UpdateResult

from providers.base import (
    CapabilityMissingError,
    NodeProvider,
    check_connection_inputs,
    other_node,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, checkable, is_known, known
from remote_access.hetzner_api import DEFAULT_ENDPOINT, HetznerAccess
from remote_access.kube import API_WAIT_SECONDS
from remote_access.ssh import SshTarget

if TYPE_CHECKING:
    from node_operations.fence import FenceOrder
    from node_operations.join_validation import ValidatedNode

FENCE_CAPABILITY = "fencing a worker"
OUTPUTS = ("recorded_at", "stopped_by", "pods_deleted", "stopped_services")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeFenceInputs(NodeInputs):
    """What the operator says about the worker, how to reach its machine, and the server whose
    API the fence goes through (with the worker's login key)."""

    powered_off: pulumi.Input[bool] = False
    accept_stale_data: pulumi.Input[bool] = False
    hcloud_server: pulumi.Input[str] | None = None
    """The worker's Hetzner server, its id or name (the id of a server the program created; an
    existing host's hcloud_server): the fence powers it off through the Hetzner API."""
    hcloud_token: pulumi.Input[str] | None = None
    """A secret: hcloud:token, for the Hetzner API."""
    hcloud_endpoint: pulumi.Input[str] | None = None
    """hcloud:endpoint (None: Hetzner's own)."""
    hcloud_network: pulumi.Input[str] | None = None
    """The id of this cluster's Hetzner network, when the program created one: a private address
    proves the server is the worker only in it."""
    hcloud_labels: pulumi.Input[dict[str, str]] | None = None
    """The owner and node labels the program gave the worker's server, when it created it."""
    kubeconfig: pulumi.Input[str]
    """A secret."""
    server_node: pulumi.Input[str]
    server_address: pulumi.Input[str]
    server_ssh_port: pulumi.Input[int] | None = None
    server_host_key: pulumi.Input[str | None] = None
    kubelet_address: pulumi.Input[str]
    """Where the other nodes reach the worker's kubelet (its cluster address): the server dials
    it there to check that a worker reported powered off is."""
    api_wait_seconds: pulumi.Input[float] = API_WAIT_SECONDS
    network_mode: pulumi.Input[str] = ""
    """The cluster's network mode (the plan's): in public mode a lift refuses an address that changed."""
    # What the join's checks need when the fence is lifted (the worker rejoins).
    server_url: pulumi.Input[str] = ""
    registry: pulumi.Input[str] | None = None
    validation_taint: pulumi.Input[str] = ""
    validation_image: pulumi.Input[str] = ""
    teardown_allowed: pulumi.Input[bool] = False
    """Read by delete: a teardown wipes the worker, so its fence is not lifted."""
    node_external_ip: pulumi.Input[str] = ""
    """The address the worker's join publishes as its external IP (hk3s:workers): a lift that
    finds the agent configured with another says the join's pending change needs one more `up`."""
    stack: pulumi.Input[str] = ""
    """The stack's name: a scale-up of a workload the fence holds is refused naming
    `scripts/hk3s --stack <stack> workload start` (node_operations.fence_holds)."""

    def validated_node(self) -> ValidatedNode:
        from node_operations.join_validation import ValidatedNode  # noqa: PLC0415 - loaded on first use

        registry = known(self.registry) if self.registry is not None else None
        return ValidatedNode(
            node=str(known(self.login.node)),
            server_url=str(known(self.server_url)),
            registry=registry or None,
            validation_taint=str(known(self.validation_taint)),
            validation_image=str(known(self.validation_image)),
            kubelet_address=str(known(self.kubelet_address)),
        )

    def fence_order(self) -> FenceOrder:
        from node_operations.fence import FenceOrder  # noqa: PLC0415 - loaded on first use

        hcloud_server = known(self.hcloud_server)
        token = known(self.hcloud_token)
        network = known(self.hcloud_network)
        return FenceOrder(
            powered_off=bool(known(self.powered_off)),
            kubelet_address=str(known(self.kubelet_address)),
            hcloud_server=str(hcloud_server) if hcloud_server else None,
            hcloud=HetznerAccess(str(token), str(known(self.hcloud_endpoint) or DEFAULT_ENDPOINT)) if token else None,
            hcloud_network=int(network) if network else None,
            hcloud_labels={str(k): str(v) for k, v in (known(self.hcloud_labels) or {}).items()},
            accept_stale_data=bool(known(self.accept_stale_data)),
            stack=str(known(self.stack) or ""),
        )

    def server(self) -> SshTarget:
        return other_node(self.login, self.server_node, self.server_address, self.server_ssh_port, self.server_host_key)


def _fence(props: dict[str, Any]) -> dict[str, Any]:
    from node_operations.fence import fence_worker  # noqa: PLC0415 - loaded on first use

    inputs = NodeFenceInputs.from_props(props)
    node = str(known(inputs.login.node))
    report = run_operation(
        fence_worker(
            inputs.server(),
            ssh_target(inputs.login),
            inputs.fence_order(),
            api_wait=float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS),
            progress=functools.partial(progress, node),
        )
    )
    for line in report.lines():
        progress(node, line)
    return {
        **props,
        "recorded_at": report.recorded_at,
        "stopped_by": report.stopped_by,
        "pods_deleted": report.pods_deleted,
        # Workloads the fence keeps stopped, each with why (node_operations.fence_workloads).
        "stopped_services": [report.workloads.stopped[owner] for owner in sorted(report.workloads.stopped)],
    }


def _start_with_consent(news: dict[str, Any]) -> list[str]:
    """accept_stale_data turned on for a fence that keeps workloads stopped: start the ones whose
    copies elsewhere may be older; the workloads still stopped after it."""
    from node_operations.fence_workloads import start_with_consent  # noqa: PLC0415 - loaded on first use

    inputs = NodeFenceInputs.from_props(news)
    node = str(known(inputs.login.node))
    report = run_operation(
        start_with_consent(
            inputs.server(),
            node,
            api_wait=float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS),
            progress=functools.partial(progress, node),
        )
    )
    for line in report.lines():
        progress(node, line)
    return [report.stopped[owner] for owner in sorted(report.stopped)]


class NodeFenceProvider(NodeProvider):
    """Dynamic provider of `NodeFence`."""

    # The fence belongs to the worker's Node, not to an address: a worker whose address changed
    # while fenced keeps its fence, which stores the new address (its lift logs in there). A
    # replacement would lift the fence at the old address and fence the worker again.
    replace_on = NodeFenceInputs.names("node")

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        for flag in NodeFenceInputs.names("powered_off", "accept_stale_data"):
            value = checkable(news, flag)
            if value is not None and not isinstance(value, bool):
                failures.append(
                    CheckFailure(flag, f"hk3s:fences.{news.get('node')}.{flag} is {value!r}; set it to true or false")
                )
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        # Deterministic id: the fence of one worker, whichever run made (or resumed) it.
        return CreateResult(id_=f"{props['node']}-fence", outs=_fence(props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # The fence is done (create finished it); a changed flag or server changes nothing on it,
        # except the consent to stale copies while it keeps workloads stopped: they start now.
        outs = {**news, **{name: olds.get(name) for name in OUTPUTS}}
        if is_known(news.get("address")) and olds.get("address") != news.get("address"):
            progress(
                str(news["node"]),
                f"fenced: its address is now {news['address']} (was {olds.get('address')}); lifting the fence "
                "logs in there",
            )
        if news.get("accept_stale_data") and not olds.get("accept_stale_data") and olds.get("stopped_services"):
            outs["stopped_services"] = _start_with_consent(news)
        return UpdateResult(outs=outs)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        from node_operations.fence_lift import lift_fence  # noqa: PLC0415 - loaded on first use

        inputs = NodeFenceInputs.from_props(props)
        node = str(known(inputs.login.node))
        if known(inputs.teardown_allowed):
            return None  # the teardown wipes the worker (its join's delete): nothing to rejoin
        if not known(inputs.server_url) or not known(inputs.validation_taint):
            # A fence recorded by a release that could not lift it keeps no rejoin settings.
            raise CapabilityMissingError(
                node,
                "lifting a fence recorded by an earlier release (put hk3s:fences back, run up once, then remove it)",
                FENCE_CAPABILITY,
            )
        run_operation(
            lift_fence(
                inputs.server(),
                ssh_target(inputs.login),
                inputs.validated_node(),
                api_wait=float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS),
                progress=functools.partial(progress, node),
                network_mode=str(known(inputs.network_mode) or ""),
                accept_stale_data=bool(known(inputs.accept_stale_data)),
                external_ip=str(known(inputs.node_external_ip) or ""),
            )
        )
        return None


class NodeFence(Resource, module="hk3s", name="NodeFence"):
    """A recorded fence of one worker."""

    recorded_at: pulumi.Output[str]
    stopped_by: pulumi.Output[str]
    pods_deleted: pulumi.Output[list[str]]
    stopped_services: pulumi.Output[list[str]]

    def __init__(self, resource_name: str, inputs: NodeFenceInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        props = resource_inputs(inputs, list(OUTPUTS), secrets=["kubeconfig", "hcloud_token"])
        super().__init__(NodeFenceProvider(), resource_name, props, opts)
