"""NodeFence: fences a dead worker. Kubernetes cannot tell a dead host from one that
lost its network and may still be writing, so nothing moves until the operator says
the worker is down and the program has proved it.

The fence is recorded before anything is touched; only then is the node tainted
out of service, which is the one way pods are force-deleted in this product.
Inputs are validated now; the procedure is a later capability.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, UpdateResult

from providers.base import CapabilityMissingError, NodeProvider, check_connection_inputs, resource_inputs
from providers.inputs import NodeInputs

FENCE_CAPABILITY = "fencing a worker"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeFenceInputs(NodeInputs):
    """What the operator says about the worker, and how to reach its machine and the cluster."""

    powered_off: pulumi.Input[bool] = False
    accept_stale_data: pulumi.Input[bool] = False
    hcloud_server_id: pulumi.Input[str] | None = None
    kubeconfig: pulumi.Input[str]
    """A secret."""


class NodeFenceProvider(NodeProvider):
    """Dynamic provider of `NodeFence`."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        for flag in NodeFenceInputs.names("powered_off", "accept_stale_data"):
            if flag in news and not isinstance(news[flag], bool) and news[flag] is not None:
                failures.append(CheckFailure(flag, f"{flag} must be true or false"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        raise CapabilityMissingError(props["node"], "fencing the worker", FENCE_CAPABILITY)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        raise CapabilityMissingError(news["node"], "changing the fence", FENCE_CAPABILITY)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        raise CapabilityMissingError(
            props["node"], "lifting the fence (the worker rejoins through the join)", FENCE_CAPABILITY
        )


class NodeFence(Resource, module="hk3s", name="NodeFence"):
    """A recorded fence of one worker."""

    recorded_at: pulumi.Output[str]
    stopped_services: pulumi.Output[list[str]]

    def __init__(self, resource_name: str, inputs: NodeFenceInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        props = resource_inputs(inputs, ["recorded_at", "stopped_services"], secrets=["kubeconfig"])
        super().__init__(NodeFenceProvider(), resource_name, props, opts)
