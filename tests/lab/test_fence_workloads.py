"""The fence's decision per workload with Longhorn volumes, through the real Pulumi engine, the
real kube-controller-manager (its taint eviction, pod garbage collector, Deployment, ReplicaSet
and Job controllers, attach-detach controller) and the lab's Longhorn manager stand-in
(lab/longhorn_standin/manager.py: replicas placed by node tags, failed with `failedAt` and
`lastFailedAt` when their node goes NotReady while the volume's engine runs on a node that is up,
left as they are while that engine reads `unknown` (its node down), rebuilt only from a healthy
copy of an attached volume, as Longhorn's manager does).

One cluster for the module (the tests run in order): a server and two workers, Longhorn's stand-in
installed. The volumes are made as Longhorn's CSI provisioner makes them (a Longhorn Volume, a
PersistentVolume of driver.longhorn.io whose handle is the volume, a claim bound to it) and
attached where their pods are scheduled (spec.nodeID, as Longhorn's attachment controller does).
The workers run no container runtime, so the pods are scheduled (spec.nodeName) but never start:
what the fence decides rests on where pods are scheduled and on the copies, not on running
containers.

- `cur` keeps copies on fw-w1 and the server; `old` on fw-w1 and fw-w2; `only` one copy on fw-w1.
  The workloads using them are scheduled to fw-w1: Deployments cur-app, old-app (2 replicas),
  only-app, a Job only-job, and a pod with no owner (bare).
- fw-w2 goes down, then fw-w1 while fw-w2 is still down (so `old`'s copy on fw-w2 misses
  fw-w1's last writes), then fw-w2 comes back.
- The fence of fw-w1 is SIGKILLed right after its first stop, then resumed: cur-app stays
  stopped although the server's copy reads healthy (the volumes' engine ran on fw-w1 and reads
  `unknown`: Longhorn has heard nothing from it since, so that copy may be older), only-app and
  only-job stay stopped until fw-w1 rejoins, old-app stays stopped, its copies listed with their
  timestamps; the bare pod gets a warning; each stopped owner's record keeps its former size
  across the kill.
- `workload start`: stale-app (on `old` too) is refused without consent, naming the volume, its
  copies and `--accept-stale-data`, and started with it; only-app is refused even with consent.
- accept_stale_data: old-app and cur-app start (on fw-w2); only-app stays stopped.
- The fence lifted: fw-w1 back Ready, only-app and only-job started again.

Then, on the same cluster (the workloads above removed), one fence of fw-w1 shows two rules:

- A current copy is one healthy now on a node that is Ready and not fenced: `pair` keeps copies on
  fw-w1 and fw-w2; both go down together, and Longhorn's manager has not marked fw-w2's copy failed
  nor the engine on fw-w1 unknown (the stand-in is paused: the manager that owns the volume ran on
  fw-w1). Longhorn's fields still call that copy current; the fence does not, and pair-app stays
  stopped as on copies that may be older, fw-w2's named NotReady.
- The copies are read again right before the taint: late-app uses `late`, whose one copy on the
  server is current when the fence judges (the volume never attached to fw-w1, so Longhorn hears
  it); the fence run is paused after its last stop and that copy fails meanwhile: late-app is
  stopped before the taint, judged again.
- Owners are walked to the top: a Job of the CronJob `nightly` whose pod uses `cronv` (its only
  copy on fw-w1) is suspended, and so is the CronJob, each with a record; the lift resumes both. A
  Deployment owned by a custom resource (`App default/db`, whose controller would scale it back)
  using `opv` (its only copy on fw-w1) is not scaled; it is named in the fence's report and in
  `status(check_hosts=True)`.
  Before the lift, `workload start` refuses pair-app without consent although fw-w2 is Ready again
  and its copy reads healthy (pair's engine ran on fw-w1, which the fence's record keeps), starts
  it with consent, and refuses op-db (no fence stopped it) and the CronJob (its only copy on fw-w1).

Last, fw-w1 is fenced again with the kube-controller-manager paused through the taint, so
Kubernetes deletes none of its pods and detaches nothing: the fence deletes no pod itself and waits
until Kubernetes, resumed, deletes them. Then a third worker joins, and its join names the
volume whose only copy sits on fw-w1. Last, fw-w1 is given up: the run names what its fence keeps
stopped with `workload start`, which refuses it (the only copy went with fw-w1).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    CliRun,
    LabStack,
    _descendants,
    base_config,
    run_cli,
    server_spec,
    skip_without_kubernetes_provider,
    up_or_fail,
    wait_until,
    worker_spec,
)
from node_operations.fence_workloads import NODE_STOPPED_ANNOTATION, STOPPED_ANNOTATION
from node_operations.volume_copies import NODE_UNHELD_ANNOTATION

pytestmark = pytest.mark.lab

K3S = "/usr/local/bin/k3s"
MIB = 1 << 20
# The lab's disks are this machine's; shares low enough that the test's copies fit.
STORAGE = {
    "install_longhorn": True,
    "longhorn_chart": str(LONGHORN_STANDIN_CHART),
    "reserved_percent": 5,
    "minimal_available_percent": 5,
}
LABEL = "fence-test/place"
# Which Longhorn node tags each volume's copies follow (its nodeSelector), and how many it keeps.
VOLUMES = {"cur": (2, "t-cur"), "old": (2, "t-old"), "only": (1, "t-only")}
# The volumes of the later tests: `pair` on both workers, `cronv` and `opv` only on fw-w1.
# `late`: one copy on the server, never attached (its pod's attachment to fw-w1 fails: the plain
# workers run no CSI node plugin), so Longhorn hears every copy of it.
LATER_VOLUMES = {"pair": (2, "t-pair"), "cronv": (1, "t-only"), "opv": (1, "t-only"), "late": (1, "t-late")}
APP_GROUP = "example.hk3s.dev"


def kubectl(server: Host, *args: str) -> str:
    return server.run([K3S, "kubectl", *args], timeout=60).stdout


def get(server: Host, *args: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(server, "get", *args, "-o", "json"))
    return found


def apply(server: Host, name: str, objects: list[dict[str, Any]]) -> None:
    (server.root / f"root/{name}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    kubectl(server, "apply", "-f", f"/root/{name}.json")


def replicas(server: Host, volume: str) -> list[dict[str, Any]]:
    items = get(server, "replicas.longhorn.io", "-n", "longhorn-system")["items"]
    return [r["spec"] for r in items if r["spec"]["volumeName"] == volume]


def longhorn_objects(volume: str, pods_node: str) -> list[dict[str, Any]]:
    """A Longhorn volume with its PersistentVolume and bound claim, as the CSI provisioner makes them."""
    count, tag = {**VOLUMES, **LATER_VOLUMES}[volume]
    meta = {"name": volume, "namespace": "longhorn-system"}
    return [
        {
            "apiVersion": "longhorn.io/v1beta2",
            "kind": "Volume",
            "metadata": meta,
            "spec": {"numberOfReplicas": count, "size": str(64 * MIB), "nodeSelector": [tag], "nodeID": pods_node},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pv-{volume}"},
            "spec": {
                "capacity": {"storage": "64Mi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "claimRef": {"namespace": "default", "name": volume},
                "csi": {"driver": "driver.longhorn.io", "volumeHandle": volume, "fsType": "ext4"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": volume, "namespace": "default"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": f"pv-{volume}",
                "resources": {"requests": {"storage": "64Mi"}},
            },
        },
    ]


def pod_spec(claim: str, restart: str = "Always") -> dict[str, Any]:
    return {
        "nodeSelector": {LABEL: "yes"},
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "3600"]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    }


def workloads() -> list[dict[str, Any]]:
    def deployment(name: str, claim: str, count: int = 1) -> dict[str, Any]:
        labels = {"app": name}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "replicas": count,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec(claim)},
            },
        }

    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "only-job", "namespace": "default"},
        "spec": {"backoffLimit": 6, "template": {"spec": pod_spec("only", "Never")}},
    }
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": "default"}}
    bare["spec"] = pod_spec("cur")
    return [
        deployment("cur-app", "cur"),
        deployment("old-app", "old", 2),
        deployment("stale-app", "old"),
        deployment("only-app", "only"),
        job,
        bare,
    ]


def engine_state(server: Host, volume: str) -> str:
    """The state Longhorn reads for the volume's engine ("" when it has none)."""
    items = get(server, "engines.longhorn.io", "-n", "longhorn-system")["items"]
    return next(
        (str(e.get("status", {}).get("currentState") or "") for e in items if e["spec"]["volumeName"] == volume), ""
    )


