"""TeardownGuard: `pulumi destroy` is refused before anything changes unless the
stack allowed its teardown (hk3s:cluster.teardown: allowed, applied by an `up`).

A destroy runs no program, so the decision must already be in the state, the way a
cloud's deletion protection must be lifted by an update first. The guard depends on
every other resource of the stack (components.program): in a destroy the engine
deletes dependents before what they depend on, so the guard is the only resource
with nothing left depending on it and its delete runs first and alone. Its refusal
stops the destroy before any host, firewall, Hetzner or Kubernetes object is touched.

A stack that installs Longhorn is torn down only through the forward to the Kubernetes API
(remote_access.api_forward), which the program opens: `pulumi destroy --run-program` (or
scripts/stack.sh destroy, the API, the CLI). A plain `pulumi destroy` runs no program, so
nothing serves the port the Kubernetes provider's recorded kubeconfig names, and the provider
refuses to delete a Helm release on an unreachable cluster (pulumi-kubernetes provider.go,
Delete: "can't delete Helm Release with unreachable cluster") after the hosts' own deletes may
have begun. The guard therefore also refuses, before anything changes, when nothing serves
that port.

A stack on Hetzner is deleted at Hetzner with the token each resource recorded at its last `up`
(the program's own resources: the project's SSH key, the servers' firewall release). A token
rotated or revoked since then would fail those deletes after the hosts were wiped; so the guard
asks Hetzner's API (one GET) whether the recorded token is still taken, and refuses otherwise,
before anything changes, saying to record the current token with an `up` first.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from node_operations.refusal import tagged
from providers.base import program_error
from providers.inputs import ResourceInputs, known
from remote_access.hetzner_api import DEFAULT_ENDPOINT, HetznerAccess, token_refusal


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeardownGuardInputs(ResourceInputs):
    """Whether the stack's teardown is allowed, and the stack's name for the refusal."""

    teardown_allowed: pulumi.Input[bool] = False
    stack: pulumi.Input[str] = "this stack"
    api_forward_port: pulumi.Input[int] = 0
    """The local port of the stack's forward to the Kubernetes API when it installs Longhorn
    (the Kubernetes provider's kubeconfig names it); 0 when it uses no Kubernetes provider."""
    hcloud_token: pulumi.Input[str] | None = None
    """A secret: the Hetzner API token the stack's resources hold (hcloud:token or HCLOUD_TOKEN);
    None for a stack with nothing at Hetzner."""
    hcloud_endpoint: pulumi.Input[str] | None = None


@program_error
class TeardownRefusedError(RuntimeError):
    """A destroy of a stack whose teardown was not allowed."""


def refusal(stack: str) -> str:
    return tagged(
        f"stack {stack}: pulumi destroy is refused: hk3s:cluster.teardown is not 'allowed'. Nothing was changed. "
        "A teardown wipes k3s and every volume's data from every host and deletes the stack's Hetzner servers, "
        "network and firewalls, moving no copy. To tear the stack down: 1. set hk3s:cluster.teardown: allowed "
        "and run pulumi up (it changes nothing on any host, and lifts protect_control_plane); "
        "2. run pulumi destroy --run-program",
        "teardown",
    )


def no_forward(stack: str, port: int) -> str:
    return tagged(
        f"stack {stack}: pulumi destroy is refused: nothing serves 127.0.0.1:{port}, the forward to the "
        "Kubernetes API that Longhorn's Helm release is deleted through. Nothing was changed. A plain pulumi "
        "destroy runs no program, and the program opens the forward: run pulumi destroy --run-program "
        f"--stack {stack} (or scripts/stack.sh destroy --stack {stack}, or scripts/hk3s --stack {stack} "
        f"destroy --confirm {stack})",
        "teardown",
    )


def stale_token(stack: str, endpoint: str, answer: str) -> str:
    return tagged(
        f"stack {stack}: pulumi destroy is refused: the Hetzner API at {endpoint} does not take the token the "
        f"stack's resources recorded at its last up ({answer}); it was rotated or revoked. Nothing was changed. "
        "The destroy deletes the stack's SSH key and firewalls at Hetzner with that token, after the hosts are "
        "wiped. 1. give the stack the current token: pulumi config set --secret hcloud:token <token> (or export "
        f"HCLOUD_TOKEN); 2. run pulumi up --yes --stack {stack} (it records the token and changes nothing else); "
        "3. run the destroy again",
        "teardown",
    )


def serving(port: int) -> bool:
    """Whether something accepts a TCP connection on 127.0.0.1:`port`."""
    with socket.socket() as probe:
        probe.settimeout(5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class TeardownGuardProvider(ResourceProvider):
    """Dynamic provider of `TeardownGuard`; it touches no host."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="teardown-guard", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = any(
            olds.get(key) != news.get(key)
            for key in TeardownGuardInputs.names(
                "teardown_allowed", "stack", "api_forward_port", "hcloud_token", "hcloud_endpoint"
            )
        )
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=news)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        inputs = TeardownGuardInputs.from_props(props)
        if known(inputs.teardown_allowed) is not True:
            raise TeardownRefusedError(refusal(str(known(inputs.stack) or "this stack")))
        stack = str(known(inputs.stack) or "this stack")
        port = int(known(inputs.api_forward_port) or 0)
        if port and not serving(port):
            raise TeardownRefusedError(no_forward(stack, port))
        token = known(inputs.hcloud_token)
        if token:
            access = HetznerAccess(token, known(inputs.hcloud_endpoint) or DEFAULT_ENDPOINT)
            answer = token_refusal(access)
            if answer is not None:
                raise TeardownRefusedError(stale_token(stack, access.endpoint, answer))


class TeardownGuard(Resource, module="hk3s", name="TeardownGuard"):
    """Whether `pulumi destroy` may tear the stack down; refuses it otherwise, first."""

    teardown_allowed: pulumi.Output[bool]

    def __init__(
        self, resource_name: str, inputs: TeardownGuardInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = inputs.props()
        if props.get("hcloud_token") is not None:
            props["hcloud_token"] = pulumi.Output.secret(props["hcloud_token"])
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["hcloud_token"]))
        super().__init__(TeardownGuardProvider(), resource_name, props, opts)
