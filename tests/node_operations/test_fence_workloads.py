"""The fence's rules per workload with Longhorn volumes: which copies are current, stale or the
only one; which owner is stopped and how; which pods the program cannot judge. The decision through the API runs in the lab
(tests/lab/test_fence_workloads.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from node_operations.fence_workloads import (
    STOPPED_ANNOTATION,
    ClaimMap,
    Copy,
    Owner,
    Verdict,
    VolumeCopies,
    Workload,
    WorkloadDecision,
    WorkloadReport,
    copies_by_volume,
    copies_now,
    parent_of,
    recorded_volumes,
    start_patch,
    stop_patch,
    stop_record,
    stoppable_owner,
    stopped_by,
    unavailable_nodes,
    unheard_engines,
    why_stopped,
)
from node_operations.workload_start import current_now
from remote_access.kube import ClusterApi

W = "w1"
# Longhorn's timestamps (RFC 3339, UTC): string order is time order.
T1, T2, T3 = "2026-12-04T01:00:00Z", "2026-12-04T02:00:00Z", "2026-12-04T03:00:00Z"


def current(node: str) -> Copy:
    return Copy(node, healthy_at=T1, last_healthy_at=T1)


def failed(node: str, at: str, healthy: str = T1) -> Copy:
    # Longhorn keeps healthyAt when a replica fails (it clears it only before a rebuild).
    return Copy(node, healthy_at=healthy, failed_at=at, last_healthy_at=healthy, last_failed_at=at)


def volume(*copies: Copy) -> VolumeCopies:
    return VolumeCopies("pvc-1", "default/data", tuple(copies))


def test_a_current_copy_elsewhere_lets_the_workload_move() -> None:
    assert volume(failed(W, T3), current("srv")).verdict(W) is Verdict.MOVES


def test_copies_elsewhere_that_failed_since_are_stale() -> None:
    # srv's copy failed before the worker's: it may miss the worker's last writes.
    assert volume(failed(W, T3), failed("srv", T2)).verdict(W) is Verdict.STALE


def test_the_workers_copy_alone_is_the_only_copy() -> None:
    assert volume(failed(W, T3)).verdict(W) is Verdict.ONLY_COPY
    # The worker's own copy being current (its node not yet marked down) does not count either.
    assert volume(current(W)).verdict(W) is Verdict.ONLY_COPY
    # A copy elsewhere that was never healthy holds no data: not a copy to start from.
    assert volume(failed(W, T3), Copy("srv")).verdict(W) is Verdict.ONLY_COPY
    # An unplaced replica neither.
    assert volume(failed(W, T3), Copy("", healthy_at=T1)).verdict(W) is Verdict.ONLY_COPY


def test_a_workload_takes_the_worst_verdict_of_its_volumes() -> None:
    owner = Owner("Deployment", "default", "db")
    workload = Workload(owner, ["default/db-1"])
    workload.volumes["a"] = VolumeCopies("a", "default/a", (failed(W, T3), current("srv")))
    assert workload.verdict(W) is Verdict.MOVES
    workload.volumes["b"] = VolumeCopies("b", "default/b", (failed(W, T3), failed("w2", T2)))
    assert workload.verdict(W) is Verdict.STALE
    workload.volumes["c"] = VolumeCopies("c", "default/c", (failed(W, T3),))
    assert workload.verdict(W) is Verdict.ONLY_COPY


def test_at_the_rejoin_the_workers_copy_that_failed_last_is_the_newest() -> None:
    assert volume(failed(W, T3)).verdict(W, worker_back=True) is Verdict.MOVES
    assert volume(failed(W, T3), failed("srv", T2)).verdict(W, worker_back=True) is Verdict.MOVES
    # Another copy failed after the worker's: the worker's may be the older one.
    assert volume(failed(W, T2), failed("srv", T3)).verdict(W, worker_back=True) is Verdict.STALE
    assert volume(current(W)).verdict(W, worker_back=True) is Verdict.MOVES
    # Nothing of the volume left anywhere: no copy to start from.
    assert volume().verdict(W, worker_back=True) is Verdict.ONLY_COPY


def test_the_stale_line_lists_every_copy_with_its_times() -> None:
    copies = volume(failed(W, T3, healthy=T1), failed("srv", T2, healthy=T1))
    line = why_stopped(Owner("Deployment", "default", "db"), Verdict.STALE, W, [copies], worker_back=False)
    assert "Deployment default/db stays stopped: no other node holds a current copy" in line
    assert f"srv (failed; lastHealthyAt {T1}, lastFailedAt {T2})" in line
    assert f"w1 (failed; lastHealthyAt {T1}, lastFailedAt {T3})" in line
    assert "set hk3s:fences.w1.accept_stale_data: true" in line
    assert "run scripts/hk3s workload start default/Deployment/db --accept-stale-data (this one)" in line
    only = why_stopped(
        Owner("Job", "default", "backup"), Verdict.ONLY_COPY, W, [volume(failed(W, T3))], worker_back=False
    )
    assert only.startswith("Job default/backup stays stopped until w1 rejoins: the only copy of pvc-1 is on w1")


def pod(name: str, owner: tuple[str, str] | None = None, volumes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    refs = [{"kind": owner[0], "name": owner[1], "controller": True}] if owner else []
    return {
        "metadata": {"name": name, "namespace": "default", "ownerReferences": refs},
        "spec": {"volumes": volumes or []},
    }


def test_the_owner_stopped_is_the_deployment_statefulset_replicaset_or_job() -> None:
    deployment_rs = {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": "db", "controller": True}]}}
    assert stoppable_owner(pod("db-x", ("ReplicaSet", "db-5f")), deployment_rs) == Owner("Deployment", "default", "db")
    assert stoppable_owner(pod("rs-x", ("ReplicaSet", "rs")), {"metadata": {}}) == Owner("ReplicaSet", "default", "rs")
    assert stoppable_owner(pod("s-0", ("StatefulSet", "s")), None) == Owner("StatefulSet", "default", "s")
    assert stoppable_owner(pod("j-x", ("Job", "backup")), None) == Owner("Job", "default", "backup")


def test_pods_without_an_owner_the_fence_can_stop_are_not_judged() -> None:
    assert stoppable_owner(pod("bare"), None) is None
    assert stoppable_owner(pod("ds-x", ("DaemonSet", "agent")), None) is None
    assert stoppable_owner(pod("pg-1", ("Cluster", "pg")), None) is None
    # A ReplicaSet another controller owns (it would scale it back), or one that is gone.
    rollout = {"metadata": {"ownerReferences": [{"kind": "Rollout", "name": "r", "controller": True}]}}
    assert stoppable_owner(pod("r-x", ("ReplicaSet", "r-1")), rollout) is None
    assert stoppable_owner(pod("r-x", ("ReplicaSet", "r-1")), None) is None


def test_claims_bound_to_longhorn_volumes_are_found_in_a_pod() -> None:
    claims = [
        {"metadata": {"namespace": "default", "name": "data"}, "spec": {"volumeName": "pv-a"}},
        {"metadata": {"namespace": "default", "name": "web-0-scratch"}, "spec": {"volumeName": "pv-b"}},
        {"metadata": {"namespace": "default", "name": "nfs"}, "spec": {"volumeName": "pv-c"}},
    ]
    pvs = [
        {"metadata": {"name": "pv-a"}, "spec": {"csi": {"driver": "driver.longhorn.io", "volumeHandle": "vol-a"}}},
        {"metadata": {"name": "pv-b"}, "spec": {"csi": {"driver": "driver.longhorn.io", "volumeHandle": "vol-b"}}},
        {"metadata": {"name": "pv-c"}, "spec": {"nfs": {"server": "x", "path": "/"}}},
    ]
    found = ClaimMap.of(claims, pvs)
    volumes = [
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}},
        {"name": "n", "persistentVolumeClaim": {"claimName": "nfs"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    assert found.volumes_of(pod("web-0", volumes=volumes)) == {
        "default/data": "vol-a",
        "default/web-0-scratch": "vol-b",
    }
    assert found.bound["default/data"] == "pv-a"
    assert found.volumes_of(pod("other", volumes=[volumes[2], volumes[3]])) == {}


def test_a_stop_and_its_record_are_one_patch_that_the_start_undoes() -> None:
    owner = Owner("Deployment", "default", "db")
    patch = stop_patch(owner, {"spec": {"replicas": 3}}, W, Verdict.STALE, [volume(failed(W, T3))])
    assert patch["spec"] == {"replicas": 0}
    record = stop_record(patch)
    assert record == {"node": W, "reason": "stale", "replicas": 3, "volumes": [["pvc-1", "default/data"]]}
    assert start_patch(owner, record) == {
        "metadata": {"annotations": {STOPPED_ANNOTATION: None}},
        "spec": {"replicas": 3},
    }


def test_a_job_is_suspended_and_resumed_as_it_was() -> None:
    job = Owner("Job", "default", "backup")
    patch = stop_patch(job, {"spec": {"parallelism": 1}}, W, Verdict.ONLY_COPY, [volume(failed(W, T3))])
    assert patch["spec"] == {"suspend": True}
    record = stop_record(patch)
    assert record is not None and record["suspend"] is False and record["reason"] == "only-copy"
    assert start_patch(job, record)["spec"] == {"suspend": False}


def test_a_record_that_is_not_the_fences_is_ignored() -> None:
    assert stop_record({"metadata": {"annotations": {STOPPED_ANNOTATION: "by hand"}}}) is None
    assert stop_record({"metadata": {"annotations": {STOPPED_ANNOTATION: json.dumps([1])}}}) is None
    assert stop_record({"metadata": {}}) is None


def test_the_report_says_where_workloads_go_and_what_stays_stopped() -> None:
    report = WorkloadReport(
        moving={"Deployment default/web": "volume v (claim default/c): copies on srv (current; ...)"},
        stopped={"Deployment default/db": "Deployment default/db stays stopped until w1 rejoins: ..."},
        unjudged=["pod default/bare uses Longhorn volume(s) v ..."],
    )
    lines = report.lines()
    assert lines[0].startswith("Deployment default/web may start elsewhere: volume v")
    assert "Deployment default/db stays stopped until w1 rejoins: ..." in lines
    assert "warning: pod default/bare uses Longhorn volume(s) v ..." in lines
    assert lines[-1] == "warning: pod default/bare uses Longhorn volume(s) v ..."


# --- A current copy is one healthy now on a node that is Ready and not fenced.


def node(name: str, *, ready: str = "True", fenced: bool = False, tainted: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {"hk3s.dev/fenced-at": T3} if fenced else {}},
        "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}] if tainted else []},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def test_nodes_that_cannot_serve_a_copy_are_the_notready_and_the_fenced() -> None:
    nodes = [
        node("srv"),
        node("w2", ready="Unknown"),
        node("w3", fenced=True),
        node("w4", tainted=True),
        {"metadata": {"name": "w5"}, "status": {}},
    ]
    found = unavailable_nodes(nodes, [])
    assert set(found) == {"w2", "w3", "w4", "w5"}
    assert found["w2"] == "its node is NotReady"
    assert "hk3s.dev/fenced-at" in found["w3"] and "out-of-service" in found["w4"]


def test_a_copy_on_a_node_down_or_fenced_is_not_current() -> None:
    replicas = [
        {"spec": {"volumeName": "pvc-1", "nodeID": W, "healthyAt": T1, "failedAt": T3, "lastFailedAt": T3}},
        {"spec": {"volumeName": "pvc-1", "nodeID": "w2", "healthyAt": T1, "lastHealthyAt": T1}},
    ]
    # Longhorn's fields alone say w2's copy is current (its manager has not marked it failed yet).
    assert volume(*copies_by_volume(replicas)["pvc-1"]).verdict(W) is Verdict.MOVES
    for down in ({"w2": "its node is NotReady"}, {"w2": "its node is fenced (hk3s.dev/fenced-at)"}):
        copies = volume(*copies_by_volume(replicas, down)["pvc-1"])
        # Not current, but it held data: a copy that may be older, started only with consent.
        assert copies.verdict(W) is Verdict.STALE
        assert f"w2 (not current: {down['w2']}; lastHealthyAt {T1}" in copies.line()
    # At the rejoin the worker itself is back (its fence record goes last): its copy counts.
    back = copies_by_volume(replicas, {"w2": "its node is NotReady"})["pvc-1"]
    assert volume(*back).verdict(W, worker_back=True) is Verdict.MOVES


# --- Owners walked to the top.


def test_the_owners_of_a_stopped_workload_are_walked_to_the_top() -> None:
    cron = {"metadata": {"ownerReferences": [{"kind": "CronJob", "name": "nightly", "controller": True}]}}
    assert parent_of(Owner("Job", "default", "nightly-1"), cron) == Owner("CronJob", "default", "nightly")
    app = {"metadata": {"ownerReferences": [{"kind": "App", "name": "db", "controller": True}]}}
    # Something the program cannot stop: its controller would scale the workload back.
    assert parent_of(Owner("Deployment", "default", "db"), app) == "App default/db"
    assert parent_of(Owner("StatefulSet", "default", "db"), app) == "App default/db"
    assert parent_of(Owner("CronJob", "default", "nightly"), app) == "App default/db"
    assert parent_of(Owner("Deployment", "default", "web"), {"metadata": {}}) is None
    # A non-controller reference (a garbage-collection owner) scales nothing.
    loose = {"metadata": {"ownerReferences": [{"kind": "App", "name": "db"}]}}
    assert parent_of(Owner("Deployment", "default", "web"), loose) is None


def test_a_cronjob_is_suspended_with_a_record_and_resumed_as_it_was() -> None:
    cronjob = Owner("CronJob", "default", "nightly")
    assert cronjob.resource == "cronjob"
    patch = stop_patch(cronjob, {"spec": {"schedule": "0 1 * * *"}}, W, Verdict.ONLY_COPY, [volume(failed(W, T3))])
    assert patch["spec"] == {"suspend": True}
    record = stop_record(patch)
    assert record is not None and record["suspend"] is False
    assert start_patch(cronjob, record)["spec"] == {"suspend": False}


def test_a_job_of_a_cronjob_keeps_its_own_record_a_deployments_replicaset_does_not() -> None:
    record = json.dumps({"node": W, "reason": "only-copy", "suspend": False, "volumes": []})

    def obj(kind: str, controller: str | None) -> dict[str, Any]:
        refs = [{"kind": controller, "name": "x", "controller": True}] if controller else []
        meta = {"name": "x", "namespace": "default", "annotations": {STOPPED_ANNOTATION: record}}
        return {"kind": kind, "metadata": {**meta, "ownerReferences": refs}}

    assert stopped_by(obj("Job", "CronJob"), W) == Owner("Job", "default", "x")
    assert stopped_by(obj("CronJob", None), W) == Owner("CronJob", "default", "x")
    # A Deployment's ReplicaSets carry copies of its annotations: the Deployment is the one stopped.
    assert stopped_by(obj("ReplicaSet", "Deployment"), W) is None
    assert stopped_by(obj("Job", None), "w9") is None


def test_a_workload_the_fence_cannot_hold_is_named_in_the_report() -> None:
    report = WorkloadReport(unheld={"Deployment default/op-db": "Deployment default/op-db ... App default/db ..."})
    assert "not held stopped: Deployment default/op-db ... App default/db ..." in report.lines()


# --- One rule for a current copy, in the fence and in `workload start`.


class ClusterReads:
    """The server's answers to the reads the fence's decision makes (`kubectl get ... -o json`):
    a stand-in for the API server, which cannot run without the lab here; the lab runs the decision
    against the real one (tests/lab/test_fence_workloads.py)."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self.objects = objects
        self.patches: list[list[str]] = []
        self.applied: list[str] = []

    async def kubectl(self, args: list[str], **_: Any) -> str:
        if args[0] == "patch":
            self.patches.append(args)
            return ""
        assert args[0] == "get", args
        if args[1] == "configmap":  # the fence's holds (node_operations/fence_holds.py): none yet
            return ""
        return json.dumps({"items": self.objects[args[1]]})

    async def apply(self, manifest: str) -> None:
        self.applied.append(manifest)

    async def patch_merge(self, *args: Any) -> None:
        self.patches.append([str(arg) for arg in args])


