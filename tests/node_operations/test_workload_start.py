"""`workload start`'s rules without a cluster: how NAMESPACE/KIND/NAME is read, which copies let a
stopped workload start (the fence's rule, with a copy current now counted wherever it is and a
node the cluster no longer has counted as none), and the lines a give-up prints. The command
through the API runs in the lab (tests/lab/test_fence_workloads.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from node_operations.fence_workloads import (
    STOPPED_ANNOTATION,
    Copy,
    Owner,
    Verdict,
    VolumeCopies,
    copies_by_volume,
    unavailable_nodes,
)
from node_operations.workload_start import (
    WorkloadRef,
    current_now,
    refusal,
    start_command,
    stopped_lines,
)

W = "w1"
T1, T2, T3 = "2026-12-04T01:00:00Z", "2026-12-04T02:00:00Z", "2026-12-04T03:00:00Z"


def test_a_workload_is_named_namespace_kind_name_in_any_case_of_kind() -> None:
    assert WorkloadRef.parse("default/deployment/db") == WorkloadRef("default", "Deployment", "db")
    assert str(WorkloadRef.parse("jobs/CronJob/nightly")) == "jobs/CronJob/nightly"
    with pytest.raises(ValueError, match="is not NAMESPACE/KIND/NAME"):
        WorkloadRef.parse("default/db")
    with pytest.raises(ValueError, match=r"a fence stops only .*not 'DaemonSet'"):
        WorkloadRef.parse("kube-system/DaemonSet/svclb")


def test_a_copy_current_now_starts_it_wherever_it_is() -> None:
    worker_back = VolumeCopies("v", "default/c", (Copy(W, healthy_at=T1, last_healthy_at=T1),))
    assert worker_back.verdict(W) is Verdict.ONLY_COPY  # the fence's verdict counts no copy on the worker
    assert current_now(worker_back, W) is Verdict.MOVES  # back Ready and unfenced, its copy is current
    fenced = VolumeCopies("v", "default/c", (Copy(W, healthy_at=T1, last_healthy_at=T1, unavailable="fenced"),))
    assert current_now(fenced, W) is Verdict.ONLY_COPY
    stale = VolumeCopies(
        "v", "default/c", (Copy("w2", healthy_at=T1, failed_at=T2, last_healthy_at=T1, last_failed_at=T2),)
    )
    assert current_now(stale, W) is Verdict.STALE
    line = refusal(Owner("Deployment", "default", "db"), W, Verdict.STALE, [stale])
    assert "w2 (failed; lastHealthyAt" in line and "scripts/hk3s workload start default/Deployment/db" in line
    assert line.endswith("--accept-stale-data")


def test_a_copy_on_a_node_the_cluster_no_longer_has_is_not_current() -> None:
    ready = {"metadata": {"name": "srv"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    replicas = [
        {"spec": {"volumeName": "v", "nodeID": "gone", "healthyAt": T3, "lastHealthyAt": T3}},
        {"spec": {"volumeName": "v", "nodeID": "srv", "healthyAt": T1, "failedAt": T2, "lastFailedAt": T2}},
    ]
    unavailable = unavailable_nodes([ready], replicas)
    assert unavailable == {"gone": "its node is not in the cluster"}
    copies = VolumeCopies("v", "default/c", copies_by_volume(replicas, unavailable)["v"])
    assert current_now(copies, "gone") is Verdict.STALE


def stopped(kind: str, name: str, record: dict[str, Any] | None, owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "annotations": {}}
    if record is not None:
        meta["annotations"][STOPPED_ANNOTATION] = json.dumps(record)
    if owner is not None:
        meta["ownerReferences"] = [{"kind": "Deployment", "name": owner, "controller": True}]
    return {"kind": kind, "metadata": meta}


def test_a_give_up_lists_what_its_fence_stopped_with_the_command() -> None:
    objects = [
        stopped("Deployment", "db", {"node": W, "reason": "stale", "replicas": 1, "volumes": [["v", "default/c"]]}),
        stopped("ReplicaSet", "db-1", {"node": W, "reason": "stale"}, owner="db"),  # a copy of db's record
        stopped("Job", "nightly", {"node": W, "reason": "only-copy", "suspend": False, "volumes": []}),
        stopped("Deployment", "other", {"node": "w2", "reason": "stale"}),
        stopped("Deployment", "plain", None),
    ]
    lines = stopped_lines(objects, W)
    assert len(lines) == 2, lines
    assert "Deployment default/db stays stopped by the fence (stale)" in lines[0]
    assert "scripts/hk3s workload start default/Deployment/db --accept-stale-data" in lines[0]
    assert lines[1].startswith("Job default/nightly stays stopped by the fence (only-copy)")
    assert f"{start_command(Owner('Job', 'default', 'nightly'))} (" in lines[1]
