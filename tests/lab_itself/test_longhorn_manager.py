"""The Longhorn manager stand-in (lab/longhorn_standin/manager.py) against the lab's real control
plane: the k3s stand-in's server (real kube-apiserver, kube-controller-manager with its garbage
collector and node lifecycle controller) run directly on this machine with no node of its own,
the stand-in chart's CRDs applied with the real kubectl, and the manager as the lab runs it, a
process of its own that reaches the API with the server's admin kubeconfig.

The Kubernetes nodes here are Node objects the test makes and keeps alive itself (their Leases
renewed, as a kubelet renews them), so a node can go NotReady on demand; each node's Longhorn
disk is a directory on this machine, so its figures are this machine's disk's.

One server and one manager for the module; each test uses volumes of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lab.stack_harness import BIN, REPO, skip_without_lab_binaries
from tests.lab_itself.ports import free_port, port_pair

pytestmark = pytest.mark.lab

CHART = REPO / "lab" / "longhorn_standin" / "chart"
NS = "longhorn-system"
MiB = 1 << 20
#: Each node's Longhorn disk: a tmpfs of this size (this machine's own disk may be fuller than
#: Longhorn's storage-minimal-available-percentage allows, and then Longhorn places nothing).
DISK_SIZE = "1g"
T = TypeVar("T")
#: Longhorn's defaults for the settings the manager reads (chart/templates/settings.yaml), but the
#: replenishment wait: 600 s by default, 12 s here so the wait can be watched end to end.
SETTINGS = {
    "replica-soft-anti-affinity": "false",
    "allow-volume-creation-with-degraded-availability": "true",
    "storage-reserved-percentage-for-default-disk": "30",
    "storage-minimal-available-percentage": "25",
    "storage-over-provisioning-percentage": "100",
    "replica-replenishment-wait-interval": "12",
    "disable-scheduling-on-cordoned-node": "true",
}
WAIT_INTERVAL = 12


@dataclass
class Cluster:
    """The server, the manager, and the nodes this test keeps alive."""

    tmp: Path
    server: subprocess.Popen[bytes]
    kubeconfig: Path
    env: dict[str, str]
    manager: subprocess.Popen[bytes] | None = None
    alive: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(
            argv, check=False, input=stdin, capture_output=True, text=True, env=self.env, timeout=60
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(obj))

    def get(self, kind: str, name: str | None = None) -> Any:
        args = ["get", kind, "-o", "json"] + ([name] if name else [])
        if "longhorn.io" in kind:
            args += ["-n", NS]
        return json.loads(self.kubectl(*args).stdout)

    def merge(self, kind: str, name: str, patch: dict[str, Any], *, status: bool = False) -> None:
        args = ["patch", kind, name, "--type", "merge", "-p", json.dumps(patch)]
        if "longhorn.io" in kind:
            args += ["-n", NS]
        if status:
            args.append("--subresource=status")
        self.kubectl(*args)

    def replicas(self, volume: str) -> list[dict[str, Any]]:
        items = self.get("replicas.longhorn.io")["items"]
        return [r for r in items if r["spec"].get("volumeName") == volume]

    def watch_replicas(self) -> ReplicaWatch:
        argv = [str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), "-n", NS, "get", "replicas.longhorn.io"]
        argv += ["--watch-only", "--output-watch-events", "-o", "json"]
        watch = ReplicaWatch(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=self.env))
        time.sleep(1)  # the watch is open before the change it should see
        return watch

    def manager_log(self) -> str:
        path = self.tmp / "manager.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


@dataclass
class ReplicaWatch:
    """`kubectl get --watch` of the replicas: the events in the order the API server sent them."""

    process: subprocess.Popen[str]

    def stop(self) -> list[tuple[str, dict[str, Any]]]:
        time.sleep(1)
        self.process.terminate()
        text, _ = self.process.communicate(timeout=10)
        decoder, events, at = json.JSONDecoder(), [], 0
        while (at := text.find("{", at)) != -1:
            event, at = decoder.raw_decode(text, at)
            events.append((event["type"], event["object"]))
        return events


def wait_for(what: str, fn: Callable[[], T | None], cluster: Cluster, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        if cluster.manager is not None and cluster.manager.poll() is not None:
            raise AssertionError(f"the manager exited with {cluster.manager.returncode}:\n{cluster.manager_log()}")
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{cluster.manager_log()}")
        time.sleep(0.5)


def when(value: T, test: Callable[[T], bool]) -> T | None:
    """`value` when it passes `test`, else None (for `wait_for`)."""
    return value if test(value) else None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _heartbeat(cluster: Cluster) -> None:
    """Renew each live node's Lease, as its kubelet would, so the node lifecycle controller keeps it Ready."""
    while not cluster.stop.wait(3):
        for name in list(cluster.alive):
            patch = {"spec": {"renewTime": _now()}}
            cluster.kubectl(
                "patch", "lease", name, "-n", "kube-node-lease", "--type", "merge", "-p", json.dumps(patch), check=False
            )


