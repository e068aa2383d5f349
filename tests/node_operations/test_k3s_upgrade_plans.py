"""Which workers an upgrade moves, under which record, from the Nodes as the API gives them
(the moves themselves run in the lab: tests/lab/test_join.py)."""

from __future__ import annotations

import json
from typing import Any

from node_operations.fence import FENCE_ANNOTATION
from node_operations.k3s_install import K3sBinary
from node_operations.k3s_upgrade import (
    UPGRADE_ANNOTATION,
    UpgradeReport,
    UpgradeSettings,
    fenced_workers,
    not_ready_stop,
    plan_moves,
    worker_turn,
)
from remote_access.kube import NodeStatus
from remote_access.ssh import SshTarget

NEW = "v1.37.0+k3s1"


def node(name: str, version: str, *, record: dict[str, Any] | None = None, cordoned: bool = False) -> dict[str, Any]:
    annotations = {UPGRADE_ANNOTATION: json.dumps(record)} if record is not None else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"nodeInfo": {"kubeletVersion": version}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def targets(*names: str) -> list[SshTarget]:
    return [SshTarget(node=name, address=f"198.51.100.{i}", private_key="k") for i, name in enumerate(names, 10)]


def settings(drain: bool = True) -> UpgradeSettings:
    return UpgradeSettings(binary=K3sBinary(version=NEW), drain_on_minor=drain)


def test_the_workers_move_in_the_stacks_order_and_the_rest_is_said() -> None:
    nodes = {
        n["metadata"]["name"]: n for n in (node("w3", "v1.36.4+k3s1"), node("w1", "v1.36.4+k3s1"), node("w2", NEW))
    }
    plans, already, not_joined = plan_moves(nodes, targets("w1", "w2", "w3", "w4"), settings())
    assert [(worker.node, record["drain"], resumed) for worker, record, resumed in plans] == [
        ("w1", True, False),
        ("w3", True, False),
    ]
    assert already == ["w2"] and not_joined == ["w4"]


def test_a_patch_and_a_minor_without_the_drain_move_in_place() -> None:
    nodes = {"w1": node("w1", "v1.37.0+k3s0"), "w2": node("w2", "v1.36.4+k3s1")}
    assert [record["drain"] for _, record, _ in plan_moves(nodes, targets("w1"), settings())[0]] == [False]
    assert [record["drain"] for _, record, _ in plan_moves(nodes, targets("w2"), settings(drain=False))[0]] == [False]


def test_a_record_of_this_release_is_resumed_even_at_the_release() -> None:
    # Killed after the agent moved, before the record went: the worker is finished (uncordoned), not skipped.
    record = {"from": "v1.36.4+k3s1", "to": NEW, "drain": True, "was_cordoned": False}
    plans, already, _ = plan_moves({"w1": node("w1", NEW, record=record, cordoned=True)}, targets("w1"), settings())
    assert [(w.node, r, resumed) for w, r, resumed in plans] == [("w1", record, True)] and already == []


def test_a_record_of_an_earlier_release_starts_over_keeping_the_operators_cordon() -> None:
    earlier = {"from": "v1.36.3+k3s1", "to": "v1.36.4+k3s1", "drain": True, "was_cordoned": True}
    plans, _, _ = plan_moves(
        {"w1": node("w1", "v1.36.4+k3s1", record=earlier, cordoned=True)}, targets("w1"), settings()
    )
    [(_, record, resumed)] = plans
    assert resumed is False
    assert record == {"from": "v1.36.4+k3s1", "to": NEW, "drain": True, "was_cordoned": True}


def test_fenced_workers_are_left_alone_whether_the_settings_or_the_node_say_so() -> None:
    fenced_node = node("w2", "v1.36.4+k3s1")
    fenced_node["metadata"]["annotations"][FENCE_ANNOTATION] = "2026-12-03T20:00:00Z"
    nodes = {"w1": node("w1", "v1.36.4+k3s1"), "w2": fenced_node, "w3": node("w3", "v1.36.4+k3s1")}
    in_settings = UpgradeSettings(binary=K3sBinary(version=NEW), fenced=frozenset({"w3"}))
    assert fenced_workers(nodes, targets("w1", "w2", "w3"), in_settings) == ["w2", "w3"]
    assert fenced_workers(nodes, targets("w1", "w3"), settings()) == []
    report = UpgradeReport(NEW, ("w1",), (), (), ("w2", "w3"))
    assert report.summary() == f"1 worker(s) moved to {NEW}; fenced, left alone at their release: w2, w3"


def not_ready(obj: dict[str, Any]) -> dict[str, Any]:
    obj["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    return obj


def test_each_worker_is_read_again_just_before_its_turn() -> None:
    # The run's first reading is minutes old by the third worker's turn: what counts is the Node now.
    assert worker_turn(node("w3", "v1.36.4+k3s1"), "w3", settings(), resumed=False) == "move"
    # Gone NotReady since: the run stops before it, and nothing of it is touched.
    assert worker_turn(not_ready(node("w3", "v1.36.4+k3s1")), "w3", settings(), resumed=False) == "not_ready"
    # A worker left half-way by an interrupted run may be NotReady: it is the one to finish.
    assert worker_turn(not_ready(node("w3", "v1.36.4+k3s1")), "w3", settings(), resumed=True) == "move"
    # Its Node deleted meanwhile (a give-up, a kubectl delete): nothing to move, the run stops.
    assert worker_turn(None, "w3", settings(), resumed=False) == "missing"


def test_a_worker_fenced_during_the_run_is_left_alone_at_its_turn() -> None:
    fenced = not_ready(node("w3", "v1.36.4+k3s1"))
    fenced["metadata"]["annotations"][FENCE_ANNOTATION] = "2026-12-04T23:00:00Z"
    assert worker_turn(fenced, "w3", settings(), resumed=False) == "fenced"
    in_settings = UpgradeSettings(binary=K3sBinary(version=NEW), fenced=frozenset({"w3"}))
    assert worker_turn(node("w3", "v1.36.4+k3s1"), "w3", in_settings, resumed=False) == "fenced"


def test_the_stop_before_a_worker_gone_not_ready_names_it_and_what_was_left_untouched() -> None:
    status = NodeStatus.from_object(not_ready(node("w3", "v1.36.4+k3s1")))
    message = not_ready_stop(status, NEW, moved=["w1", "w2"], after=["w4"])
    assert message.startswith(f"the upgrade to {NEW} stopped here: it went NotReady (NodeStatusUnknown)"), message
    assert "was not touched (no record, no cordon; it still runs v1.36.4+k3s1)" in message
    assert f"Moved to {NEW} in this run: w1, w2; not touched either: w4." in message
    assert "hk3s:fences.w3" in message and "run up again" in message
