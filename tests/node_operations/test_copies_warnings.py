"""What `status --check` warns of about copies besides the volumes that wait: single copies on
workers, and little room left for copies, from Longhorn's objects as its API gives them (the
waiting volumes: tests/node_operations/test_longhorn_node_role.py and the lab)."""

from __future__ import annotations

import json
from typing import Any

from node_operations.volume_copies import (
    COPIES_TAG,
    NODE_UNHELD_ANNOTATION,
    low_room,
    single_copies_on_workers,
    unheld_workloads,
)

GIB = 1024**3


def volume(name: str, replicas: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"numberOfReplicas": replicas}}


def replica(volume_name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{volume_name}-{node}"}, "spec": {"volumeName": volume_name, "nodeID": node}}


def test_single_copies_on_workers_are_named_with_their_worker() -> None:
    volumes = [volume("db", 1), volume("logs", 1), volume("shared", 2), volume("new", 1)]
    replicas = [replica("db", "w1"), replica("logs", "srv"), replica("shared", "w1"), replica("shared", "w2")]
    (line,) = single_copies_on_workers(volumes, replicas, "srv")
    assert line.startswith("volume db keeps its only copy on worker w1: losing that worker loses it; move it to srv")


def node(name: str, available_gib: float, *, tags: tuple[str, ...] = (COPIES_TAG,)) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"allowScheduling": True, "tags": list(tags), "disks": {"d": {"storageReserved": 0}}},
        "status": {
            "diskStatus": {
                "d": {"storageMaximum": 100 * GIB, "storageAvailable": int(available_gib * GIB), "storageScheduled": 0}
            }
        },
    }


def test_little_room_warns_only_below_5_gib_on_the_roomiest_eligible_disk() -> None:
    # 25 % of 100 GiB kept available: 28 GiB available leaves 3 GiB; 40 GiB leaves 15 GiB.
    line = low_room([node("srv", 28), node("w1", 27), node("w2", 90, tags=())], 25)
    assert line is not None and line.startswith("the roomiest disk that may hold copies (srv) can take 3.0 GiB more")
    assert low_room([node("srv", 28), node("w1", 40)], 25) is None
    assert low_room([node("w2", 1, tags=())], 25) is None  # nothing may hold copies: the waiting volumes say it


def test_status_names_the_workloads_a_fence_cannot_hold_stopped() -> None:
    why = "Deployment default/op-db is owned by App default/db, which the fence cannot stop: ..."
    nodes: list[dict[str, Any]] = [
        {
            "metadata": {
                "name": "w1",
                "annotations": {NODE_UNHELD_ANNOTATION: json.dumps({"Deployment default/op-db": why})},
            }
        },
        {"metadata": {"name": "w2", "annotations": {NODE_UNHELD_ANNOTATION: "not the fence's"}}},
        {"metadata": {"name": "srv"}},
    ]
    assert unheld_workloads(nodes) == [f"w1 is fenced, and its fence cannot hold this workload stopped: {why}"]
