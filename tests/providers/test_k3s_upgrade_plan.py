"""K3sUpgrade's diff: an update only when the release changes (a worker added waits for the next
upgrade), and the preview's line saying the order and what each worker goes through.
NodeJoin's update of a release change alone records the upgrade's result with no rejoin."""

from __future__ import annotations

from typing import Any

import pytest
from pulumi.output import Unknown

from node_operations.health import FENCE_ANNOTATION
from node_operations.k3s_upgrade import release_step
from providers import node_join
from providers.k3s_upgrade import K3sUpgradeProvider
from providers.node_join import NodeJoinProvider
from remote_access.kube import NodeStatus

WORKERS = [{"node": name, "address": f"198.51.100.{i}"} for i, name in enumerate(("w1", "w2", "w3"), start=10)]
OLDS = {
    "node": "srv",
    "address": "198.51.100.2",
    "private_key": "k",
    "k3s_version": "v1.36.1+k3s1",
    "target_version": "v1.36.1+k3s1",
    "workers": WORKERS[:2],
    "drain_on_minor_upgrade": True,
    "version": "v1.36.1+k3s1",
}


@pytest.mark.parametrize(
    ("old", "new", "step"),
    [
        ("v1.36.1+k3s1", "v1.36.1+k3s1", "none"),
        ("v1.36.1+k3s1", "v1.36.2+k3s1", "patch"),
        ("v1.36.1+k3s1", "v1.36.1+k3s2", "patch"),
        ("v1.36.1+k3s1", "v1.37.0+k3s1", "minor"),
        ("", "v1.37.0+k3s1", "minor"),
    ],
)
def test_release_step(old: str, new: str, step: str) -> None:
    assert release_step(old, new) == step


def test_a_worker_added_alone_is_no_upgrade(capsys: pytest.CaptureFixture[str]) -> None:
    result = K3sUpgradeProvider().diff("u", dict(OLDS), {**OLDS, "workers": WORKERS})
    assert result.changes is False and "plan:" not in capsys.readouterr().err


def test_a_minor_release_shows_the_order_and_the_drain(capsys: pytest.CaptureFixture[str]) -> None:
    news = {**OLDS, "k3s_version": "v1.37.0+k3s1", "target_version": "v1.37.0+k3s1", "workers": WORKERS}
    assert K3sUpgradeProvider().diff("u", dict(OLDS), news).changes is True
    err = capsys.readouterr().err
    assert "[srv] plan: k3s v1.36.1+k3s1 -> v1.37.0+k3s1: the server first, then one worker at a time" in err
    assert "w1, w2, w3; each cordoned and drained first (a minor release" in err


def test_fenced_workers_are_left_out_of_the_order_and_listed(capsys: pytest.CaptureFixture[str]) -> None:
    news = {**OLDS, "k3s_version": "v1.36.2+k3s1", "target_version": "v1.36.2+k3s1", "workers": WORKERS}
    assert K3sUpgradeProvider().diff("u", dict(OLDS), {**news, "fenced": ["w2"]}).changes is True
    err = capsys.readouterr().err
    assert "each Ready at v1.36.2+k3s1 before the next: w1, w3; each in place" in err, err
    assert err.rstrip().endswith("Fenced, left alone at their release: w2"), err


def test_a_minor_release_without_the_drain_and_a_patch_move_in_place(capsys: pytest.CaptureFixture[str]) -> None:
    provider = K3sUpgradeProvider()
    minor = {**OLDS, "k3s_version": "v1.37.0+k3s1", "drain_on_minor_upgrade": False}
    assert provider.diff("u", dict(OLDS), minor).changes is True
    assert "each in place, pods running (a minor release)" in capsys.readouterr().err
    assert provider.diff("u", dict(OLDS), {**OLDS, "k3s_version": "v1.36.2+k3s1"}).changes is True
    assert "each in place, pods running (a patch release)" in capsys.readouterr().err


def test_at_preview_the_configured_release_decides(capsys: pytest.CaptureFixture[str]) -> None:
    # The server updates for another reason: its version output is unknown at preview.
    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    provider = K3sUpgradeProvider()
    assert provider.diff("u", dict(OLDS), {**OLDS, "k3s_version": unknown}).changes is False
    moving = {**OLDS, "k3s_version": unknown, "target_version": "v1.36.2+k3s1"}
    assert provider.diff("u", dict(OLDS), moving).changes is True
    assert "plan: k3s v1.36.1+k3s1 -> v1.36.2+k3s1" in capsys.readouterr().err


JOINED = {
    "node": "w1",
    "address": "198.51.100.10",
    "private_key": "k",
    "server_node": "srv",
    "server_address": "198.51.100.2",
    "k3s_version": "v1.36.1+k3s1",
    "server_url": "https://198.51.100.2:6443",
    "ca_hash": "ab" * 32,
    "network_mode": "public",
    "node_ip": "198.51.100.10",
    "node_external_ip": "198.51.100.10",
    "validation_taint": "hk3s.dev/validating=true:NoSchedule",
    "pod_network": "vxlan",
    "labels": {"tier": "web"},
    "state": "ready",
    "machine_id": "a" * 32,
}
INPUTS = {key: value for key, value in JOINED.items() if key not in ("state", "machine_id")}


