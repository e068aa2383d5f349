"""A fenced worker's join changes nothing on its host: NodeJoin's diff turns the replacement a new
address would be into an update, and the update leaves the join as it last ran, naming what waits.
The server's answer (the Node and its fence record) is faked here; tests/lab/
test_fence_address_private.py and test_fence_address_public.py ask a real one through the engine."""

from __future__ import annotations

from typing import Any

import pytest

from node_operations.health import FENCE_ANNOTATION
from node_operations.join import WorkerFencedError
from providers import node_join
from providers.node_join import NodeJoinProvider, pending_changes
from remote_access.kube import NodeStatus
from remote_access.ssh import SshError

JOINED = {
    "node": "w1",
    "address": "198.51.100.7",
    "private_key": "old-key",
    "server_node": "srv",
    "server_address": "198.51.100.2",
    "server_url": "https://10.0.1.2:6443",
    "ca_hash": "b" * 64,
    "network_mode": "private",
    "node_ip": "10.0.1.7",
    "validation_taint": "hk3s.dev/validating=true:NoSchedule",
    "pod_network": "vxlan",
    "k3s_version": "v1.36.1+k3s1",
    "node_external_ip": "198.51.100.7",
    "labels": {"tier": "web"},
    "state": "ready",
    "machine_id": "a" * 32,
    "join_run": "2026-12-04T09:00:00+00:00",
}
INPUTS = {key: value for key, value in JOINED.items() if key not in ("state", "machine_id", "join_run")}
MOVED = {**INPUTS, "address": "198.51.100.77", "node_external_ip": "198.51.100.77"}


def _server_says(monkeypatch: pytest.MonkeyPatch, annotations: dict[str, str] | None) -> list[str]:
    """The server's answer about the Node (None: no Node); a join stops at its preflight as the
    real one does on a fenced Node (tests/lab: the real preflight), and any other join fails the test."""
    asked: list[str] = []

    async def read_node(server: Any, node: str, _wait: float) -> NodeStatus | None:
        asked.append(f"{server.address} {node}")
        return None if annotations is None else NodeStatus(name=node, ready=False, annotations=annotations)

    def join(_self: NodeJoinProvider, props: dict[str, Any], **_olds: Any) -> dict[str, Any]:
        if annotations and FENCE_ANNOTATION in annotations:
            raise WorkerFencedError(str(props["node"]), annotations[FENCE_ANNOTATION])
        raise AssertionError("joined")

    monkeypatch.setattr(node_join, "read_node", read_node)
    monkeypatch.setattr(NodeJoinProvider, "_join", join)
    return asked


def test_a_fenced_workers_new_address_is_an_update_that_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _server_says(monkeypatch, {FENCE_ANNOTATION: "2026-12-04T09:10:00Z"})
    diff = NodeJoinProvider().diff("w1-join", dict(JOINED), dict(MOVED))
    assert diff.changes is True and not diff.replaces and not diff.delete_before_replace
    result = NodeJoinProvider().update("w1-join", dict(JOINED), {**MOVED, "private_key": "new-key"})
    assert result.outs is not None
    # The join as it last ran: the next run's diff still finds the new address.
    assert {key: result.outs[key] for key in JOINED if key != "private_key"} == {
        key: value for key, value in JOINED.items() if key != "private_key"
    }
    assert result.outs["private_key"] == "new-key"  # state only: stored either way
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[w1] fenced")]
    assert lines == [
        "[w1] fenced (recorded 2026-12-04T09:10:00Z): its join changes nothing on the host while it is fenced; "
        "pending until the first up after the fence is lifted: address 198.51.100.7 -> 198.51.100.77, "
        "node_external_ip 198.51.100.7 -> 198.51.100.77"
    ], err
    # One read for the engine's diff, one per update (its diffs share it).
    assert asked == ["198.51.100.2 w1", "198.51.100.2 w1"]


def test_an_unfenced_workers_new_address_still_replaces_its_join(monkeypatch: pytest.MonkeyPatch) -> None:
    _server_says(monkeypatch, {"other": "annotation"})
    diff = NodeJoinProvider().diff("w1-join", dict(JOINED), dict(MOVED))
    assert diff.replaces == ["address"] and diff.delete_before_replace
    _server_says(monkeypatch, None)  # no Node: nothing fenced either
    assert NodeJoinProvider().diff("w1-join", dict(JOINED), dict(MOVED)).replaces == ["address"]


def test_a_fenced_worker_with_another_change_is_left_alone_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _server_says(monkeypatch, {FENCE_ANNOTATION: "2026-12-04T09:10:00Z"})
    news = {**INPUTS, "node_ip": "10.0.1.9"}
    result = NodeJoinProvider().update("w1-join", {**JOINED, "node_ip": "10.0.1.3"}, news)
    assert result.outs is not None and result.outs["node_ip"] == "10.0.1.3"
    assert "pending until the first up after the fence is lifted: node_ip 10.0.1.3 -> 10.0.1.9" in (
        capsys.readouterr().err
    )


def test_pending_changes_leave_out_what_never_rejoins() -> None:
    olds = {**JOINED, "recorded_nodes": ["srv", "w1"], "labels": {"a": "1"}}
    news = {**INPUTS, "private_key": "new", "recorded_nodes": ["srv", "w1", "w2"], "labels": {"a": "2"}}
    assert pending_changes(olds, news) == ["labels"]


def test_a_fenced_worker_that_does_not_answer_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Powered off for good: the join cannot log in to it; the server says it is fenced.
    _server_says(monkeypatch, {FENCE_ANNOTATION: "2026-12-04T09:10:00Z"})

    def unreachable(_self: NodeJoinProvider, props: dict[str, Any], **_olds: Any) -> dict[str, Any]:
        raise SshError(str(props["node"]), "connection refused")

    monkeypatch.setattr(NodeJoinProvider, "_join", unreachable)
    news = {**INPUTS, "registry": "registry.example:5000"}
    result = NodeJoinProvider().update("w1-join", dict(JOINED), news)
    assert result.outs is not None and "registry" not in result.outs
    assert "pending until the first up after the fence is lifted: registry None -> registry.example:5000" in (
        capsys.readouterr().err
    )
    # Not fenced: the failure stands.
    _server_says(monkeypatch, {})
    monkeypatch.setattr(NodeJoinProvider, "_join", unreachable)
    with pytest.raises(SshError, match="w1: connection refused"):
        NodeJoinProvider().update("w1-join", dict(JOINED), news)