def add_node(cluster: Cluster, name: str, *, taints: list[dict[str, str]] | None = None) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"taints": taints or []}})
    cluster.apply(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": _now()},
        }
    )
    set_ready(cluster, name, True)
    cluster.alive.add(name)


def set_ready(cluster: Cluster, name: str, ready: bool) -> None:
    stamp = _now().split(".")[0] + "Z"
    conditions = [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "lab node",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
    ]
    cluster.merge("node", name, {"status": {"conditions": conditions}}, status=True)
    (cluster.alive.add if ready else cluster.alive.discard)(name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries("k3s", "kine", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
    tmp = tmp_path_factory.mktemp("longhorn-manager")
    port = port_pair()
    config = tmp / "config.yaml"
    config.write_text(
        f"kube-controller-manager-arg:\n  - secure-port={free_port()}\n"
        f"kube-scheduler-arg:\n  - secure-port={free_port()}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3S_") and k != "KUBECONFIG"}
    env["HK3S_LAB_KUBE_BIN"] = str(BIN)
    kubeconfig = tmp / "k3s.yaml"
    args = ["server", "--config", str(config), "--data-dir", str(tmp / "server"), "--disable-agent"]
    args += ["--bind-address", "127.0.0.1", "--https-listen-port", str(port), "--write-kubeconfig", str(kubeconfig)]
    log = tmp / "server.log"
    with open(log, "ab") as out:
        server = subprocess.Popen([str(BIN / "k3s"), *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    the_cluster = Cluster(tmp, server, kubeconfig, env)
    beat = threading.Thread(target=_heartbeat, args=(the_cluster,), daemon=True)
    try:
        wait_for("the server", lambda: "k3s is up and running" in log.read_text(), the_cluster, 240)
        the_cluster.kubectl("create", "namespace", NS)
        the_cluster.kubectl("apply", "-f", str(CHART / "crds"))
        the_cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        for name, value in SETTINGS.items():
            setting = {
                "apiVersion": "longhorn.io/v1beta2",
                "kind": "Setting",
                "metadata": {"name": name, "namespace": NS},
            }
            the_cluster.apply({**setting, "value": value})
        beat.start()
        for name in ("n0", "n1", "n2", "n3"):
            disk = tmp / "disks" / name
            disk.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(disk)], check=True)
        for name in ("n1", "n2", "n3"):
            add_node(the_cluster, name)
        argv = [sys.executable, "-m", "lab.longhorn_standin.manager", "--kubeconfig", str(kubeconfig)]
        argv += ["--state-dir", str(tmp / "manager"), "--interval", "0.5"]
        for name in ("n0", "n1", "n2", "n3"):
            argv += ["--disk", f"{name}={tmp / 'disks' / name}"]
        with open(tmp / "manager.log", "ab") as out:
            the_cluster.manager = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        yield the_cluster
    finally:
        the_cluster.stop.set()
        for process in (the_cluster.manager, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        for disk in (tmp / "disks").glob("*"):
            subprocess.run(["umount", str(disk)], check=False)


def longhorn_node(cluster: Cluster, name: str) -> dict[str, Any] | None:
    items = {n["metadata"]["name"]: n for n in cluster.get("nodes.longhorn.io")["items"]}
    node = items.get(name)
    return node if node and node.get("status", {}).get("diskStatus") else None


def disk_on(cluster: Cluster, node: str) -> dict[str, Any]:
    """The status of the node's one disk."""
    found = longhorn_node(cluster, node)
    assert found is not None, f"no Longhorn node {node}"
    (disk,) = found["status"]["diskStatus"].values()
    return dict(disk)


def volume(cluster: Cluster, name: str, copies: int, *, selector: list[str], size: int = 64 * MiB) -> None:
    cluster.apply(
        {
            "apiVersion": "longhorn.io/v1beta2",
            "kind": "Volume",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"size": str(size), "numberOfReplicas": copies, "nodeSelector": selector},
        }
    )


def scheduled(cluster: Cluster, name: str) -> dict[str, Any]:
    conditions = cluster.get("volumes.longhorn.io", name).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Scheduled"), {})


def placed(cluster: Cluster, name: str) -> dict[str, str]:
    """Replica name -> node, for the volume's placed replicas."""
    return {r["metadata"]["name"]: r["spec"]["nodeID"] for r in cluster.replicas(name) if r["spec"].get("nodeID")}


def set_tags(cluster: Cluster, node: str, tags: list[str]) -> None:
    cluster.merge("nodes.longhorn.io", node, {"spec": {"tags": tags}})


def test_a_longhorn_node_per_kubernetes_node_with_the_hosts_disk(cluster: Cluster) -> None:
    for name in ("n1", "n2", "n3"):
        node = wait_for(f"Longhorn node {name}", partial(longhorn_node, cluster, name), cluster)
        assert node["spec"]["allowScheduling"] is True
        ((disk_name, disk),) = node["spec"]["disks"].items()
        assert disk["path"] == "/var/lib/longhorn" and disk["allowScheduling"] is True
        status = node["status"]["diskStatus"][disk_name]
        st = os.statvfs(cluster.tmp / "disks" / name)
        assert status["storageMaximum"] == st.f_blocks * st.f_frsize
        assert abs(status["storageAvailable"] - st.f_bavail * st.f_frsize) < 512 * 1024 * 1024
        # storage-reserved-percentage-for-default-disk: 30 % of the disk.
        assert disk["storageReserved"] == status["storageMaximum"] * 30 // 100
        kinds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert kinds == {"Ready": "True", "Schedulable": "True"}

    # A node under a NoSchedule taint gets no Longhorn manager pod, so no Longhorn node, until it goes.
    add_node(cluster, "n0", taints=[{"key": "hk3s.dev/validating", "value": "true", "effect": "NoSchedule"}])
    time.sleep(4)
    assert longhorn_node(cluster, "n0") is None, "a Longhorn node was made under the validation taint"
    cluster.merge("node", "n0", {"spec": {"taints": None}})
    wait_for("Longhorn node n0 after the taint went", lambda: longhorn_node(cluster, "n0"), cluster)
    # n0 takes no part in the placement tests below.
    cluster.merge("nodes.longhorn.io", "n0", {"spec": {"allowScheduling": False}})


def test_replicas_follow_tags_anti_affinity_and_room(cluster: Cluster) -> None:
    for name in ("n1", "n2", "n3"):
        wait_for(f"Longhorn node {name}", partial(longhorn_node, cluster, name), cluster)
    set_tags(cluster, "n1", ["copies"])
    set_tags(cluster, "n2", ["copies"])
    set_tags(cluster, "n3", [])

    volume(cluster, "two", 2, selector=["copies"])
    where = wait_for("two replicas of 'two'", lambda: when(placed(cluster, "two"), lambda p: len(p) == 2), cluster)
    assert sorted(where.values()) == ["n1", "n2"], where
    wait_for("'two' scheduled", lambda: scheduled(cluster, "two").get("status") == "True", cluster)
    # The disk counts the replicas it holds, by name and size.
    wait_for(
        "n1's disk to count its replica", lambda: set(where) & set(disk_on(cluster, "n1")["scheduledReplica"]), cluster
    )
    n1_disk = disk_on(cluster, "n1")
    assert n1_disk["storageScheduled"] == 64 * MiB * len(set(where) & set(n1_disk["scheduledReplica"]))
    assert n1_disk["diskUUID"]

    # Three copies on two tagged nodes: two placed, one waits; never two on one node.
    volume(cluster, "three", 3, selector=["copies"])
    wait_for("two replicas of 'three'", lambda: len(placed(cluster, "three")) == 2, cluster)
    time.sleep(2)
    assert len(cluster.replicas("three")) == 3 and len(placed(cluster, "three")) == 2
    assert sorted(placed(cluster, "three").values()) == ["n1", "n2"]
    # Detached, Longhorn resets the condition (degraded availability allowed) ...
    detached = scheduled(cluster, "three")
    assert detached["status"] == "True" and "degraded availability" in detached["message"], detached
    # ... attached, it says the replica could not be scheduled.
    cluster.merge("volumes.longhorn.io", "three", {"spec": {"nodeID": "n1"}})
    cond = wait_for(
        "'three' not scheduled",
        lambda: when(scheduled(cluster, "three"), lambda c: c.get("status") == "False"),
        cluster,
    )
    assert cond["reason"] == "ReplicaSchedulingFailure" and cond["message"] == "replica scheduling failed", cond
    status = cluster.get("volumes.longhorn.io", "three")["status"]
    assert (status["state"], status["robustness"], status["currentNodeID"]) == ("attached", "degraded", "n1")
    # A node that starts to qualify gets the waiting replica.
    set_tags(cluster, "n3", ["copies"])
    wait_for(
        "the third replica on n3", lambda: sorted(placed(cluster, "three").values()) == ["n1", "n2", "n3"], cluster
    )
    wait_for(
        "'three' healthy",
        lambda: cluster.get("volumes.longhorn.io", "three")["status"]["robustness"] == "healthy",
        cluster,
    )

    # No room: a volume larger than any disk's room is not placed, and says so.
    volume(cluster, "huge", 1, selector=[], size=1 << 50)
    cluster.merge("volumes.longhorn.io", "huge", {"spec": {"nodeID": "n1"}})
    cond = wait_for(
        "'huge' not scheduled", lambda: when(scheduled(cluster, "huge"), lambda c: c.get("status") == "False"), cluster
    )
    assert cond["message"] == "insufficient storage", cond
    assert not placed(cluster, "huge")

    # Scheduling disabled on a node: nothing new lands there.
    cluster.merge("nodes.longhorn.io", "n3", {"spec": {"allowScheduling": False}})
    volume(cluster, "after", 2, selector=["copies"])
    wait_for("'after' placed", lambda: len(placed(cluster, "after")) == 2, cluster)
    assert "n3" not in placed(cluster, "after").values()
    cluster.merge("nodes.longhorn.io", "n3", {"spec": {"allowScheduling": True}})
    for name in ("two", "three", "huge", "after"):
        cluster.kubectl("delete", "volumes.longhorn.io", name, "-n", NS)


def test_eviction_moves_a_replica_healthy_elsewhere_first_or_waits(cluster: Cluster) -> None:
    set_tags(cluster, "n1", ["e"])
    set_tags(cluster, "n2", ["e"])
    set_tags(cluster, "n3", [])
    volume(cluster, "ev2", 2, selector=["e"])
    volume(cluster, "ev3", 3, selector=[])
    wait_for(
        "ev2 and ev3 placed", lambda: len(placed(cluster, "ev2")) == 2 and len(placed(cluster, "ev3")) == 3, cluster
    )
    assert sorted(placed(cluster, "ev2").values()) == ["n1", "n2"]
    old = next(r for r, n in placed(cluster, "ev2").items() if n == "n1")
    ev3_on_n1 = [r for r, n in placed(cluster, "ev3").items() if n == "n1"]
    set_tags(cluster, "n3", ["e"])
    watch = cluster.watch_replicas()
    cluster.merge("nodes.longhorn.io", "n1", {"spec": {"evictionRequested": True}})

    def moved() -> bool:
        nodes = sorted(r["spec"]["nodeID"] for r in cluster.replicas("ev2"))
        return old not in {r["metadata"]["name"] for r in cluster.replicas("ev2")} and nodes == ["n2", "n3"]

    wait_for("ev2's replica moved off n1", moved, cluster)
    assert all(r["spec"].get("healthyAt") for r in cluster.replicas("ev2"))
    # In the order the API server saw the changes: the replacement on n3 was healthy before the
    # replica on n1 was deleted.
    events = watch.stop()
    healthy_at = next(
        i
        for i, (kind, r) in enumerate(events)
        if r["spec"].get("nodeID") == "n3" and r["spec"].get("healthyAt") and r["spec"].get("volumeName") == "ev2"
    )
    deleted_at = next(i for i, (kind, r) in enumerate(events) if kind == "DELETED" and r["metadata"]["name"] == old)
    assert healthy_at < deleted_at, events
    # ev3 has a replica on every node: no node can take the one on n1, so it stays and its
    # replacement waits unplaced.
    wait_for("ev3's replacement", lambda: len(cluster.replicas("ev3")) == 4, cluster)
    time.sleep(3)
    assert [r for r, n in placed(cluster, "ev3").items() if n == "n1"] == ev3_on_n1
    assert sorted(n for n in placed(cluster, "ev3").values()) == ["n1", "n2", "n3"]
    cluster.merge("nodes.longhorn.io", "n1", {"spec": {"evictionRequested": False}})
    for name in ("ev2", "ev3"):
        cluster.kubectl("delete", "volumes.longhorn.io", name, "-n", NS)


def test_a_replica_on_a_node_gone_down_fails_and_is_rebuilt_only_after_the_wait(cluster: Cluster) -> None:
    set_tags(cluster, "n1", [])
    set_tags(cluster, "n2", ["copies"])
    set_tags(cluster, "n3", ["copies"])
    volume(cluster, "att", 2, selector=["copies"])
    volume(cluster, "det", 1, selector=["copies"])
    wait_for(
        "att and det placed", lambda: len(placed(cluster, "att")) == 2 and len(placed(cluster, "det")) == 1, cluster
    )
    assert sorted(placed(cluster, "att").values()) == ["n2", "n3"]
    victim = next(iter(placed(cluster, "det").values()))
    keeper = "n3" if victim == "n2" else "n2"
    cluster.merge("volumes.longhorn.io", "att", {"spec": {"nodeID": keeper}})
    wait_for(
        "att healthy",
        lambda: cluster.get("volumes.longhorn.io", "att")["status"].get("robustness") == "healthy",
        cluster,
    )

    set_ready(cluster, victim, False)
    down_at = time.monotonic()
    set_tags(cluster, "n1", ["copies"])  # somewhere for a replacement to go

    def failed_replica() -> dict[str, Any] | None:
        return next(
            (r for r in cluster.replicas("att") if r["spec"]["nodeID"] == victim and r["spec"].get("failedAt")), None
        )

    replica = wait_for(f"the replica on {victim} to fail", failed_replica, cluster)
    assert replica["spec"]["lastFailedAt"] == replica["spec"]["failedAt"]
    assert replica["spec"]["healthyAt"], "Longhorn clears healthyAt only before a rebuild"
    wait_for(
        "att degraded",
        lambda: cluster.get("volumes.longhorn.io", "att")["status"].get("robustness") == "degraded",
        cluster,
    )
    # Not kinder than Longhorn: no new replica before replica-replenishment-wait-interval.
    while time.monotonic() - down_at < WAIT_INTERVAL - 3:
        assert len(cluster.replicas("att")) == 2, "a replica was replaced before the wait interval"
        time.sleep(1)
    # After it, a new replica on the node that qualifies.
    wait_for(
        "a new replica after the wait",
        lambda: (
            len([r for r in cluster.replicas("att") if r["spec"].get("healthyAt") and not r["spec"].get("failedAt")])
            == 2
        ),
        cluster,
        timeout=WAIT_INTERVAL + 30,
    )
    assert time.monotonic() - down_at >= WAIT_INTERVAL - 1
    assert sorted(r["spec"]["nodeID"] for r in cluster.replicas("att") if not r["spec"].get("failedAt")) == sorted(
        [keeper, "n1"]
    )
    wait_for(
        "att healthy again",
        lambda: cluster.get("volumes.longhorn.io", "att")["status"].get("robustness") == "healthy",
        cluster,
    )
    # The detached volume's failed replica is not rebuilt (Longhorn rebuilds at the next attach).
    (det_replica,) = cluster.replicas("det")
    assert det_replica["spec"]["failedAt"] and det_replica["spec"]["nodeID"] == victim
    set_ready(cluster, victim, True)


def engine_of(cluster: Cluster, volume_name: str) -> dict[str, Any] | None:
    items = cluster.get("engines.longhorn.io")["items"]
    return next((e for e in items if e["spec"].get("volumeName") == volume_name), None)


def test_an_engine_on_a_node_gone_down_is_unknown_and_no_copy_of_its_volume_fails(cluster: Cluster) -> None:
    """Longhorn's instance handler marks the engine of a node gone down `unknown`, and
    ReconcileEngineReplicaState then changes no copy of its volume: the copies elsewhere keep
    reading healthy although the engine may have gone on writing without them. Once the engine's
    node is back, the engine runs again and a copy whose node is down fails (its mode ERR)."""
    for name in ("n1", "n2", "n3"):
        wait_for(f"the Longhorn node {name}", lambda n=name: longhorn_node(cluster, n), cluster)  # type: ignore[misc]
    set_tags(cluster, "n1", [])
    set_tags(cluster, "n2", ["eng"])
    set_tags(cluster, "n3", ["eng"])
    volume(cluster, "eng", 2, selector=["eng"])
    wait_for("eng placed", lambda: len(placed(cluster, "eng")) == 2, cluster)
    cluster.merge("volumes.longhorn.io", "eng", {"spec": {"nodeID": "n1"}})  # its engine on n1, no copy there
    engine = wait_for(
        "eng's engine running on n1",
        lambda: when(
            engine_of(cluster, "eng"),
            lambda e: bool(
                e
                and e["spec"].get("nodeID") == "n1"
                and e.get("status", {}).get("currentState") == "running"
                and len((e["status"].get("replicaModeMap") or {}).values()) == 2
            ),
        ),
        cluster,
    )
    assert set(engine["status"]["replicaModeMap"].values()) == {"RW"}, engine["status"]

    set_ready(cluster, "n1", False)
    wait_for(
        "the engine unknown",
        lambda: (engine_of(cluster, "eng") or {}).get("status", {}).get("currentState") == "unknown",
        cluster,
    )
    status = cluster.get("volumes.longhorn.io", "eng")["status"]
    assert status["state"] == "attached" and status["robustness"] == "unknown", status
    # A copy's node going down now changes nothing Longhorn shows: the engine is not heard.
    set_ready(cluster, "n3", False)
    for _ in range(8):  # several passes of the manager (every 0.5 s)
        time.sleep(0.5)
        assert not any(r["spec"].get("failedAt") for r in cluster.replicas("eng")), cluster.replicas("eng")
    engine = engine_of(cluster, "eng") or {}
    assert set(engine["status"]["replicaModeMap"].values()) == {"RW"}, engine["status"]

    # The engine's node back: it runs again, and the copy on the node still down fails.
    set_ready(cluster, "n1", True)
    failed = wait_for(
        "the copy on n3 failed",
        lambda: next((r for r in cluster.replicas("eng") if r["spec"].get("failedAt")), None),
        cluster,
    )
    assert failed["spec"]["nodeID"] == "n3"
    assert (engine_of(cluster, "eng") or {})["status"]["currentState"] == "running"
    set_ready(cluster, "n3", True)
    cluster.merge("volumes.longhorn.io", "eng", {"spec": {"nodeID": ""}})
    wait_for(
        "the engine stopped at the detach",
        lambda: (engine_of(cluster, "eng") or {}).get("status", {}).get("currentState") == "stopped",
        cluster,
    )


def test_the_manager_runs_on_a_tainted_node_only_when_its_pods_tolerate_the_taint() -> None:
    """Kubernetes' matching of a taint by the manager DaemonSet pods' tolerations (the chart's
    `longhornManager.tolerations`; k8s.io/api core/v1 toleration.go `ToleratesTaint`). No cluster:
    the rule alone."""
    from lab.longhorn_standin.manager import runs_manager_pod  # noqa: PLC0415

    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    batch = {"spec": {"taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]}, "status": ready}
    assert not runs_manager_pod(batch)
    assert runs_manager_pod(
        batch, [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]
    )
    assert runs_manager_pod(batch, [{"key": "dedicated", "operator": "Exists"}])
    assert runs_manager_pod(batch, [{"operator": "Exists"}])
    assert not runs_manager_pod(batch, [{"key": "dedicated", "operator": "Equal", "value": "gpu"}])
    assert not runs_manager_pod(batch, [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}])
    # A PreferNoSchedule taint never keeps a DaemonSet pod off.
    soft = {"spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}, "status": ready}
    assert runs_manager_pod(soft)