def test_a_copy_on_a_node_missing_from_the_cluster_is_current_for_neither_the_fence_nor_workload_start() -> None:
    """A current copy is one healthy now on a node that is Ready and not fenced. A node the cluster
    no longer has (a worker given up, a Node deleted) is not Ready: a copy Longhorn still lists there
    cannot be started from, however healthy its fields say it is. The fence's decision and `workload
    start` read the copies through the same function, so they cannot judge it differently."""
    ready = {"metadata": {"name": "srv"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    fenced = {
        "metadata": {"name": W, "annotations": {"hk3s.dev/fenced-at": T3}},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }
    replicas = [
        {"spec": {"volumeName": "pvc-1", "nodeID": W, "healthyAt": T1, "failedAt": T3, "lastFailedAt": T3}},
        # Longhorn's fields: healthy, never failed; its node is gone from the cluster.
        {"spec": {"volumeName": "pvc-1", "nodeID": "gone", "healthyAt": T1, "lastHealthyAt": T1}},
    ]
    claim = {"metadata": {"namespace": "default", "name": "data"}, "spec": {"volumeName": "pv-1"}}
    pv = {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": "driver.longhorn.io", "volumeHandle": "pvc-1"}}}
    owner = [{"kind": "StatefulSet", "name": "db", "controller": True}]
    pod: dict[str, Any] = {
        "metadata": {"namespace": "default", "name": "db-0", "ownerReferences": owner},
        "spec": {"nodeName": W, "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
    }
    api = ClusterReads(
        {
            "nodes": [ready, fenced],
            "replicas.longhorn.io": replicas,
            "engines.longhorn.io": [],
            "pvc": [claim],
            "pv": [pv],
        }
    )

    # The one rule, as both read it.
    copies = asyncio.run(copies_now(cast(ClusterApi, api)))["pvc-1"]
    gone = next(c for c in copies if c.node == "gone")
    assert not gone.current and gone.unavailable == "its node is not in the cluster", gone
    # The fence's decision on the workload using it: the copy elsewhere may be older (consent needed).
    decision = WorkloadDecision(cast(ClusterApi, api), W, lambda _line: None, accept_stale_data=False)
    workloads = asyncio.run(decision.workloads([pod]))
    assert workloads[Owner("StatefulSet", "default", "db")].verdict(W) is Verdict.STALE
    # `workload start`'s verdict on the same copies.
    assert current_now(VolumeCopies("pvc-1", "default/data", copies), W) is Verdict.STALE


def test_the_lift_names_the_workload_start_command_for_what_stays_stopped() -> None:
    """At the lift (the worker back, `start_stopped(worker_back=True)`), a workload the fence
    stopped whose copies elsewhere failed after the worker's stays stopped; the line names the
    command that starts it with consent, `scripts/hk3s workload start NAMESPACE/KIND/NAME`."""
    record = {"node": W, "reason": "stale", "replicas": 2, "volumes": [["pvc-1", "default/data"]]}
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "db", "namespace": "default", "annotations": {STOPPED_ANNOTATION: json.dumps(record)}},
        "spec": {"replicas": 0},
    }
    ready = {"metadata": {"name": W}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    replicas = [
        {"spec": {"volumeName": "pvc-1", "nodeID": W, "healthyAt": T1, "failedAt": T2, "lastFailedAt": T2}},
        {"spec": {"volumeName": "pvc-1", "nodeID": "srv", "healthyAt": T1, "failedAt": T3, "lastFailedAt": T3}},
    ]
    kinds = ",".join(sorted({"deployment", "statefulset", "replicaset", "job", "cronjob"}))
    api = ClusterReads(
        {
            kinds: [deployment],
            "nodes": [{**ready, "metadata": {"name": W}}, {**ready, "metadata": {"name": "srv"}}],
            "replicas.longhorn.io": replicas,
            "engines.longhorn.io": [],
        }
    )
    decision = WorkloadDecision(cast(ClusterApi, api), W, lambda _line: None, accept_stale_data=False)
    report = asyncio.run(decision.start_stopped(worker_back=True))
    line = report.stopped["Deployment default/db"]
    assert "stays stopped although w1 rejoined" in line, line
    assert line.endswith("scripts/hk3s workload start default/Deployment/db --accept-stale-data"), line
    assert not [p for p in api.patches if p[0] != "patch"], api.patches  # nothing started


def unheard(node: str, engine_node: str = W) -> Copy:
    """A copy Longhorn reads healthy while its volume's engine, on `engine_node`, reads unknown."""
    return Copy(node, healthy_at=T1, last_healthy_at=T1, engine_unheard_on=engine_node)


def test_a_copy_healthy_by_its_fields_may_be_older_while_its_volumes_engine_is_unheard() -> None:
    """Longhorn changes no copy while the volume's engine reads unknown (its node cut off), so a
    copy elsewhere that reads healthy may have missed what the engine wrote since: stale, not
    current. The engine's own node's copy is not marked; at the worker's rejoin the mark goes."""
    engines = [
        {"spec": {"volumeName": "pvc-1", "nodeID": W}, "status": {"currentState": "unknown"}},
        {"spec": {"volumeName": "pvc-2", "nodeID": "w2"}, "status": {"currentState": "running"}},
        # Still reads running (no manager has marked it yet), but its node is fenced: not heard.
        {"spec": {"volumeName": "pvc-3", "nodeID": W}, "status": {"currentState": "running"}},
    ]
    replicas = [
        {"spec": {"volumeName": "pvc-1", "nodeID": W, "healthyAt": T1, "lastHealthyAt": T1}},
        {"spec": {"volumeName": "pvc-1", "nodeID": "srv", "healthyAt": T1, "lastHealthyAt": T1}},
        {"spec": {"volumeName": "pvc-2", "nodeID": "srv", "healthyAt": T1, "lastHealthyAt": T1}},
        {"spec": {"volumeName": "pvc-3", "nodeID": "srv", "healthyAt": T1, "lastHealthyAt": T1}},
    ]
    fenced = {W: "its node is fenced"}
    copies = copies_by_volume(replicas, fenced, unheard_engines(engines, fenced))
    mine, srv = copies["pvc-1"]
    assert mine.engine_unheard_on is None and srv.engine_unheard_on == W and not srv.current
    assert copies["pvc-2"][0].current
    assert copies["pvc-3"][0].engine_unheard_on == W and not copies["pvc-3"][0].current
    vol = VolumeCopies("pvc-1", "default/data", copies["pvc-1"])
    assert vol.verdict(W) is Verdict.STALE
    assert f"srv (may be older: the volume's engine on {W} reads unknown to Longhorn" in vol.line()
    assert vol.verdict(W, worker_back=True) is Verdict.MOVES
    assert current_now(vol, W) is Verdict.STALE


def test_the_stop_record_keeps_an_unheard_engine_after_the_volume_detached() -> None:
    """Once the fence's taint detaches the volume, Longhorn reads its engine stopped, no longer
    unknown; the stop record keeps the mark, so `workload start` and `start_stopped` still ask
    for consent."""
    vol = volume(failed(W, T3), unheard("srv"))
    owner = Owner("Deployment", "default", "db")
    patch = stop_patch(owner, {"spec": {"replicas": 1}}, W, Verdict.STALE, [vol])
    record = json.loads(patch["metadata"]["annotations"][STOPPED_ANNOTATION])
    assert record["engine_unknown_on"] == {"pvc-1": W}
    detached = {"pvc-1": (failed(W, T3), current("srv"))}  # the engine stopped: srv reads current again
    (again,) = recorded_volumes(record, detached)
    assert again.verdict(W) is Verdict.STALE and current_now(again, W) is Verdict.STALE
    assert again.verdict(W, worker_back=True) is Verdict.MOVES


def test_a_workload_let_go_is_stopped_when_its_copy_failed_before_the_taint() -> None:
    """The copies are read again right before the taint (`recheck`): a workload `decide` let go on
    a current copy that failed since is stopped, with its record, before anything lets its pods
    go. ClusterReads stands in for the API server (see its docstring)."""
    ready = {"metadata": {"name": "srv"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    replicas = [
        {"spec": {"volumeName": "pvc-1", "nodeID": W, "healthyAt": T1, "failedAt": T2, "lastFailedAt": T2}},
        {"spec": {"volumeName": "pvc-1", "nodeID": "srv", "healthyAt": T1, "lastHealthyAt": T1}},
    ]
    claim = {"metadata": {"namespace": "default", "name": "data"}, "spec": {"volumeName": "pv-1"}}
    pv = {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": "driver.longhorn.io", "volumeHandle": "pvc-1"}}}
    owner = [{"kind": "StatefulSet", "name": "db", "controller": True}]
    pod: dict[str, Any] = {
        "metadata": {"namespace": "default", "name": "db-0", "ownerReferences": owner},
        "spec": {"nodeName": W, "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
    }
    kinds = ",".join(sorted({"deployment", "statefulset", "replicaset", "job", "cronjob"}))
    api = ClusterReads(
        {
            "nodes": [ready],
            "replicas.longhorn.io": replicas,
            "engines.longhorn.io": [],
            "pvc": [claim],
            "pv": [pv],
            "statefulset": [],
            kinds: [],
        }
    )
    lines: list[str] = []
    decision = WorkloadDecision(cast(ClusterApi, api), W, lines.append, accept_stale_data=False)
    report = asyncio.run(decision.decide([pod]))
    assert "StatefulSet default/db" in report.moving
    assert not [p for p in api.patches if p[0] == "statefulset"], api.patches
    replicas[1]["spec"].update(failedAt=T3, lastFailedAt=T3)  # the server's copy fails meanwhile
    report = asyncio.run(decision.recheck())
    assert "StatefulSet default/db" not in report.moving
    assert "StatefulSet default/db judged again before the taint: stale now" in lines, lines
    stop = next(p for p in api.patches if p[0] == "statefulset")
    assert "'spec': {'replicas': 0}" in stop[3] and STOPPED_ANNOTATION in stop[3], stop
    # Held before its stop, as `decide` holds what it stops: the policy applied, its entry written.
    hold_at = next(i for i, p in enumerate(api.patches) if p[0] == "configmap")
    assert api.applied and hold_at < api.patches.index(stop), api.patches
    assert "statefulsets.default.db" in api.patches[hold_at][3], api.patches[hold_at]
