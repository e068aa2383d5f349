"""Which of a worker's taints a rejoin removes: only what an earlier config set and this one
dropped, keyed as Kubernetes keys taints (key and effect). Pure rule, no host involved."""

from __future__ import annotations

from typing import Any

import pytest

from node_operations.node_metadata import MetadataChange
from providers import node_join
from providers.node_join import HOST_CHANGED, NodeJoinProvider, removed_taints
from tests.providers.joined_worker import JOINED_WORKER


def test_a_dropped_taint_is_removed_and_a_new_value_is_not() -> None:
    old = ["dedicated=web:NoSchedule", "spot:PreferNoSchedule", "gpu=true:NoExecute"]
    new = ["dedicated=api:NoSchedule", "gpu=true:NoSchedule"]
    # dedicated keeps its key and effect (overwritten with the new value); spot went; gpu's
    # NoExecute went (its NoSchedule is a different taint).
    assert removed_taints(old, new) == ("gpu:NoExecute", "spot:PreferNoSchedule")
    assert removed_taints([], new) == ()
    assert removed_taints(old, old) == ()


def test_a_state_without_taints_sees_no_change_and_a_taint_change_rejoins() -> None:
    olds = {"node": "w1", "labels": {}, "k3s_version": "v1.36.1+k3s1"}
    provider = NodeJoinProvider()
    assert not provider.diff("w1-join", olds, {**olds, "taints": []}).changes
    changed = provider.diff("w1-join", {**olds, "taints": ["a=b:NoSchedule"]}, {**olds, "taints": []})
    assert changed.changes and not changed.replaces


JOINED = {
    **JOINED_WORKER,
    "labels": {"tier": "web", "zone": "a"},
    "taints": ["dedicated=web:NoSchedule", "spot:PreferNoSchedule"],
    "join_run": "2026-12-01T10:00:00+00:00",
}


def _routed(
    monkeypatch: pytest.MonkeyPatch, news: dict[str, Any], refreshed: dict[str, Any] | None = None
) -> tuple[list[MetadataChange], list[dict[str, Any]], dict[str, Any]]:
    """Run NodeJoin's update on the state as `refreshed` left it, with both ways of applying it
    faked (the lab tests tests/lab/test_join.py and tests/lab_itself/test_pods.py run them for
    real). An update asks no host whether it was rebuilt: refresh does."""
    changes: list[MetadataChange] = []
    joins: list[dict[str, Any]] = []

    async def host_changed(_worker: Any, _machine_id: str) -> str | None:
        raise AssertionError("an update asked the host whether it was rebuilt")

    async def update_metadata(server: Any, change: MetadataChange, _wait: float, _progress: Any) -> None:
        assert server.node == "srv"
        changes.append(change)

    def join(_self: NodeJoinProvider, props: dict[str, Any], **_olds: Any) -> dict[str, Any]:
        joins.append(props)
        return {**props, "join_run": "rejoined"}

    monkeypatch.setattr(node_join, "joined_host_changed", host_changed)
    monkeypatch.setattr(node_join, "update_node_metadata", update_metadata)
    monkeypatch.setattr(NodeJoinProvider, "_join", join)
    inputs = {key: value for key, value in JOINED.items() if key not in ("state", "machine_id", "join_run")}
    outs = NodeJoinProvider().update("w1-join", {**JOINED, **(refreshed or {})}, {**inputs, **news}).outs
    return changes, joins, outs or {}


def test_a_change_of_labels_and_taints_alone_is_set_without_a_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    changes, joins, outs = _routed(
        monkeypatch, {"labels": {"tier": "api"}, "taints": ["dedicated=api:NoSchedule", "gpu:NoExecute"]}
    )
    assert joins == []
    assert changes == [
        MetadataChange(
            node="w1",
            labels={"tier": "api"},
            removed_labels=("zone",),
            taints=("dedicated=api:NoSchedule", "gpu:NoExecute"),
            removed_taints=("spot:PreferNoSchedule",),
        )
    ]
    # The last join's record stays (no disk re-probe follows); the inputs are the new ones.
    assert outs["join_run"] == JOINED["join_run"] and outs["machine_id"] == JOINED["machine_id"]
    assert outs["labels"] == {"tier": "api"} and outs["state"] == "ready"


def test_anything_else_changing_too_rejoins(monkeypatch: pytest.MonkeyPatch) -> None:
    changes, joins, outs = _routed(monkeypatch, {"labels": {"tier": "api"}, "registry": "registry.example:5000"})
    assert changes == [] and len(joins) == 1 and outs["join_run"] == "rejoined"


def test_a_refreshed_rebuilt_host_rejoins_even_for_a_label_change(monkeypatch: pytest.MonkeyPatch) -> None:
    changes, joins, _ = _routed(monkeypatch, {"labels": {"tier": "api"}}, refreshed={HOST_CHANGED: "another machine"})
    assert changes == [] and len(joins) == 1


def test_a_label_change_with_a_rotated_login_key_is_set_without_a_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    changes, joins, outs = _routed(monkeypatch, {"labels": {"tier": "api"}, "private_key": "new-key"})
    assert joins == [] and len(changes) == 1
    assert outs["private_key"] == "new-key" and outs["labels"] == {"tier": "api"}
