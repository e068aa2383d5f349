"""Which Longhorn tags and scheduling flag each node gets (node_operations/longhorn_node_role.py),
and which volumes status names as waiting for copies (node_operations/volume_copies.py): plain rules,
no cluster. The lab test tests/lab/test_longhorn_copies.py shows them on Longhorn's objects."""

from __future__ import annotations

from typing import Any

from node_operations.longhorn_node_role import NodeRole, wanted_tags
from node_operations.volume_copies import waiting_volumes


def test_the_server_always_holds_copies() -> None:
    role = NodeRole("srv", server=True, holds_copies=False)
    assert role.tags == ("hk3s-server", "hk3s-copies") and role.allow_scheduling


def test_a_worker_holds_copies_only_after_its_disk_passed() -> None:
    passed, failed = NodeRole("w1", server=False, holds_copies=True), NodeRole("w2", server=False, holds_copies=False)
    assert passed.tags == ("hk3s-copies",) and passed.allow_scheduling
    assert failed.tags == () and not failed.allow_scheduling


def test_the_operators_own_tags_are_kept_and_the_programs_follow_the_verdict() -> None:
    failed = NodeRole("w1", server=False, holds_copies=False)
    assert wanted_tags(["ssd", "hk3s-copies", "rack-2"], failed) == ["ssd", "rack-2"]
    passed = NodeRole("w1", server=False, holds_copies=True)
    assert wanted_tags(["ssd", "hk3s-server"], passed) == ["ssd", "hk3s-copies"]
    assert wanted_tags(["hk3s-copies"], passed) == ["hk3s-copies"]  # unchanged: no patch needed


def _node(name: str, tags: list[str], scheduling: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"tags": tags, "allowScheduling": scheduling}}


def _replica(volume: str, node: str, failed: bool = False) -> dict[str, Any]:
    return {"spec": {"volumeName": volume, "nodeID": node, "failedAt": "2026-01-01T00:00:00Z" if failed else ""}}


def test_a_volume_with_a_copy_waiting_is_named_with_longhorns_condition_and_the_eligible_nodes() -> None:
    volumes = [
        {
            "metadata": {"name": "db"},
            "spec": {"numberOfReplicas": 2, "nodeSelector": ["hk3s-copies"]},
            "status": {
                "conditions": [
                    {"type": "Scheduled", "status": "False", "reason": "ReplicaSchedulingFailure", "message": "x"}
                ]
            },
        },
        {"metadata": {"name": "ok"}, "spec": {"numberOfReplicas": 1, "nodeSelector": ["hk3s-server"]}},
    ]
    replicas = [_replica("db", "srv"), _replica("db", "w1", failed=True), _replica("db", ""), _replica("ok", "srv")]
    nodes = [_node("srv", ["hk3s-server", "hk3s-copies"]), _node("w1", ["hk3s-copies"], scheduling=False)]
    (waiting,) = waiting_volumes(volumes, replicas, nodes)
    assert (waiting.name, waiting.placed, waiting.eligible) == ("db", ["srv"], ["srv"])
    line = waiting.line()
    assert line.startswith("volume db keeps 1 of its 2 copies (on srv); the rest wait.")
    assert "Scheduled condition: False (ReplicaSchedulingFailure): x." in line
