"""TeardownGuard: `pulumi destroy` is refused before anything changes unless the
stack allowed its teardown (hk3s:cluster.teardown: allowed, applied by an `up`).

A destroy runs no program, so the decision must already be in the state, the way a
cloud's deletion protection must be lifted by an update first. The guard depends on
every other resource of the stack (components.program): in a destroy the engine
deletes dependents before what they depend on, so the guard is the only resource
with nothing left depending on it and its delete runs first and alone. Its refusal
stops the destroy before any host, firewall, Hetzner or Kubernetes object is touched.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from node_operations.refusal import tagged
from providers.base import program_error
from providers.inputs import ResourceInputs, known


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeardownGuardInputs(ResourceInputs):
    """Whether the stack's teardown is allowed, and the stack's name for the refusal."""

    teardown_allowed: pulumi.Input[bool] = False
    stack: pulumi.Input[str] = "this stack"


@program_error
class TeardownRefusedError(RuntimeError):
    """A destroy of a stack whose teardown was not allowed."""


def refusal(stack: str) -> str:
    return tagged(
        f"stack {stack}: pulumi destroy is refused: hk3s:cluster.teardown is not 'allowed'. Nothing was changed. "
        "A teardown wipes k3s and every volume's data from every host and deletes the stack's Hetzner servers, "
        "network and firewalls, moving no copy. To tear the stack down: 1. set hk3s:cluster.teardown: allowed "
        "and run pulumi up (it changes nothing on any host, and lifts protect_control_plane); 2. run pulumi destroy",
        "teardown",
    )


class TeardownGuardProvider(ResourceProvider):
    """Dynamic provider of `TeardownGuard`; it touches no host."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="teardown-guard", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = any(olds.get(key) != news.get(key) for key in TeardownGuardInputs.names("teardown_allowed", "stack"))
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=news)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        inputs = TeardownGuardInputs.from_props(props)
        if known(inputs.teardown_allowed) is not True:
            raise TeardownRefusedError(refusal(str(known(inputs.stack) or "this stack")))


class TeardownGuard(Resource, module="hk3s", name="TeardownGuard"):
    """Whether `pulumi destroy` may tear the stack down; refuses it otherwise, first."""

    teardown_allowed: pulumi.Output[bool]

    def __init__(
        self, resource_name: str, inputs: TeardownGuardInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(TeardownGuardProvider(), resource_name, inputs.props(), opts)
