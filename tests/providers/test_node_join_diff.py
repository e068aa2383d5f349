"""A worker's host rebuilt under its node's name (no agent, another machine-id) is drift:
refresh (NodeJoin's `read`) asks each joined worker's host and records it in the state, and
the next run's diff joins it again. A preview or up with nothing to change logs in to no
host. The host's and the API's answers are faked here (the lab tests
tests/lab/test_node_password.py and tests/lab/test_connection_budget.py ask real ones)."""

from __future__ import annotations

from typing import Any

import pytest

from providers import node_join
from providers.node_join import HOST_CHANGED, NodeJoinProvider
from remote_access.kube import NodeStatus
from tests.providers.joined_worker import JOINED_WORKER

JOINED = {**JOINED_WORKER, "private_key": "old-key"}
INPUTS = {key: value for key, value in JOINED.items() if key not in ("state", "machine_id")}
REBUILT = "the host at 198.51.100.7 is another machine than the one joined as w1"


def _host_says(monkeypatch: pytest.MonkeyPatch, answer: str | None) -> list[tuple[str, str, str]]:
    asked: list[tuple[str, str, str]] = []

    async def joined_host_changed(worker: Any, machine_id: str) -> str | None:
        asked.append((worker.address, worker.private_key, machine_id))
        return answer

    async def read_node(_server: Any, node: str, _wait: float) -> NodeStatus:
        return NodeStatus(name=node, ready=True, kubelet_version="v1.36.1+k3s1")

    monkeypatch.setattr(node_join, "joined_host_changed", joined_host_changed)
    monkeypatch.setattr(node_join, "read_node", read_node)
    return asked


def _recording(joined: list[dict[str, Any]]) -> Any:
    def join(_self: NodeJoinProvider, props: dict[str, Any], **_olds: Any) -> dict[str, Any]:
        joined.append(props)
        return props

    return join


def test_refresh_records_a_rebuilt_host_and_the_next_diff_joins_it_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = _host_says(monkeypatch, REBUILT)
    refreshed = NodeJoinProvider().read("w1-join", dict(JOINED)).outs
    assert asked == [("198.51.100.7", "old-key", "a" * 32)]
    assert refreshed is not None and refreshed[HOST_CHANGED] == REBUILT
    assert f"[w1] {REBUILT}: the next up joins it again" in capsys.readouterr().err

    result = NodeJoinProvider().diff("w1-join", dict(refreshed), dict(INPUTS))
    assert result.changes is True and not result.replaces
    assert f"[w1] {REBUILT}: this run joins it again" in capsys.readouterr().err
    # The diff read the state: it asked no host.
    assert len(asked) == 1


def test_a_diff_with_nothing_changed_asks_no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _host_says(monkeypatch, REBUILT)
    assert NodeJoinProvider().diff("w1-join", dict(JOINED), dict(INPUTS)).changes is False
    assert asked == []


def test_a_refresh_of_the_same_host_with_its_agent_drops_an_earlier_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # Repaired by hand between two refreshes: the record goes, and nothing rejoins.
    asked = _host_says(monkeypatch, None)
    refreshed = NodeJoinProvider().read("w1-join", {**JOINED, HOST_CHANGED: REBUILT}).outs
    assert refreshed is not None and HOST_CHANGED not in refreshed and len(asked) == 1
    assert NodeJoinProvider().diff("w1-join", dict(refreshed), dict(INPUTS)).changes is False


def test_the_rejoin_drops_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    joined: list[dict[str, Any]] = []
    monkeypatch.setattr(NodeJoinProvider, "_join", _recording(joined))
    asked = _host_says(monkeypatch, "never asked")
    result = NodeJoinProvider().update("w1-join", {**JOINED, HOST_CHANGED: REBUILT}, dict(INPUTS))
    assert len(joined) == 1 and result.outs is not None and HOST_CHANGED not in result.outs
    assert asked == []


def test_a_rotated_login_key_alone_is_stored_without_logging_in(monkeypatch: pytest.MonkeyPatch) -> None:
    joined: list[dict[str, Any]] = []
    monkeypatch.setattr(NodeJoinProvider, "_join", _recording(joined))
    asked = _host_says(monkeypatch, "never asked")
    result = NodeJoinProvider().update("w1-join", dict(JOINED), {**INPUTS, "private_key": "new-key"})
    assert result.outs is not None and result.outs["private_key"] == "new-key"
    assert joined == [] and asked == []


def test_a_rotated_login_key_on_a_refreshed_rebuilt_host_rejoins_with_the_new_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    joined: list[dict[str, Any]] = []
    monkeypatch.setattr(NodeJoinProvider, "_join", _recording(joined))
    _host_says(monkeypatch, "never asked")
    NodeJoinProvider().update("w1-join", {**JOINED, HOST_CHANGED: REBUILT}, {**INPUTS, "private_key": "new-key"})
    assert [props["private_key"] for props in joined] == ["new-key"]


def test_a_join_that_never_finished_is_not_asked_about(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _host_says(monkeypatch, "never asked")
    olds = {key: value for key, value in JOINED.items() if key != "state"}
    assert NodeJoinProvider().diff("w1-join", olds, dict(INPUTS)).changes is False
    refreshed = NodeJoinProvider().read("w1-join", olds).outs
    assert asked == [] and refreshed is not None and HOST_CHANGED not in refreshed


def test_a_joined_worker_whose_node_was_deleted_is_joined_again_after_a_refresh(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """k3s refuses the certificate of a deleted Node (401) and the agent's join token is spent:
    the refresh records the Node missing and the next diff joins the worker again (with a fresh
    token, tests/lab/test_node_password.py shows it against the stand-in)."""
    _host_says(monkeypatch, None)

    async def no_node(_server: Any, _node: str, _wait: float) -> None:
        return None

    monkeypatch.setattr(node_join, "read_node", no_node)
    refreshed = NodeJoinProvider().read("w1-join", dict(JOINED)).outs
    assert refreshed is not None and refreshed["state"] == "missing"
    assert "[w1] its Node is gone from the cluster" in capsys.readouterr().err
    result = NodeJoinProvider().diff("w1-join", dict(refreshed), dict(INPUTS))
    assert result.changes is True and not result.replaces
    assert "k3s refuses the certificate of a deleted Node" in capsys.readouterr().err
