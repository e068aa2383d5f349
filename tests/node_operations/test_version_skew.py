"""Kubernetes' version-skew policy for a worker fenced across upgrades: its kubelet may be at most
three minor releases older than the API server. The lift of a fence refuses a worker beyond it
before anything changes (naming the fix), and the plan of an upgrade that takes the server beyond
it says so. Pure logic over versions and a Node read: the API is a stand-in object here, since
the lab builds only the next minor release of k3s, not four (the lift itself runs against real
hosts in tests/lab/test_fence.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from node_operations.fence_lift import skew_refusal
from node_operations.k3s_release import beyond_skew, minors_behind
from providers.k3s_upgrade import K3sUpgradeProvider
from remote_access.kube import NodeStatus


@pytest.mark.parametrize(
    ("kubelet", "server", "behind"),
    [
        ("v1.33.4+k3s1", "v1.36.1+k3s1", 3),
        ("v1.32.9+k3s1", "v1.36.1+k3s1", 4),
        ("v1.37.0+k3s1", "v1.36.1+k3s1", -1),
        ("v1.36.1", "v1.36.1+k3s1", None),
    ],
)
def test_minors_behind(kubelet: str, server: str, behind: int | None) -> None:
    assert minors_behind(kubelet, server) == behind


def test_three_minors_behind_is_within_the_policy_four_is_not() -> None:
    assert beyond_skew("v1.33.4+k3s1", "v1.36.1+k3s1") is None
    why = beyond_skew("v1.32.9+k3s1", "v1.36.1+k3s1")
    assert why is not None and "4 minor releases older than the server's v1.36.1+k3s1" in why
    assert "at most 3 minor releases older than its API server" in why


class Nodes:
    """The API's answer to get_node (a stand-in: see the module docstring)."""

    def __init__(self, versions: dict[str, str]) -> None:
        self.versions = versions

    async def get_node(self, name: str) -> NodeStatus | None:
        version = self.versions.get(name)
        return None if version is None else NodeStatus(name=name, kubelet_version=version)


def _refusal(versions: dict[str, str]) -> str | None:
    cluster: Any = Nodes(versions)
    return asyncio.run(skew_refusal(cluster, "w1", "srv"))


def test_the_lift_refuses_a_worker_beyond_the_skew_naming_the_fix() -> None:
    assert _refusal({"w1": "v1.33.0+k3s1", "srv": "v1.36.1+k3s1"}) is None
    refused = _refusal({"w1": "v1.32.0+k3s1", "srv": "v1.36.1+k3s1"})
    assert refused is not None and "its k3s v1.32.0+k3s1 is 4 minor releases older" in refused
    assert "hk3s node remove w1 --force" in refused and "its join installs v1.36.1+k3s1" in refused
    assert _refusal({"srv": "v1.36.1+k3s1"}) is None  # its Node is gone: nothing to lift


OLDS = {
    "node": "srv",
    "address": "198.51.100.2",
    "private_key": "k",
    "k3s_version": "v1.35.2+k3s1",
    "target_version": "v1.35.2+k3s1",
    "workers": [{"node": "w1", "address": "198.51.100.10"}, {"node": "w2", "address": "198.51.100.11"}],
    "drain_on_minor_upgrade": True,
    "version": "v1.35.2+k3s1",
    "left_behind": ["w2"],
    "behind_releases": {"w2": "v1.33.1+k3s1"},
}


def test_an_upgrade_beyond_a_fenced_workers_skew_says_so_in_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    provider = K3sUpgradeProvider()
    within = {**OLDS, "k3s_version": "v1.36.0+k3s1", "target_version": "v1.36.0+k3s1", "fenced": ["w2"]}
    assert provider.diff("u", dict(OLDS), within).changes is True
    assert "version-skew" not in capsys.readouterr().err  # w2 at v1.33: three behind v1.36
    beyond = {**OLDS, "k3s_version": "v1.37.0+k3s1", "target_version": "v1.37.0+k3s1", "fenced": ["w2"]}
    assert provider.diff("u", dict(OLDS), beyond).changes is True
    err = " ".join(capsys.readouterr().err.split())
    assert "Beyond the version-skew policy after this upgrade, fenced: w2: k3s v1.33.1+k3s1 is 4 minor" in err, err
    assert "hk3s node remove NAME --force" in err
    # A fenced worker never left behind runs the release before this upgrade.
    fenced_w1 = {**beyond, "fenced": ["w1"], "k3s_version": "v1.39.0+k3s1", "target_version": "v1.39.0+k3s1"}
    provider.diff("u", dict(OLDS), fenced_w1)
    assert "w1: k3s v1.35.2+k3s1 is 4 minor releases older" in " ".join(capsys.readouterr().err.split())