def attached_to(server: Host, node: str) -> set[str]:
    """The persistent volumes with a VolumeAttachment to `node`."""
    items = get(server, "volumeattachments")["items"]
    return {a["spec"]["source"].get("persistentVolumeName", "") for a in items if a["spec"]["nodeName"] == node}


@dataclass
class Cluster:
    lab: Lab
    stack: LabStack
    server: Host
    w1: Host
    w2: Host
    config: dict[str, Any]
    fence_text: str = ""  # the output of the later tests' fence run

    def diagnose(self) -> str:
        kinds = "pods,deployments,jobs,volumeattachments,nodes"
        longhorn = kubectl(self.server, "get", "volumes.longhorn.io,replicas.longhorn.io", "-A", "-o", "wide")
        return kubectl(self.server, "get", kinds, "-o", "wide") + longhorn + self.stack.text()[-4000:]

    def write_fences(self, fences: dict[str, dict[str, bool]]) -> None:
        self.config["fences"] = fences
        self.stack.write_config(self.config)

    def pods_of(self, app: str) -> list[dict[str, Any]]:
        selector = f"job-name={app}" if app.endswith("-job") else f"app={app}"
        return [
            p for p in get(self.server, "pods", "-l", selector)["items"] if not p["metadata"].get("deletionTimestamp")
        ]

    def scheduled(self, app: str) -> list[str]:
        return sorted(p["spec"].get("nodeName") or "" for p in self.pods_of(app))

    def ready(self, host: Host) -> str:
        found = get(self.server, "node", host.name)
        return str(next(c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready"))

    def hk3s(self, *args: str) -> CliRun:
        """`scripts/hk3s --stack lab ARGS`, as an operator runs it; it must succeed."""
        run = self.stack.hk3s(*args, timeout=300)
        assert run.returncode == 0, (args, run.stdout[-3000:], run.stderr[-3000:])
        return run

    def down(self, host: Host) -> None:
        host.run(["systemctl", "stop", "k3s-agent"])
        wait_until(f"{host.name} NotReady", lambda: self.ready(host) != "True", 90, self.diagnose)


def tag_longhorn_node(server: Host, name: str, extra: list[str]) -> None:
    node = get(server, "nodes.longhorn.io", name, "-n", "longhorn-system")
    body = {"spec": {"allowScheduling": True, "tags": sorted({*(node["spec"].get("tags") or []), *extra})}}
    kubectl(
        server, "patch", "nodes.longhorn.io", name, "-n", "longhorn-system", "--type", "merge", "-p", json.dumps(body)
    )


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_kubernetes_provider()
    server = lab.add_host(server_spec("fw-srv"))
    w1, w2 = lab.add_host(worker_spec("fw-w1")), lab.add_host(worker_spec("fw-w2"))
    lab.wait_ssh_ready([server, w1, w2])
    stack = LabStack(tmp_path_factory.mktemp("fence-workloads"))
    config = base_config(lab, server, [w1, w2], storage=STORAGE)
    stack.write_config(config)
    up_or_fail(stack)
    cluster = Cluster(lab, stack, server, w1, w2, config)
    names = {server.name, w1.name, w2.name}
    wait_until(
        "a Longhorn node per node",
        lambda: (
            {n["metadata"]["name"] for n in get(server, "nodes.longhorn.io", "-n", "longhorn-system")["items"]} == names
        ),
        120,
        cluster.diagnose,
    )
    tags = {server.name: ["t-cur"], w1.name: ["t-cur", "t-old", "t-only"], w2.name: ["t-old"]}
    for name, extra in tags.items():
        tag_longhorn_node(server, name, extra)
    apply(server, "volumes", [obj for volume in VOLUMES for obj in longhorn_objects(volume, w1.name)])
    for volume, (count, _tag) in VOLUMES.items():
        wait_until(
            f"{count} healthy copies of {volume}",
            lambda v=volume, c=count: len([r for r in replicas(server, v) if r.get("healthyAt")]) == c,  # type: ignore[misc]
            90,
            cluster.diagnose,
        )
    kubectl(server, "label", "node", w1.name, f"{LABEL}=yes")
    apply(server, "workloads", workloads())
    wait_until(
        "every workload's pods scheduled to fw-w1",
        lambda: (
            all(
                cluster.scheduled(app) == [w1.name] * count
                for app, count in (("cur-app", 1), ("old-app", 2), ("stale-app", 1), ("only-app", 1), ("only-job", 1))
            )
            and get(server, "pod", "bare")["spec"].get("nodeName") == w1.name
        ),
        120,
        cluster.diagnose,
    )
    # The attach-detach controller attaches each claim's volume to the node its pods are on.
    wait_until(
        "VolumeAttachments of the three volumes to fw-w1",
        lambda: {f"pv-{v}" for v in VOLUMES} <= attached_to(server, w1.name),
        120,
        cluster.diagnose,
    )
    yield cluster


def test_a_fence_keeps_stopped_what_has_no_current_copy_elsewhere(cluster: Cluster) -> None:
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    # fw-w2 goes down first: `old`'s copy there fails; then fw-w1, while fw-w2 is still down, so
    # that copy cannot be rebuilt before fw-w1 went (and stays behind its last writes).
    cluster.down(w2)
    wait_until(
        "old's copy on fw-w2 failed",
        lambda: any(r["nodeID"] == w2.name and r.get("failedAt") for r in replicas(server, "old")),
        60,
        cluster.diagnose,
    )
    cluster.down(w1)
    # Their engine ran on fw-w1: Longhorn reads it unknown and changes none of their copies.
    wait_until(
        "the three volumes' engines on fw-w1 unknown",
        lambda: {v: engine_state(server, v) for v in VOLUMES} == dict.fromkeys(VOLUMES, "unknown"),
        60,
        cluster.diagnose,
    )
    assert not any(r.get("failedAt") for v in ("cur", "only") for r in replicas(server, v)), cluster.diagnose()
    w2.run(["systemctl", "start", "--no-block", "k3s-agent"])  # Restart=always retries a failed start
    wait_until("fw-w2 Ready again", lambda: cluster.ready(w2) == "True", 90, cluster.diagnose)
    kubectl(server, "label", "node", w2.name, f"{LABEL}=yes")  # the workloads may run there too
    old_w2 = next(r for r in replicas(server, "old") if r["nodeID"] == w2.name)
    assert old_w2.get("failedAt"), old_w2  # not rebuilt: no healthy copy to rebuild from
    down_since = time.monotonic()
    # While fw-w1 is NotReady and not fenced, `status` names what waits on it, where a current
    # copy of its data is (healthy now on a node Ready and not fenced), and the command to run.
    status = cluster.hk3s("status").stdout
    assert f"{w1.name} is NotReady and not fenced" in status, status
    assert f"fence it: scripts/hk3s node fence {w1.name}" in status, status
    cur_line = next(line for line in status.splitlines() if "Deployment default/cur-app (pods" in line)
    # The server's copy reads healthy, but the engine that wrote it last is not heard: not current.
    assert cur_line.endswith(f"on {w1.name} [stale]: volume cur (claim default/cur): current copy on no other node")
    # old's copy on fw-w2 failed before fw-w1's: no current copy anywhere (fw-w1's is not one: NotReady).
    assert f"on {w1.name} [stale]: volume old (claim default/old): current copy on no other node" in status, status
    assert "Deployment default/only-app (pods" in status and "Job default/only-job (pods" in status, status
    assert f"on {w1.name} [only-copy]: volume only (claim default/only): current copy on no other node" in status
    assert f"pod default/bare (pods default/bare) on {w1.name} [unjudged]" in status, status
    states = {n.name: n.state for n in cluster.stack.api().nodes()}
    assert states[w1.name] == "NotReady" and states[w2.name] == "Ready", states
    time.sleep(max(0.0, 62 - (time.monotonic() - down_since)))  # fw-w1 down for the minute a fence asks for

    # The run is killed right after its first stop; the next up resumes.
    cluster.write_fences({w1.name: {}})
    run = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"], kill_when="scaled to 0:", crash=True)
    assert run.killed, run.output[-4000:]
    # The operator API's up clears what the killed run left (its lock, its pending operations,
    # refreshed through the API forward) and resumes.
    lines: list[str] = []
    cluster.stack.api().up(on_output=lines.append)
    text = "\n".join(lines)
    assert "pending operation(s) of an interrupted run" in text, text[-4000:]
    print("\n".join(line for line in text.splitlines() if f"[{w1.name}]" in line))

    # The server's copy of cur reads healthy, but the volume's engine on fw-w1 is not heard: it may be
    # older than what fw-w1 wrote, so cur-app stays stopped as on a stale copy.
    assert "Deployment default/cur-app may start elsewhere" not in text, text[-4000:]
    assert "Deployment default/cur-app stays stopped: no other node holds a current copy" in text, text[-4000:]
    assert f"{server.name} (may be older: the volume's engine on {w1.name} reads unknown to Longhorn" in text
    # The only copy on fw-w1: stopped until it rejoins, the records keeping the former sizes.
    assert f"Deployment default/only-app stays stopped until {w1.name} rejoins: the only copy of only" in text, text[
        -4000:
    ]
    assert f"Job default/only-job stays stopped until {w1.name} rejoins" in text, text[-4000:]
    only_app = get(server, "deployment", "only-app")
    assert only_app["spec"]["replicas"] == 0
    assert json.loads(only_app["metadata"]["annotations"][STOPPED_ANNOTATION])["replicas"] == 1
    job = get(server, "job", "only-job")
    assert job["spec"]["suspend"] is True
    assert json.loads(job["metadata"]["annotations"][STOPPED_ANNOTATION])["suspend"] is False
    # Stale copies: old-app stays stopped, every copy listed with its timestamps.
    old_app = get(server, "deployment", "old-app")
    assert old_app["spec"]["replicas"] == 0
    assert json.loads(old_app["metadata"]["annotations"][STOPPED_ANNOTATION])["replicas"] == 2
    assert "Deployment default/old-app stays stopped: no other node holds a current copy" in text, text[-4000:]
    for copy in replicas(server, "old"):
        if copy["nodeID"] == w1.name:
            # Judged while its engine was unknown (the volume still attached there, before the
            # taint): Longhorn changed nothing of it, so it read unfailed then. Once the volume
            # detaches after the taint, a copy on a node that is down fails, so what it reads now
            # is later than what the fence judged.
            line = f"{w1.name} (not current: its node is fenced (hk3s.dev/fenced-at); lastHealthyAt {copy['lastHealthyAt']}"
        else:
            line = (
                f"{copy['nodeID']} (failed; lastHealthyAt {copy['lastHealthyAt']}, lastFailedAt {copy['lastFailedAt']})"
            )
        assert line in text, (line, text[-4000:])
    assert f"hk3s:fences.{w1.name}.accept_stale_data: true" in text
    # The pod the program cannot judge is named.
    assert "warning: pod default/bare uses Longhorn volume(s) cur" in text, text[-4000:]
    # Where each workload runs now leaves out the ones kept stopped (said above, with why).
    assert "ReplicaSet default/cur-app-" not in text and "ReplicaSet default/old-app-" not in text, text[-4000:]
    # Nothing of them is left on fw-w1, and none of the stopped ones runs anywhere.
    for app in ("cur-app", "only-app", "old-app", "stale-app", "only-job"):
        assert cluster.scheduled(app) == [], (app, cluster.diagnose())
    summary = json.loads(get(server, "node", w1.name)["metadata"]["annotations"][NODE_STOPPED_ANNOTATION])
    assert summary == {
        "Deployment default/cur-app": "stale",
        "Deployment default/old-app": "stale",
        "Deployment default/only-app": "only-copy",
        "Deployment default/stale-app": "stale",
        "Job default/only-job": "only-copy",
    }
    # Kubernetes detached their volumes from the fenced worker.
    wait_until(f"no VolumeAttachment to {w1.name}", lambda: not attached_to(server, w1.name), 120, cluster.diagnose)
    # Fenced, fw-w1 reads OutOfService from the cluster everywhere its state is shown, never the
    # last join's "ready"; and it is no longer a worker waiting for a decision.
    status_json = json.loads(cluster.hk3s("status", "--json").stdout)
    assert {n["name"]: n["state"] for n in status_json["nodes"]}[w1.name] == "OutOfService", status_json["nodes"]
    assert status_json["down_workers"] == [] and status_json["live_error"] is None, status_json
    listed = json.loads(cluster.hk3s("node", "list", "--json").stdout)
    assert {n["name"]: n["state"] for n in listed}[w1.name] == "OutOfService", listed
    api = cluster.stack.api()
    assert {n.name: n.state for n in api.nodes()}[w1.name] == "OutOfService"
    assert {n.name: n.state for n in api.nodes(live=False)}[w1.name] == "OutOfService"  # the fence is recorded


def test_workload_start_refuses_without_a_current_copy_and_starts_with_consent(cluster: Cluster) -> None:
    """`workload start` judges one stopped workload as the fence does: with copies elsewhere that
    may be older it refuses, naming the volume, its copies and `--accept-stale-data`, and changes
    nothing; with that consent it starts it at its former size and drops its record; an only copy
    on the fenced worker is refused even with consent."""
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    before = get(server, "deployment", "stale-app")
    refused = cluster.stack.hk3s("workload", "start", "default/Deployment/stale-app")
    assert refused.returncode == 3, refused.stderr[-4000:]
    said = " ".join(refused.stderr.split())
    assert "Deployment default/stale-app is not started: no node that is Ready and not fenced holds a current" in said
    assert "volume old (claim default/old): copies on" in said and f"{w2.name} (failed; lastHealthyAt" in said, said
    assert "scripts/hk3s workload start default/Deployment/stale-app --accept-stale-data" in said, said
    after = get(server, "deployment", "stale-app")
    assert after["spec"]["replicas"] == 0
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]

    only = cluster.stack.hk3s("workload", "start", "default/Deployment/only-app", "--accept-stale-data", "--yes")
    assert only.returncode == 3, only.stderr[-4000:]
    assert f"no node but {w1.name} ever held a copy of only" in " ".join(only.stderr.split()), only.stderr[-4000:]
    assert get(server, "deployment", "only-app")["spec"]["replicas"] == 0

    lines: list[str] = []
    started = cluster.stack.api().start_workload(
        "default/Deployment/stale-app", accept_stale_data=True, on_output=lines.append
    )
    assert "Deployment default/stale-app started again (replicas: 1)" in started, started
    assert "stale copies accepted" in started, started
    stale_app = get(server, "deployment", "stale-app")
    assert stale_app["spec"]["replicas"] == 1
    assert STOPPED_ANNOTATION not in (stale_app["metadata"].get("annotations") or {})
    summary = json.loads(get(server, "node", w1.name)["metadata"]["annotations"][NODE_STOPPED_ANNOTATION])
    assert "Deployment default/stale-app" not in summary and "Deployment default/old-app" in summary, summary
    wait_until(
        "stale-app scheduled to fw-w2", lambda: cluster.scheduled("stale-app") == [w2.name], 120, cluster.diagnose
    )


def test_accepting_stale_data_starts_the_workload_from_the_older_copies(cluster: Cluster) -> None:
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    cluster.write_fences({w1.name: {"accept_stale_data": True}})
    cluster.stack.log.clear()
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    assert "Deployment default/old-app started again" in text and "stale copies accepted" in text, text[-4000:]
    old_app = get(server, "deployment", "old-app")
    assert old_app["spec"]["replicas"] == 2 and STOPPED_ANNOTATION not in old_app["metadata"].get("annotations", {})
    wait_until(
        "old-app scheduled to fw-w2", lambda: cluster.scheduled("old-app") == [w2.name] * 2, 120, cluster.diagnose
    )
    assert "Deployment default/cur-app started again" in text, text[-4000:]
    wait_until("cur-app scheduled to fw-w2", lambda: cluster.scheduled("cur-app") == [w2.name], 120, cluster.diagnose)
    # The only copy stays where it is: no consent starts it.
    assert get(server, "deployment", "only-app")["spec"]["replicas"] == 0
    assert f"Deployment default/only-app stays stopped until {w1.name} rejoins" in text, text[-4000:]


def test_lifting_the_fence_starts_what_it_stopped(cluster: Cluster) -> None:
    server, w1 = cluster.server, cluster.w1
    cluster.write_fences({})
    cluster.stack.log.clear()
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    assert f"[{w1.name}] fence lifted: rejoined" in text, text[-4000:]
    assert cluster.ready(w1) == "True"
    assert "Deployment default/only-app started again" in text and "Job default/only-job started again" in text
    only_app = get(server, "deployment", "only-app")
    assert only_app["spec"]["replicas"] == 1 and STOPPED_ANNOTATION not in only_app["metadata"].get("annotations", {})
    assert get(server, "job", "only-job")["spec"]["suspend"] is False
    annotations = get(server, "node", w1.name)["metadata"].get("annotations") or {}
    assert NODE_STOPPED_ANNOTATION not in annotations
    wait_until("only-app scheduled", lambda: len(cluster.scheduled("only-app")) == 1, 120, cluster.diagnose)


def pinned_spec(claim: str, node: str, restart: str = "Always") -> dict[str, Any]:
    """A pod spec that runs on `node` only (the later tests' workloads start on fw-w1)."""
    spec = pod_spec(claim, restart)
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return spec


def app_crd() -> dict[str, Any]:
    """A custom resource kind standing for an operator's: the fence cannot stop what it controls."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"apps.{APP_GROUP}"},
        "spec": {
            "group": APP_GROUP,
            "scope": "Namespaced",
            "names": {"kind": "App", "plural": "apps", "singular": "app"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
        },
    }


def controller_ref(api_version: str, kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def pulumi_processes() -> list[int]:
    """The Pulumi CLI this test process runs (through the Automation API) and every process below
    it (its language host, its provider processes), parents first. The lab's hosts are this
    process's children too, and are left out."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().split("(", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            continue
        if int(rest.split()[1]) == os.getpid() and name == "pulumi":
            children.append(int(stat.parent.name))
    return [found for pid in children for found in (pid, *_descendants(pid))]


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """SIGSTOP `pids` for the block, SIGCONT them after (children last stopped, first resumed)."""
    assert pids, "no Pulumi process to pause"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def pause_longhorn_manager(cluster: Cluster, sig: signal.Signals) -> None:
    """SIGSTOP or SIGCONT the Longhorn manager stand-in (its pid as lab/stack_harness.py records it)."""
    pid = int((cluster.lab.run_dir / "longhorn-manager" / "manager.pid").read_text())
    os.kill(pid, sig)


def test_a_copy_on_a_node_that_is_down_is_not_current(cluster: Cluster) -> None:
    """A copy on a node that is NotReady is not current, though Longhorn's fields still say healthy:
    the workload whose other copy sits there stays stopped as on a copy that may be older (this
    fence also serves the next test)."""
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    # The earlier tests' workloads go (their pods forced away: the workers run no kubelet that
    # would finish a graceful deletion).
    kubectl(server, "delete", "deployment", "cur-app", "old-app", "stale-app", "only-app", "--wait=false")
    kubectl(server, "delete", "job", "only-job", "--wait=false")
    wait_until(
        "the earlier workloads' ReplicaSets gone (none makes a pod again)",
        lambda: not get(server, "replicasets", "-n", "default")["items"],
        60,
        cluster.diagnose,
    )
    kubectl(server, "delete", "pods", "--all", "-n", "default", "--force", "--grace-period=0", "--wait=false")
    wait_until(
        "no pod left in default", lambda: not get(server, "pods", "-n", "default")["items"], 60, cluster.diagnose
    )
    tag_longhorn_node(server, w1.name, ["t-pair"])
    tag_longhorn_node(server, w2.name, ["t-pair"])
    tag_longhorn_node(server, server.name, ["t-late"])
    objects = [obj for v in LATER_VOLUMES for obj in longhorn_objects(v, "" if v == "late" else w1.name)]
    apply(server, "later-volumes", objects)
    for volume, (count, _tag) in LATER_VOLUMES.items():
        wait_until(
            f"{count} healthy copies of {volume}",
            lambda v=volume, c=count: len([r for r in replicas(server, v) if r.get("healthyAt")]) == c,  # type: ignore[misc]
            90,
            cluster.diagnose,
        )
    assert sorted(r["nodeID"] for r in replicas(server, "pair")) == sorted([w1.name, w2.name])
    apply(server, "app-crd", [app_crd()])
    kubectl(server, "wait", "--for=condition=Established", f"crd/apps.{APP_GROUP}", "--timeout=60s")
    apply(
        server,
        "app",
        [{"apiVersion": f"{APP_GROUP}/v1", "kind": "App", "metadata": {"name": "db", "namespace": "default"}}],
    )
    app_uid = get(server, f"apps.{APP_GROUP}", "db")["metadata"]["uid"]
    template = {"spec": pinned_spec("cronv", w1.name, "Never")}
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "default"},
        # Once a year: the test's Job is the one it made now (made by hand below, as
        # `kubectl create job --from=cronjob/nightly` makes one, owned by the CronJob).
        "spec": {"schedule": "0 3 1 1 *", "jobTemplate": {"spec": {"backoffLimit": 6, "template": template}}},
    }
    apply(server, "cronjob", [cronjob])
    cron_uid = get(server, "cronjob", "nightly")["metadata"]["uid"]

    def deployment(name: str, claim: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
        labels = {"app": name}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", "ownerReferences": owners},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pinned_spec(claim, w1.name)},
            },
        }

    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-job",
            "namespace": "default",
            "ownerReferences": controller_ref("batch/v1", "CronJob", "nightly", cron_uid),
        },
        "spec": {"backoffLimit": 6, "template": template},
    }
    operated = deployment("op-db", "opv", controller_ref(f"{APP_GROUP}/v1", "App", "db", app_uid))
    late = deployment("late-app", "late", [])
    apply(server, "later-workloads", [deployment("pair-app", "pair", []), operated, job, late])
    wait_until(
        "pair-app, op-db, nightly-job and late-app scheduled to fw-w1",
        lambda: all(cluster.scheduled(app) == [w1.name] for app in ("pair-app", "op-db", "nightly-job", "late-app")),
        120,
        cluster.diagnose,
    )

    # Both workers go down together, and Longhorn's manager has not marked fw-w2's copy failed yet.
    pause_longhorn_manager(cluster, signal.SIGSTOP)
    try:
        cluster.down(w2)
        cluster.down(w1)
        pair_w2 = next(r for r in replicas(server, "pair") if r["nodeID"] == w2.name)
        assert pair_w2.get("healthyAt") and not pair_w2.get("failedAt"), pair_w2  # current by Longhorn's fields
        time.sleep(62)  # fw-w1 down for the minute a fence asks for
        cluster.write_fences({w1.name: {}})
        # The fence judges every workload from one reading of the copies: late-app is let go, as
        # `late`'s copy on the server is current then. The run is paused at pair-app's stop, after
        # that reading and before the taint, and the copy fails meanwhile (as Longhorn's manager
        # marks one: the stand-in is paused, so the test writes what it would).
        outcome: list[str] = []
        fence = threading.Thread(target=lambda: outcome.append(cluster.stack.up_output()), daemon=True)
        fence.start()
        deadline = time.monotonic() + 300
        while "Deployment default/pair-app scaled to 0:" not in cluster.stack.text():
            assert fence.is_alive() and time.monotonic() < deadline, (outcome or [""])[0][-8000:]
            time.sleep(0.02)
        with paused(pulumi_processes()):
            taints = get(server, "node", w1.name)["spec"].get("taints") or []
            assert not [t for t in taints if t["key"] == "node.kubernetes.io/out-of-service"], "paused too late"
            (late_copy,) = [
                r
                for r in get(server, "replicas.longhorn.io", "-n", "longhorn-system")["items"]
                if r["spec"]["volumeName"] == "late"
            ]
            now = server.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"]).stdout.strip()
            body = json.dumps({"spec": {"failedAt": now, "lastFailedAt": now}})
            kubectl(
                server,
                "patch",
                "replicas.longhorn.io",
                late_copy["metadata"]["name"],
                "-n",
                "longhorn-system",
                "--type",
                "merge",
                "-p",
                body,
            )
        fence.join(timeout=300)
        assert outcome, "the fence did not end"
        if outcome[0]:
            pytest.fail(outcome[0][-8000:])
        cluster.fence_text = text = cluster.stack.text()
        print("\n".join(line for line in text.splitlines() if f"[{w1.name}]" in line))
    finally:
        # fw-w2 back before the manager runs again, so its copy of `pair` is current again after. Not
        # waited on here: under load a first start of the agent may fail, and the unit's
        # Restart=always starts it again; the wait for Ready below covers both.
        w2.run(["systemctl", "start", "--no-block", "k3s-agent"])
        wait_until("fw-w2 Ready again", lambda: cluster.ready(w2) == "True", 90, cluster.diagnose)
        pause_longhorn_manager(cluster, signal.SIGCONT)

    # fw-w2's copy does not count as current while fw-w2 is NotReady: pair-app stays stopped, as on
    # a copy that may be older, which names why.
    assert "Deployment default/pair-app may start elsewhere" not in text, text[-4000:]
    assert "Deployment default/pair-app stays stopped: no other node holds a current copy" in text, text[-4000:]
    assert f"{w2.name} (not current: its node is NotReady; lastHealthyAt" in text, text[-4000:]
    pair_app = get(server, "deployment", "pair-app")
    assert pair_app["spec"]["replicas"] == 0
    assert json.loads(pair_app["metadata"]["annotations"][STOPPED_ANNOTATION])["reason"] == "stale"
    # The copies are read again right before the taint: late-app, let go on a copy that failed
    # since, is stopped then, and says why; nothing of it was let go.
    assert "Deployment default/late-app judged again before the taint: stale now" in text, text[-4000:]
    assert "Deployment default/late-app may start elsewhere" not in text, text[-4000:]
    assert "Deployment default/late-app stays stopped: no other node holds a current copy" in text, text[-4000:]
    late_app = get(server, "deployment", "late-app")
    assert late_app["spec"]["replicas"] == 0
    assert json.loads(late_app["metadata"]["annotations"][STOPPED_ANNOTATION])["reason"] == "stale"
    assert cluster.scheduled("late-app") == [], cluster.diagnose()
    kubectl(server, "delete", "deployment", "late-app", "--wait=false")  # not part of the tests after