def _fake_cluster(
    monkeypatch: pytest.MonkeyPatch, kubelet: str, annotations: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    joined: list[dict[str, Any]] = []

    async def read_node(_server: Any, node: str, _wait: float) -> NodeStatus:
        return NodeStatus(name=node, ready=True, kubelet_version=kubelet, annotations=annotations or {})

    def join(_self: NodeJoinProvider, props: dict[str, Any], **_olds: Any) -> dict[str, Any]:
        joined.append(props)
        return props

    monkeypatch.setattr(node_join, "read_node", read_node)
    monkeypatch.setattr(NodeJoinProvider, "_join", join)
    return joined


def test_a_release_change_alone_records_the_upgrade_without_a_rejoin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    joined = _fake_cluster(monkeypatch, "v1.36.2+k3s1")
    result = NodeJoinProvider().update("w1-join", dict(JOINED), {**INPUTS, "k3s_version": "v1.36.2+k3s1"})
    assert joined == [] and result.outs is not None
    assert result.outs["k3s_version_in_use"] == "v1.36.2+k3s1" and result.outs["machine_id"] == "a" * 32
    assert "[w1] runs v1.36.2+k3s1 (upgraded in place, no rejoin)" in capsys.readouterr().err


def test_a_worker_not_at_the_release_is_an_error_not_a_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    joined = _fake_cluster(monkeypatch, "v1.36.1+k3s1")
    with pytest.raises(node_join.SshError, match=r"w1: runs v1\.36\.1\+k3s1, not the release v1\.36\.2\+k3s1"):
        NodeJoinProvider().update("w1-join", dict(JOINED), {**INPUTS, "k3s_version": "v1.36.2+k3s1"})
    assert joined == []


def test_a_release_change_with_another_change_rejoins(monkeypatch: pytest.MonkeyPatch) -> None:
    joined = _fake_cluster(monkeypatch, "v1.36.2+k3s1")
    news = {**INPUTS, "k3s_version": "v1.36.2+k3s1", "registry": "registry.example:5000"}
    NodeJoinProvider().update("w1-join", dict(JOINED), news)
    assert [props["registry"] for props in joined] == ["registry.example:5000"]


def test_a_rotated_login_key_is_stored_and_moves_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    provider = K3sUpgradeProvider()
    news = {**OLDS, "private_key": "new-key"}
    assert provider.diff("u", dict(OLDS), news).changes is True
    result = provider.update("u", dict(OLDS), news)
    assert result.outs is not None and result.outs["private_key"] == "new-key"
    assert "plan:" not in capsys.readouterr().err


def test_a_fenced_worker_keeps_its_release_through_an_upgrade(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The upgrade left it alone (its fence recorded on its Node): its join records the release it runs.
    joined = _fake_cluster(monkeypatch, "v1.36.1+k3s1", {FENCE_ANNOTATION: "2026-12-03T20:00:00Z"})
    result = NodeJoinProvider().update("w1-join", dict(JOINED), {**INPUTS, "k3s_version": "v1.36.2+k3s1"})
    assert joined == [] and result.outs is not None
    assert result.outs["k3s_version_in_use"] == "v1.36.1+k3s1" and result.outs["state"] == "not-ready"
    assert "[w1] fenced: left at v1.36.1+k3s1 by the upgrade to v1.36.2+k3s1" in capsys.readouterr().err
    # The release it last ran stays in the state: each run's diff still shows the move pending.
    assert result.outs["k3s_version"] == JOINED["k3s_version"] != "v1.36.2+k3s1"


def test_a_worker_left_behind_while_fenced_is_moved_once_unfenced(capsys: pytest.CaptureFixture[str]) -> None:
    provider = K3sUpgradeProvider()
    olds = {**OLDS, "workers": WORKERS, "left_behind": ["w2"]}
    # Still fenced: nothing to do, nothing said.
    assert provider.diff("u", dict(olds), {**olds, "fenced": ["w2"]}).changes is False
    assert "plan:" not in capsys.readouterr().err
    # Out of hk3s:fences: every run updates (and says so) until the upgrade has moved it.
    assert provider.diff("u", dict(olds), {**olds, "fenced": []}).changes is True
    err = capsys.readouterr().err
    assert "[srv] plan: w2 left at an older release while fenced, unfenced now: moved to k3s v1.36.1+k3s1" in err
    # Removed from the stack: nothing left to move.
    assert provider.diff("u", dict(olds), {**olds, "workers": WORKERS[:1]}).changes is False
    # At preview a worker's address may be unknown, the list with it: the stored list stands in.
    unknown = {**olds, "workers": Unknown(), "fenced": Unknown()}
    assert provider.diff("u", {**olds, "fenced": []}, unknown).changes is True
    assert provider.diff("u", {**olds, "fenced": ["w2"]}, unknown).changes is False
    assert provider.diff("u", dict(OLDS), {**OLDS, "workers": Unknown()}).changes is False
