"""K3sServer: installs or adopts k3s on the server host.

`check` already guards what must never change on a running cluster (its pod
and service networks, a k3s downgrade); the install itself is the join
capability's server half and is not in this release yet.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, UpdateResult

from cluster_settings.models import K3S_VERSION
from providers.base import CapabilityMissingError, NodeProvider, check_connection_inputs, pin_recorded_host_key

INSTALL_CAPABILITY = "installing k3s on the server (issue #4: join a worker)"
IMMUTABLE_CLUSTER_INPUTS = {
    "pod_cidr": "hk3s:cluster.pod_cidr",
    "service_cidr": "hk3s:cluster.service_cidr",
}


def _version_tuple(version: str) -> tuple[int, ...]:
    match = K3S_VERSION.match(version)
    return tuple(int(part) for part in match.groups()) if match else ()


class K3sServerProvider(NodeProvider):
    """Dynamic provider of `K3sServer`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        for key, setting in IMMUTABLE_CLUSTER_INPUTS.items():
            if olds.get(key) and news.get(key) and olds[key] != news[key]:
                failures.append(
                    CheckFailure(
                        key,
                        f"{setting} was {olds[key]} when the cluster was created and cannot change to "
                        f"{news[key]} on a running cluster; set it back",
                    )
                )
        old_version, new_version = olds.get("k3s_version"), news.get("k3s_version")
        if (
            isinstance(old_version, str)
            and isinstance(new_version, str)
            and _version_tuple(new_version) < _version_tuple(old_version)
        ):
            failures.append(
                CheckFailure(
                    "k3s_version",
                    f"hk3s:cluster.k3s_version {new_version} is older than the running {old_version}; "
                    "k3s cannot be downgraded in place",
                )
            )
        return CheckResult(pin_recorded_host_key(olds, dict(news)), failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        raise CapabilityMissingError(props["node"], "installing k3s", INSTALL_CAPABILITY)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        raise CapabilityMissingError(news["node"], "reconfiguring or upgrading k3s", INSTALL_CAPABILITY)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        raise CapabilityMissingError(props["node"], "uninstalling k3s", INSTALL_CAPABILITY)


class K3sServer(Resource, module="hk3s", name="K3sServer"):
    """k3s on the server: version, CA hash, kubeconfig (secret), API endpoint."""

    version: pulumi.Output[str]
    ca_hash: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    api_endpoint: pulumi.Output[str]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = {
            **props,
            "private_key": pulumi.Output.secret(props["private_key"]),
            "version": None,
            "ca_hash": None,
            "kubeconfig": None,
            "api_endpoint": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"]))
        super().__init__(K3sServerProvider(), resource_name, inputs, opts)