def test_workload_start_asks_consent_while_the_engine_that_wrote_last_is_unheard(cluster: Cluster) -> None:
    """pair-app was stopped while its other copy's node was down; that node is Ready again and its
    copy reads healthy, but pair's engine ran on fw-w1, which Longhorn has not heard since (the
    fence's record keeps it, as the volume is detached now): `workload start` asks for consent and
    starts it with it. A workload no fence stopped, and one whose only copy is on the fenced
    worker, are refused, changing nothing."""
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    assert cluster.fence_text, "the fence of the test before did not run"
    refused_pair = cluster.stack.hk3s("workload", "start", "default/Deployment/pair-app")
    assert refused_pair.returncode == 3, refused_pair.stderr[-4000:]
    said_pair = " ".join(refused_pair.stderr.split())
    assert f"{w2.name} (may be older: the volume's engine on {w1.name} reads unknown to Longhorn" in said_pair
    assert get(server, "deployment", "pair-app")["spec"]["replicas"] == 0
    run = cluster.stack.hk3s("workload", "start", "default/Deployment/pair-app", "--accept-stale-data", "--yes")
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Deployment default/pair-app started again (replicas: 1), stopped by the fence of" in run.stdout
    pair_app = get(server, "deployment", "pair-app")
    assert pair_app["spec"]["replicas"] == 1
    assert STOPPED_ANNOTATION not in (pair_app["metadata"].get("annotations") or {})
    summary = json.loads(get(server, "node", w1.name)["metadata"]["annotations"][NODE_STOPPED_ANNOTATION])
    assert "Deployment default/pair-app" not in summary and "CronJob default/nightly" in summary, summary

    for ref, said in (
        ("default/Deployment/op-db", "Deployment default/op-db was not stopped by a fence"),
        ("default/CronJob/nightly", f"no node but {w1.name} ever held a copy of cronv"),
    ):
        refused = cluster.stack.hk3s("workload", "start", ref)
        assert refused.returncode == 3 and said in " ".join(refused.stderr.split()), (ref, refused.stderr[-4000:])
    assert get(server, "cronjob", "nightly")["spec"]["suspend"] is True
    assert get(server, "deployment", "op-db")["spec"]["replicas"] == 1


