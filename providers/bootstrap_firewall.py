"""BootstrapFirewallRelease: a Hetzner server leaves the SSH-only cloud firewall it was created
with, once the node's full cloud firewall is applied to it.

The rule: a new server is on the internet from its first boot, and only a server's
`firewall_ids` attach a firewall before that boot (terraform-provider-hcloud, docs of
`hcloud_firewall_attachment`), so every server is created with the SSH-only firewall; the
cluster's full firewall needs every node's address and is attached later. Hetzner lets in what
any attached firewall allows, so the SSH-only firewall left attached would keep SSH open to every
source whatever the plan (node_operations.firewall_plan) says. The server's `firewall_ids` are
ignored after creation (a change would take the full firewall off again), and the SSH-only
firewall cannot be handed to an `hcloud_firewall_attachment` (one per firewall, and it must list
a server), so this resource takes the server off it through the Hetzner API, and only after the
full firewall is on (it depends on the full firewall's attachment, and checks Hetzner's own
record): a server is never without a cloud firewall.

Create and update take the server off (nothing to do when it is off already); a new server id
replaces the resource, so a replaced server is taken off too. Delete does nothing: the server
goes, or the cluster's firewalls go with `hk3s:firewall.cloud_firewall: false`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from providers.base import program_error, progress, run_operation
from providers.inputs import ResourceInputs, is_known, known
from remote_access.hetzner_api import DEFAULT_ENDPOINT, HetznerAccess, HetznerApiError, release_bootstrap_firewall

program_error(HetznerApiError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BootstrapFirewallReleaseInputs(ResourceInputs):
    """The server, the SSH-only firewall it leaves and the full one it must be in first."""

    node: pulumi.Input[str]
    server_id: pulumi.Input[str]
    bootstrap_firewall_id: pulumi.Input[str]
    full_firewall_id: pulumi.Input[str]
    hcloud_token: pulumi.Input[str] | None = None
    """A secret: hcloud:token (or HCLOUD_TOKEN), as the Hetzner Pulumi provider reads it."""
    hcloud_endpoint: pulumi.Input[str] | None = None


@program_error
class NoHetznerTokenError(RuntimeError):
    """The Hetzner API cannot be called: no token."""


class BootstrapFirewallReleaseProvider(ResourceProvider):
    """Dynamic provider of `BootstrapFirewallRelease`; it calls the Hetzner API only."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = [
            CheckFailure(key, f"{news.get('node')}: {key} must be a Hetzner id (digits), not {news.get(key)!r}")
            for key in ("server_id", "bootstrap_firewall_id", "full_firewall_id")
            if is_known(news.get(key)) and news.get(key) is not None and not str(news.get(key)).isdigit()
        ]
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = BootstrapFirewallReleaseInputs.names("server_id", "bootstrap_firewall_id", "full_firewall_id")
        changed = [key for key in keys if olds.get(key) != news.get(key)]
        # Another server is another release; other firewalls are the same server's, taken off again.
        replaces = [key for key in changed if key == "server_id"]
        secrets_changed = any(olds.get(k) != news.get(k) for k in ("hcloud_token", "hcloud_endpoint", "node"))
        return DiffResult(changes=bool(changed) or secrets_changed, replaces=replaces, delete_before_replace=False)

    def _release(self, props: dict[str, Any]) -> dict[str, Any]:
        inputs = BootstrapFirewallReleaseInputs.from_props(props)
        node = str(known(inputs.node))
        token = known(inputs.hcloud_token)
        if not token:
            raise NoHetznerTokenError(
                f"{node}: taking the server off its SSH-only cloud firewall needs the Hetzner API, but there is no "
                "token; set it: pulumi config set --secret hcloud:token <token> (or HCLOUD_TOKEN)"
            )
        access = HetznerAccess(str(token), str(known(inputs.hcloud_endpoint) or DEFAULT_ENDPOINT))
        released = run_operation(
            release_bootstrap_firewall(
                access,
                node,
                server_id=int(str(known(inputs.server_id))),
                bootstrap_id=int(str(known(inputs.bootstrap_firewall_id))),
                full_id=int(str(known(inputs.full_firewall_id))),
                progress=lambda line: progress(node, line),
            )
        )
        return {**props, "released": released}

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._release(props)
        return CreateResult(id_=f"{outs['server_id']}-{outs['bootstrap_firewall_id']}", outs=outs)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._release(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class BootstrapFirewallRelease(Resource, module="hk3s", name="BootstrapFirewallRelease"):
    """A Hetzner server taken off its SSH-only cloud firewall once its full one is on."""

    released: pulumi.Output[bool]

    def __init__(
        self, resource_name: str, inputs: BootstrapFirewallReleaseInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = {**inputs.props(), "released": None}
        props["hcloud_token"] = pulumi.Output.secret(props["hcloud_token"])
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["hcloud_token"]))
        super().__init__(BootstrapFirewallReleaseProvider(), resource_name, props, opts)
