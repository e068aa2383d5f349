"""NodeJoin: preflight, prepare, join under a taint, validate, release.

Inputs are checked now; the join itself is issue #4's capability. Removing a
joined worker is refused until the remove capability exists, so a worker
dropped from the config is never silently orphaned.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, UpdateResult

from cluster_settings.models import K3S_VERSION
from providers.base import CapabilityMissingError, NodeProvider, check_connection_inputs, pin_recorded_host_key

JOIN_CAPABILITY = "joining workers (issue #4: join a worker)"
REMOVE_CAPABILITY = (
    "removing a worker (drain, move copies, wipe, deregister); put the worker back in hk3s:workers to keep it"
)
NETWORK_MODES = ("auto", "private", "public")


class NodeJoinProvider(NodeProvider):
    """Dynamic provider of `NodeJoin`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        version = news.get("k3s_version")
        if isinstance(version, str) and not K3S_VERSION.match(version):
            failures.append(CheckFailure("k3s_version", f"{version!r} is not a k3s release"))
        mode = news.get("network_mode")
        if isinstance(mode, str) and mode not in NETWORK_MODES:
            failures.append(CheckFailure("network_mode", f"{mode!r} is not one of {', '.join(NETWORK_MODES)}"))
        old_mode = olds.get("network_mode_in_use")
        if isinstance(old_mode, str) and isinstance(mode, str) and mode not in ("auto", old_mode):
            failures.append(
                CheckFailure(
                    "network_mode",
                    f"the cluster runs in {old_mode} mode, fixed by its first join; hk3s:network.mode "
                    f"cannot change to {mode}. Set it back to {old_mode} or auto",
                )
            )
        return CheckResult(pin_recorded_host_key(olds, dict(news)), failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        raise CapabilityMissingError(props["node"], "joining the worker", JOIN_CAPABILITY)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        raise CapabilityMissingError(news["node"], "rejoining the worker", JOIN_CAPABILITY)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        raise CapabilityMissingError(props["node"], "removing the worker", REMOVE_CAPABILITY)


class NodeJoin(Resource, module="hk3s", name="NodeJoin"):
    """A worker joined to the cluster, checked and released."""

    name: pulumi.Output[str]
    addresses: pulumi.Output[list[str]]
    network_mode_in_use: pulumi.Output[str]
    k3s_version_in_use: pulumi.Output[str]
    state: pulumi.Output[str]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = {
            **props,
            "private_key": pulumi.Output.secret(props["private_key"]),
            "name": None,
            "addresses": None,
            "network_mode_in_use": None,
            "k3s_version_in_use": None,
            "state": None,
        }
        super().__init__(NodeJoinProvider(), resource_name, inputs, opts)