def test_parents_of_stopped_workloads_are_held_stopped_or_named(cluster: Cluster) -> None:
    """A stopped workload's owners are walked to the top, on the fence of the test before: a CronJob is
    suspended with a record, a workload an operator's resource controls is named, not scaled."""
    server, w1 = cluster.server, cluster.w1
    text = cluster.fence_text
    assert text, "the fence of the test before did not run"
    # The Job and its CronJob are both suspended, each with a record, so no next Job starts
    # elsewhere on the copy that may be stale.
    for kind, name in (("cronjob", "nightly"), ("job", "nightly-job")):
        found = get(server, kind, name)
        assert found["spec"]["suspend"] is True, (kind, found["spec"])
        record = json.loads(found["metadata"]["annotations"][STOPPED_ANNOTATION])
        assert record["node"] == w1.name and record["suspend"] is False and record["reason"] == "only-copy"
    assert f"CronJob default/nightly stays stopped until {w1.name} rejoins" in text, text[-4000:]
    summary = json.loads(get(server, "node", w1.name)["metadata"]["annotations"][NODE_STOPPED_ANNOTATION])
    assert summary.get("CronJob default/nightly") == "only-copy", summary
    # The operator's Deployment is not scaled (its owner would scale it back): named instead.
    op_db = get(server, "deployment", "op-db")
    assert op_db["spec"]["replicas"] == 1 and STOPPED_ANNOTATION not in (op_db["metadata"].get("annotations") or {})
    line = next((x for x in text.splitlines() if "not held stopped: Deployment default/op-db" in x), "")
    assert "App default/db" in line and "which the fence cannot stop" in line, text[-4000:]
    warnings = cluster.stack.api().status(check_hosts=True).warnings
    assert any(
        f"{w1.name} is fenced, and its fence cannot hold this workload stopped: Deployment default/op-db" in w
        for w in warnings
    ), warnings

    # The lift resumes the CronJob and its Job by their records, and the fence names nothing more.
    cluster.write_fences({})
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    assert f"[{w1.name}] fence lifted: rejoined" in text, text[-4000:]
    assert "CronJob default/nightly started again" in text and "Job default/nightly-job started again" in text
    for kind, name in (("cronjob", "nightly"), ("job", "nightly-job")):
        found = get(server, kind, name)
        assert found["spec"]["suspend"] is False
        assert STOPPED_ANNOTATION not in (found["metadata"].get("annotations") or {})
    annotations = get(server, "node", w1.name)["metadata"].get("annotations") or {}
    assert NODE_STOPPED_ANNOTATION not in annotations and NODE_UNHELD_ANNOTATION not in annotations


