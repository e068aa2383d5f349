"""A running cluster keeps its pod network: the server's provider refuses, at `check` (which the
engine calls at preview), a new flannel backend, even with the server's restart approved. Each k3s
agent reads the backend from the server only when it starts (pkg/agent/config/config.go get(),
FlannelBackend of the served configuration), so a switched server would leave every worker on the
old backend. The provider's own code, no host involved (the check reads only the settings)."""

from __future__ import annotations

import pytest

from providers.k3s_server import K3sServerProvider

RUNNING = {"node": "srv", "k3s_version": "v1.35.2+k3s1", "flannel_backend": "vxlan", "approve_restart": True}


def _failures(olds: dict[str, object], backend: object) -> list[str]:
    result = K3sServerProvider().check(dict(olds), {**olds, "flannel_backend": backend})
    return [f"{failure.property}: {failure.reason}" for failure in result.failures or []]


@pytest.mark.parametrize(
    ("old", "new", "old_name", "new_name"),
    [
        ("vxlan", "wireguard-native", "vxlan", "wireguard"),
        ("wireguard-native", "vxlan", "wireguard", "vxlan"),
    ],
)
def test_a_new_backend_on_a_running_cluster_is_refused_with_the_procedure(
    old: str, new: str, old_name: str, new_name: str
) -> None:
    (failure,) = _failures({**RUNNING, "flannel_backend": old}, new)
    assert failure.startswith("pod_network: hk3s:cluster.pod_network is ")
    assert f"is {old_name} on the running cluster and cannot change to {new_name}" in failure
    assert f"Set hk3s:cluster.pod_network back to {old_name}" in failure
    assert f"create a new stack with hk3s:cluster.pod_network: {new_name}" in failure


def test_the_same_backend_a_new_server_or_an_unknown_value_passes() -> None:
    assert _failures(RUNNING, "vxlan") == []
    # A server not made yet has no recorded backend: anything goes.
    assert _failures({"node": "srv", "k3s_version": "v1.35.2+k3s1"}, "wireguard-native") == []
    # At preview a value still being computed is judged at the up, once known.
    assert _failures(RUNNING, "04da6b54-80e4-46f7-96ec-b56ff0331ba9") == []
