"""NodeJoin's diff asks the host when the inputs are unchanged: a host rebuilt under the
node's name (no agent, another machine-id) makes the next run join it again. The host's
answer is faked here (the lab test tests/lab/test_node_password.py asks a real one)."""

from __future__ import annotations

from typing import Any

import pytest

from providers import node_join
from providers.node_join import NodeJoinProvider

JOINED = {
    "node": "w1",
    "address": "198.51.100.7",
    "private_key": "old-key",
    "k3s_version": "v1.36.1+k3s1",
    "labels": {"tier": "web"},
    "state": "ready",
    "machine_id": "a" * 32,
}
INPUTS = {key: value for key, value in JOINED.items() if key not in ("state", "machine_id")}


def _host_says(monkeypatch: pytest.MonkeyPatch, answer: str | None) -> list[tuple[str, str, str]]:
    asked: list[tuple[str, str, str]] = []

    async def joined_host_changed(worker: Any, machine_id: str) -> str | None:
        asked.append((worker.address, worker.private_key, machine_id))
        return answer

    monkeypatch.setattr(node_join, "joined_host_changed", joined_host_changed)
    return asked


def test_a_rebuilt_host_is_joined_again(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked = _host_says(monkeypatch, "the host at 198.51.100.7 is another machine than the one joined as w1")
    result = NodeJoinProvider().diff("w1-join", dict(JOINED), dict(INPUTS))
    assert result.changes is True and not result.replaces
    assert asked == [("198.51.100.7", "old-key", "a" * 32)]
    assert "[w1] the host at 198.51.100.7 is another machine" in capsys.readouterr().err


def test_the_same_host_with_its_agent_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _host_says(monkeypatch, None)
    assert NodeJoinProvider().diff("w1-join", dict(JOINED), dict(INPUTS)).changes is False
    assert len(asked) == 1


def test_changed_inputs_update_without_asking_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _host_says(monkeypatch, "never asked")
    result = NodeJoinProvider().diff("w1-join", dict(JOINED), {**INPUTS, "labels": {"tier": "db"}})
    assert result.changes is True and asked == []


def test_a_login_key_change_alone_still_asks_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # The update of a rotated key alone runs the diff without the key change (state_only_change):
    # a host rebuilt in the same run is joined again rather than only storing the new key.
    joined: list[dict[str, Any]] = []

    def join(_self: NodeJoinProvider, props: dict[str, Any], **_olds: Any) -> dict[str, Any]:
        joined.append(props)
        return props

    monkeypatch.setattr(NodeJoinProvider, "_join", join)
    asked = _host_says(monkeypatch, "the host at 198.51.100.7 no longer has the k3s agent it joined with")
    NodeJoinProvider().update("w1-join", dict(JOINED), {**INPUTS, "private_key": "new-key"})
    assert [props["private_key"] for props in joined] == ["new-key"]
    # The guard and the update's own question (labels and taints alone?) share one answer:
    # one login to the host per update.
    assert asked == [("198.51.100.7", "old-key", "a" * 32)]


def test_each_update_asks_the_host_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    # Answers are kept for one update only: the next update (another run, or another worker on
    # the same provider) asks again, and the engine's own diff always asks.
    asked = _host_says(monkeypatch, None)
    provider = NodeJoinProvider()
    for _ in range(2):
        result = provider.update("w1-join", dict(JOINED), {**INPUTS, "private_key": "new-key"})
        assert result.outs is not None and result.outs["private_key"] == "new-key"
    assert len(asked) == 2
    provider.diff("w1-join", dict(JOINED), dict(INPUTS))
    provider.diff("w1-join", dict(JOINED), dict(INPUTS))
    assert len(asked) == 4


def test_a_join_that_never_finished_is_not_asked_about(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _host_says(monkeypatch, "never asked")
    olds = {key: value for key, value in JOINED.items() if key != "state"}
    assert NodeJoinProvider().diff("w1-join", olds, dict(INPUTS)).changes is False and asked == []