def signal_controller_manager(server: Host, sig: str) -> None:
    """SIGSTOP or SIGCONT the server's kube-controller-manager (the stand-in k3s server's child, by
    its pid inside the server's container; it runs without leader election, so a pause loses
    nothing but time)."""
    pids = server.run(["pgrep", "-f", "/kube-controller-manager "]).stdout.split()
    assert len(pids) == 1, pids
    server.run(["kill", f"-{sig}", pids[0]])


def test_the_fence_deletes_no_pod_itself_and_waits_for_kubernetes(cluster: Cluster) -> None:
    """Past the taint, the fence leaves the worker's pods to Kubernetes and deletes none itself.
    The kube-controller-manager is paused through the taint, so nothing deletes release-app's and
    kept-app's pods, and their volumes' VolumeAttachments to fw-w1 stay: the state the real
    attach-detach controller leaves while a pod that is not terminated exists
    (pkg/controller/volume/attachdetach/util/util.go, DetermineVolumeAction: a pod's volumes stay
    in its desired state until the pod is terminated or gone). The fence waits; resumed, the
    controller-manager's taint eviction and pod garbage collector delete the pods, its
    attach-detach controller detaches their volumes, and the fence ends."""
    server, w1 = cluster.server, cluster.w1
    for kind in ("deployment", "job", "cronjob"):
        kubectl(server, "delete", kind, "--all", "-n", "default", "--wait=false")
    wait_until(
        "no ReplicaSet or Job left in default",
        lambda: not get(server, "replicasets,jobs", "-n", "default")["items"],
        60,
        cluster.diagnose,
    )
    kubectl(server, "delete", "pods", "--all", "-n", "default", "--force", "--grace-period=0", "--wait=false")
    wait_until(
        "no pod left in default", lambda: not get(server, "pods", "-n", "default")["items"], 60, cluster.diagnose
    )

    # `cur` keeps a copy on the server, which may be older (its engine on fw-w1 goes unheard):
    # release-app is stopped. `only` keeps its one copy on fw-w1: kept-app is stopped (the next test
    # gives fw-w1 up with it stopped).
    def app(name: str, claim: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": pinned_spec(claim, w1.name)},
            },
        }

    apply(server, "release-apps", [app("release-app", "cur"), app("kept-app", "only")])
    for name in ("release-app", "kept-app"):
        wait_until(
            f"{name} scheduled to fw-w1",
            lambda n=name: cluster.scheduled(n) == [w1.name],  # type: ignore[misc]
            120,
            cluster.diagnose,
        )
    wait_until(
        "pv-cur and pv-only attached to fw-w1",
        lambda: {"pv-cur", "pv-only"} <= attached_to(server, w1.name),
        120,
        cluster.diagnose,
    )
    pods = {name: cluster.pods_of(name)[0]["metadata"]["name"] for name in ("release-app", "kept-app")}

    cluster.down(w1)
    ready = next(c for c in get(server, "node", w1.name)["status"]["conditions"] if c["type"] == "Ready")
    since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()
    time.sleep(max(0.0, since + 62 - float(server.run(["date", "+%s"]).stdout)))
    cluster.write_fences({w1.name: {}})
    cluster.stack.log.clear()
    outcome: list[str] = []
    signal_controller_manager(server, "STOP")
    try:
        fence = threading.Thread(target=lambda: outcome.append(cluster.stack.up_output()), daemon=True)
        fence.start()
        wait_until(
            "the fence tainted fw-w1", lambda: "tainted node.kubernetes.io/out-of-service" in cluster.stack.text(), 240
        )
        time.sleep(20)  # the fence's wait goes round several times
        for name, pod in pods.items():
            assert [p["metadata"]["name"] for p in cluster.pods_of(name)] == [pod], cluster.diagnose()
        assert {"pv-cur", "pv-only"} <= attached_to(server, w1.name), cluster.diagnose()
        assert not outcome, outcome
    finally:
        signal_controller_manager(server, "CONT")
    fence.join(timeout=240)
    assert outcome == [""], outcome[0][-8000:] if outcome else "the fence did not end"
    text = cluster.stack.text()
    assert "deleted pod default/" not in text and "deleted by the fence" not in text, text[-4000:]
    for name in pods.values():
        assert not [p for p in get(server, "pods", "-n", "default")["items"] if p["metadata"]["name"] == name]
    wait_until(
        "pv-cur and pv-only detached from fw-w1",
        lambda: not {"pv-cur", "pv-only"} & attached_to(server, w1.name),
        120,
        cluster.diagnose,
    )
    assert get(server, "deployment", "kept-app")["spec"]["replicas"] == 0  # stopped: its only copy is on fw-w1


def test_a_join_names_each_volume_whose_only_copy_sits_on_a_worker(cluster: Cluster) -> None:
    """A worker's join ends naming each single-copy volume whose copy sits on a worker, as
    `status --check` does: `only` keeps its one copy on fw-w1 (fenced by the test before; its join
    is left alone), `cur` keeps two and is not named."""
    w1 = cluster.w1
    w3 = cluster.lab.add_host(worker_spec("fw-w3"))
    cluster.lab.wait_ssh_ready([w3])
    cluster.config["workers"].append({"name": w3.name, "kind": "existing", "address": w3.public_ip})
    cluster.stack.write_config(cluster.config)
    started = time.monotonic()
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    print(f"the join of {w3.name} took {time.monotonic() - started:.1f} s")
    text = cluster.stack.text()
    assert f"[{w3.name}] joined and released" in text, text[-4000:]
    assert f"[{w3.name}] volume only keeps its only copy on worker {w1.name}: losing that worker loses it" in text, (
        text[-4000:]
    )
    assert "volume cur keeps its only copy" not in text


def test_a_give_up_lists_what_its_fence_stopped_and_workload_start_judges_it(cluster: Cluster) -> None:
    """fw-w1 given up (`node remove --force`) while its fence keeps kept-app stopped: the run names
    kept-app with `workload start`, which then refuses it, since no node the cluster has holds a
    copy of `only` (its one copy was on fw-w1), and changes nothing."""
    server, w1 = cluster.server, cluster.w1
    run = cluster.stack.hk3s("node", "remove", w1.name, "--force", "--yes")
    assert run.returncode == 0, run.stderr[-4000:]
    said = " ".join(run.stderr.split())
    assert f"[{w1.name}] given up (fenced since" in said, said[-4000:]
    assert (
        f"[{w1.name}] Deployment default/kept-app stays stopped by the fence (only-copy); nothing starts it on its "
        "own: start it with scripts/hk3s workload start default/Deployment/kept-app (" in said
    ), said[-4000:]
    refused = cluster.stack.hk3s("workload", "start", "default/Deployment/kept-app", "--accept-stale-data", "--yes")
    assert refused.returncode == 3, refused.stderr[-4000:]
    assert f"no node but {w1.name} ever held a copy of only" in " ".join(refused.stderr.split())
    kept = get(server, "deployment", "kept-app")
    assert kept["spec"]["replicas"] == 0 and STOPPED_ANNOTATION in kept["metadata"]["annotations"]
