"""The fence's decision per workload with real pods on Longhorn volumes: pod-capable lab workers
(a real containerd, runc and kubelet under the k3s stand-in), the real kube-controller-manager
(taint eviction, pod garbage collector, Deployment controller, PV binder, attach/detach
controller) and the Longhorn stand-in's CSI path (lab/longhorn_standin: the manager provisions and
attaches, the node plugin the real kubelet calls stages and publishes), through the real engine.

One cluster for the module: a server and two pod-capable workers. Two Deployments run on fw-w1,
each writing into its own Longhorn volume:
- cur-app's claim is of the program's one-copy class: its copy is on the server;
- only-app's claim is of a class whose copies follow a tag only fw-w1 carries: its only copy is on
  fw-w1.
First, with every node up: a plain pod gets no answer from Longhorn's manager API, which the
program's NetworkPolicy holds closed to all but Longhorn's own pods (and is answered without it).
Then fw-w1's agent stops (its containers keep running, as on k3s). The pods tolerate its unreachable
taint for 5 s, so the real taint eviction controller deletes them well within the minute a fence
waits; they stay Terminating, and `status` still lists both workloads stranded on fw-w1 with what a
fence would decide. A minute after fw-w1 went NotReady it is fenced.
cur's engine ran on fw-w1, and Longhorn reads it `unknown` from then on (the stand-in does as
Longhorn's instance handler does): the server's copy still reads healthy, but Longhorn has heard
nothing from that engine since, so the copy may be older than what fw-w1 wrote. cur-app stays
stopped as on a stale copy; `workload start` refuses it without consent even after the volume
detached (the fence's record keeps why), and starts it with `--accept-stale-data`: it runs again on
fw-w2, its volume attached there by the real attach/detach controller after the one to fw-w1 was
deleted. only-app stays stopped (scaled to zero, its only copy on fw-w1) and says so. Lifting the fence
brings fw-w1 back Ready and starts only-app again (its pod scheduled; the stand-in has no Longhorn
auto-salvage, so a volume whose every copy failed does not attach again in the lab: stricter than
Longhorn, which salvages the copies that failed last).

Last, a held workload is not restarted from outside: held-app (on fp-w1, its volume's copies on
fp-w1 and fp-w2) is held at zero replicas as stale by a fence of fp-w1 taken while fp-w2 is down
too. A user's `kubectl scale --replicas=1` (the scale subresource, as KEDA and HPA use it) and a
`kubectl apply` of replicas: 1 (as Argo CD, Flux or a CI job does) are refused by the real API
server's admission, naming the fence, `workload start` and `--accept-stale-data`. With the policy's
binding deleted by hand the scale goes through, and `status` and `status --check` name the held
workload that runs anyway. `workload start --accept-stale-data` still starts it (fp-w1 stays
fenced: the module ends there).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from lab import pod_hosts
from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    LabStack,
    base_config,
    server_spec,
    skip_without_kubernetes_provider,
    up_or_fail,
    wait_until,
    worker_spec,
)
from node_operations.fence_workloads import STOPPED_ANNOTATION

pytestmark = pytest.mark.lab

K3S = "/usr/local/bin/k3s"
DRIVER = "driver.longhorn.io"
LABEL = "fence-test/place"
# The lab's disks are this machine's; shares low enough that the test's copies fit.
STORAGE = {
    "install_longhorn": True,
    "longhorn_chart": str(LONGHORN_STANDIN_CHART),
    "reserved_percent": 5,
    "minimal_available_percent": 5,
}
# A class whose volumes keep one copy on the nodes tagged t-only (fw-w1 alone), as an operator's
# class with a node selector would.
ONLY_CLASS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "fence-test-only"},
    "provisioner": DRIVER,
    "parameters": {"numberOfReplicas": "1", "nodeSelector": "t-only"},
}


# Kubernetes evicts a pod from a NotReady node once its toleration of the node's condition taint
# runs out (300 s, added by the API server's DefaultTolerationSeconds admission plugin, when the pod
# names none); the kubelet there never confirms the deletion, so the pod stays Terminating. These
# pods name 5 s, as any pod may, so their eviction comes within the minute the fence waits anyway.
EVICTED_SOON = [
    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
]


def claim(name: str, storage_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }


def deployment(name: str, claim_name: str, image: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {LABEL: "yes"},
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": EVICTED_SOON,
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
                    "containers": [
                        {
                            "name": "app",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "hostname >> /data/written-by && sync && exec sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
        },
    }


@dataclass
class Cluster:
    lab: Lab
    stack: LabStack
    server: Host
    w1: Host
    w2: Host
    config: dict[str, Any]

    def kubectl(self, *args: str) -> str:
        return self.server.run([K3S, "kubectl", *args], timeout=60).stdout

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return found

    def apply(self, name: str, objects: list[dict[str, Any]]) -> None:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        (self.server.root / f"root/{name}.json").write_text(text)
        self.kubectl("apply", "-f", f"/root/{name}.json")

    def running(self, app: str) -> list[str]:
        """The nodes of the app's Running pods that are not being deleted."""
        return sorted(
            p["spec"]["nodeName"]
            for p in self.get("pods", "-l", f"app={app}")["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        )

    def attached(self, claim_name: str) -> dict[str, bool]:
        """The claim's volume's VolumeAttachments: node -> attached."""
        pv = self.get("pvc", claim_name)["spec"].get("volumeName")
        return {
            a["spec"]["nodeName"]: bool((a.get("status") or {}).get("attached"))
            for a in self.get("volumeattachments")["items"]
            if a["spec"]["source"].get("persistentVolumeName") == pv
        }

    def ready(self, host: Host) -> str:
        found = self.get("node", host.name)
        return str(next(c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready"))

    def diagnose(self) -> str:
        kinds = "pods,pvc,pv,volumeattachments,nodes"
        longhorn = self.kubectl("get", "volumes.longhorn.io,replicas.longhorn.io", "-A", "-o", "wide")
        return self.kubectl("get", kinds, "-A", "-o", "wide") + longhorn + self.stack.text()[-4000:]


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    skip_without_kubernetes_provider()
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    server = lab.add_host(server_spec("fp-srv"))
    w1, w2 = (lab.add_host(worker_spec(f"fp-w{i}", pods=True)) for i in (1, 2))
    lab.wait_ssh_ready([server, w1, w2])
    for worker in (w1, w2):  # before k3s is installed, as k3s's air-gap instructions say
        pod_hosts.place_airgap_images(worker.root, DEFAULT_CACHE_DIR)
    stack = LabStack(tmp_path_factory.mktemp("fence-pods"))
    config = base_config(lab, server, [w1, w2], storage=STORAGE)
    stack.write_config(config)
    up_or_fail(stack)
    cluster = Cluster(lab, stack, server, w1, w2, config)
    names = {server.name, w1.name, w2.name}
    wait_until(
        "a Longhorn node per node",
        lambda: {n["metadata"]["name"] for n in cluster.get("nodes.longhorn.io", "-A")["items"]} == names,
        120,
        cluster.diagnose,
    )
    for name in names:
        node = cluster.get("nodes.longhorn.io", name, "-n", "longhorn-system")
        tags = sorted({*(node["spec"].get("tags") or []), *(["t-only"] if name == w1.name else [])})
        body = json.dumps({"spec": {"allowScheduling": True, "tags": tags}})
        cluster.kubectl("patch", "nodes.longhorn.io", name, "-n", "longhorn-system", "--type", "merge", "-p", body)
    image = pod_hosts.busybox_image()
    for worker in (w1, w2):
        wait_until(
            f"{worker.name} imports the air-gap images",
            lambda w=worker: image in w.run([K3S, "ctr", "images", "ls", "-q"]).stdout,  # type: ignore[misc]
            60,
        )
    cluster.kubectl("label", "node", w1.name, f"{LABEL}=yes")
    cluster.apply(
        "apps",
        [
            ONLY_CLASS,
            claim("cur", "hk3s-one-copy"),
            claim("only", "fence-test-only"),
            deployment("cur-app", "cur", image),
            deployment("only-app", "only", image),
        ],
    )
    for app in ("cur-app", "only-app"):
        wait_until(f"{app} Running on fp-w1", lambda a=app: cluster.running(a) == [w1.name], 240, cluster.diagnose)  # type: ignore[misc]
    return cluster


def probe_pod(
    name: str, namespace: str, node: str, command: str, *, image: str, labels: dict[str, str]
) -> dict[str, Any]:
    """A bare pod of the lab's busybox image on `node`, running `command`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", command]}
            ],
        },
    }


# Each second, one request for Longhorn's volume list, its outcome on a line of the log (busybox's
# wget crashes with -T: the deadline is timeout's).
ASK = (
    "while true; do if timeout 3 wget -q -O - http://{ip}:9500/v1/volumes >/tmp/got 2>/tmp/err; "
    'then echo "answered $(cat /tmp/got)"; else echo "no answer $(tail -1 /tmp/err)"; fi; sleep 1; done'
)


def test_a_plain_pod_gets_no_answer_from_longhorns_manager_api(cluster: Cluster) -> None:
    """Longhorn's manager API (9500) has no authentication: whoever reaches it can delete volumes
    or point the backup target elsewhere. The program keeps NetworkPolicies in longhorn-system
    (components/longhorn_network.py) that let in only Longhorn's own pods (and the namespaces the
    operator names), enforced by k3s's network-policy controller (the stand-in's, as kube-router
    does it). Real pods, real containerd and kubelet, pod traffic between two workers over
    flannel's VXLAN: a manager-like pod (labelled as Longhorn's manager, serving /v1/volumes on
    9500) on fp-w2; a plain pod in `default` on fp-w1 asks it every second and gets no answer,
    while a pod in longhorn-system does. With the program's policy deleted by hand, the plain pod
    is answered (what the policy holds back), and with it back, it is not."""
    image = pod_hosts.busybox_image()
    serve = 'mkdir -p /www/v1 && echo \'{"data":["vol-a"]}\' > /www/v1/volumes && exec httpd -f -p 9500 -h /www'
    manager = probe_pod(
        "probe-manager", "longhorn-system", cluster.w2.name, serve, image=image, labels={"app": "longhorn-manager"}
    )
    cluster.apply("probe-manager", [manager])
    wait_until(
        "the manager-like pod running",
        lambda: (
            cluster.get("pod", "probe-manager", "-n", "longhorn-system")["status"].get("podIP") is not None
            and cluster.get("pod", "probe-manager", "-n", "longhorn-system")["status"].get("phase") == "Running"
        ),
        120,
        cluster.diagnose,
    )
    ip = cluster.get("pod", "probe-manager", "-n", "longhorn-system")["status"]["podIP"]
    ask = ASK.format(ip=ip)
    cluster.apply(
        "probe-askers",
        [
            probe_pod("probe-intruder", "default", cluster.w1.name, ask, image=image, labels={"probe": "intruder"}),
            probe_pod("probe-own", "longhorn-system", cluster.w1.name, ask, image=image, labels={"probe": "own"}),
        ],
    )

    def log(name: str, namespace: str) -> list[str]:
        found = cluster.server.run(
            [K3S, "kubectl", "logs", name, "-n", namespace, "--tail", "3"], check=False, timeout=60
        ).stdout
        return found.strip().splitlines()

    def answered(name: str, namespace: str) -> bool:
        return any(line.startswith("answered") and "vol-a" in line for line in log(name, namespace))

    try:
        # Longhorn's own pods are let in: the manager serves, and the path between the workers works.
        def logs() -> str:
            asked = (("probe-own", "longhorn-system"), ("probe-intruder", "default"))
            return "\n".join(f"{n}: {log(n, ns)}" for n, ns in asked) + "\n" + cluster.diagnose()

        wait_until("a pod in longhorn-system answered", lambda: answered("probe-own", "longhorn-system"), 120, logs)
        # The plain pod has asked for several seconds by now, each time with no answer.
        wait_until("the plain pod's requests logged", lambda: len(log("probe-intruder", "default")) >= 3, 60)
        refused = log("probe-intruder", "default")
        assert all(line.startswith("no answer") for line in refused), refused
        # Without the program's policy, the same requests are answered: the policy is what holds them.
        policy = cluster.get("networkpolicy", "hk3s-longhorn-manager", "-n", "longhorn-system")
        cluster.kubectl("delete", "networkpolicy", "hk3s-longhorn-manager", "-n", "longhorn-system")
        wait_until("the plain pod answered with no policy", lambda: answered("probe-intruder", "default"), 60)
        kept = {k: policy[k] for k in ("apiVersion", "kind", "spec")}
        kept["metadata"] = {
            k: policy["metadata"][k] for k in ("name", "namespace", "labels", "annotations") if k in policy["metadata"]
        }
        cluster.apply("probe-policy", [kept])
        wait_until(
            "the plain pod refused again with the policy back",
            lambda: all(line.startswith("no answer") for line in log("probe-intruder", "default")[-2:]),
            60,
        )
    finally:
        # Gone before the next test, which reads every pod on fp-w1 as one of its workloads'.
        cluster.kubectl("delete", "pod", "probe-intruder", "-n", "default", "--ignore-not-found", "--timeout=45s")
        cluster.kubectl(
            "delete",
            "pod",
            "probe-own",
            "probe-manager",
            "-n",
            "longhorn-system",
            "--ignore-not-found",
            "--timeout=45s",
        )


def test_status_lists_the_workloads_stranded_on_a_worker_after_kubernetes_evicted_their_pods(
    cluster: Cluster,
) -> None:
    """fp-w1's agent stops; once the pods' toleration of the unreachable taint runs out, the real
    taint eviction controller deletes them, and they stay Terminating (no kubelet confirms). Their
    containers still run on fp-w1 and their volumes stay attached there: `status` still names fp-w1
    and both workloads stranded on it, each with what a fence would decide."""
    w1 = cluster.w1
    assert cluster.attached("cur") == {w1.name: True} and cluster.attached("only") == {w1.name: True}
    w1.run(["systemctl", "stop", "k3s-agent"])  # its containers keep running, as on k3s
    wait_until("fp-w1 NotReady", lambda: cluster.ready(w1) != "True", 90, cluster.diagnose)

    def evicted() -> dict[str, str]:
        """app -> its pod on fp-w1 that Kubernetes is deleting."""
        pods = cluster.get("pods", "--field-selector", f"spec.nodeName={w1.name}")["items"]
        return {
            p["metadata"]["labels"]["app"]: p["metadata"]["name"]
            for p in pods
            if p["metadata"].get("deletionTimestamp")
        }

    wait_until("both pods on fp-w1 evicted", lambda: set(evicted()) == {"cur-app", "only-app"}, 90, cluster.diagnose)
    pods = evicted()
    assert cluster.attached("cur") == {w1.name: True} and cluster.attached("only") == {w1.name: True}
    run = cluster.stack.hk3s("status", "--json")
    assert run.returncode == 0, run.stderr[-4000:]
    down = {w["name"]: w for w in json.loads(run.stdout)["down_workers"]}
    assert list(down) == [w1.name], down
    stranded = {s["workload"]: s for s in down[w1.name]["stranded"]}
    assert sorted(stranded) == ["Deployment default/cur-app", "Deployment default/only-app"], stranded
    cur, only = stranded["Deployment default/cur-app"], stranded["Deployment default/only-app"]
    # cur's engine ran on fp-w1 and is unheard since: the server's copy may be older.
    assert (cur["verdict"], cur["pods"]) == ("stale", [f"default/{pods['cur-app']}"]), cur
    assert list(cur["current_copies"].values()) == [[]], cur
    assert (only["verdict"], only["pods"]) == ("only-copy", [f"default/{pods['only-app']}"]), only
    assert list(only["current_copies"].values()) == [[]], only
    text = cluster.stack.hk3s("status").stdout
    assert f"{w1.name} is NotReady and not fenced" in text and f"  stranded: {cur['line']}" in text, text


def test_a_copy_whose_engine_went_silent_with_the_worker_is_not_current_and_its_workload_starts_only_with_consent(
    cluster: Cluster,
) -> None:
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    w1.run(["systemctl", "stop", "k3s-agent"])  # its containers keep running, as on k3s
    wait_until("fp-w1 NotReady", lambda: cluster.ready(w1) != "True", 90, cluster.diagnose)
    cluster.kubectl("label", "node", w2.name, f"{LABEL}=yes")
    # The minute a fence asks for, from the Ready condition's change by the server's clock.
    ready = next(c for c in cluster.get("node", w1.name)["status"]["conditions"] if c["type"] == "Ready")
    since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()
    time.sleep(max(0.0, since + 62 - float(server.run(["date", "+%s"]).stdout)))
    cluster.config["fences"] = {w1.name: {}}
    cluster.stack.write_config(cluster.config)
    started = time.monotonic()
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    fence_seconds = time.monotonic() - started
    text = cluster.stack.text()
    print("\n".join(line for line in text.splitlines() if f"[{w1.name}]" in line))

    # cur's engine ran on fp-w1: the server's copy, healthy by Longhorn's fields, may be older.
    assert "Deployment default/cur-app stays stopped: no other node holds a current copy" in text, text[-4000:]
    assert f"{server.name} (may be older: the volume's engine on {w1.name} reads unknown to Longhorn" in text
    cur_app = cluster.get("deployment", "cur-app")
    assert cur_app["spec"]["replicas"] == 0
    record = json.loads(cur_app["metadata"]["annotations"][STOPPED_ANNOTATION])
    assert record["reason"] == "stale" and list(record["engine_unknown_on"].values()) == [w1.name], record
    # Once the volume is detached its engine reads stopped, not unknown; the record still refuses.
    wait_until("cur's volume detached from fp-w1", lambda: not cluster.attached("cur"), 120, cluster.diagnose)
    refused = cluster.stack.hk3s("workload", "start", "default/Deployment/cur-app")
    assert refused.returncode == 3, (refused.stdout[-2000:], refused.stderr[-3000:])
    said = " ".join(refused.stderr.split())
    assert f"may be older: the volume's engine on {w1.name} reads unknown to Longhorn" in said, said
    assert cluster.get("deployment", "cur-app")["spec"]["replicas"] == 0
    consented = cluster.stack.hk3s("workload", "start", "default/Deployment/cur-app", "--accept-stale-data", "--yes")
    assert consented.returncode == 0, (consented.stdout[-2000:], consented.stderr[-3000:])
    # cur-app runs on fp-w2: its volume attached to fp-w2, the pod writing in it.
    wait_until("cur-app Running on fp-w2", lambda: cluster.running("cur-app") == [w2.name], 240, cluster.diagnose)
    print(
        f"fence up {fence_seconds:.1f} s; cur-app Running on fp-w2 {time.monotonic() - started:.1f} s after its start"
    )
    assert cluster.attached("cur") == {w2.name: True}, cluster.diagnose()
    pod = next(p for p in cluster.get("pods", "-l", "app=cur-app")["items"] if p["spec"]["nodeName"] == w2.name)
    written = cluster.kubectl("exec", pod["metadata"]["name"], "--", "cat", "/data/written-by")
    assert pod["metadata"]["name"] in written.split(), written
    # only-app stays stopped, recorded, and nothing of it runs.
    assert f"Deployment default/only-app stays stopped until {w1.name} rejoins: the only copy of pvc-" in text
    only_app = cluster.get("deployment", "only-app")
    assert only_app["spec"]["replicas"] == 0
    assert json.loads(only_app["metadata"]["annotations"][STOPPED_ANNOTATION])["reason"] == "only-copy"
    assert cluster.running("only-app") == [] and not cluster.get("pods", "-l", "app=only-app")["items"]
    wait_until(
        "only's volume detached from fp-w1", lambda: w1.name not in cluster.attached("only"), 120, cluster.diagnose
    )


def test_lifting_the_fence_starts_the_workload_it_stopped(cluster: Cluster) -> None:
    w1 = cluster.w1
    cluster.config["fences"] = {}
    cluster.stack.write_config(cluster.config)
    cluster.stack.log.clear()
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    assert f"[{w1.name}] fence lifted: rejoined" in text and "Deployment default/only-app started again" in text
    assert cluster.ready(w1) == "True"
    only_app = cluster.get("deployment", "only-app")
    assert only_app["spec"]["replicas"] == 1 and STOPPED_ANNOTATION not in only_app["metadata"].get("annotations", {})
    wait_until(
        "an only-app pod scheduled",
        lambda: any(p["spec"].get("nodeName") for p in cluster.get("pods", "-l", "app=only-app")["items"]),
        120,
        cluster.diagnose,
    )
    assert cluster.running("cur-app") == [cluster.w2.name]


# A class whose volumes keep a copy on each node tagged t-pair (fp-w1 and fp-w2).
PAIR_CLASS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "fence-test-pair"},
    "provisioner": DRIVER,
    "parameters": {"numberOfReplicas": "2", "nodeSelector": "t-pair"},
}
HELD_LABEL = "fence-test/held"


def as_user(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl as a user runs it against the real API server (not raising on a refusal)."""
    return cluster.server.run([K3S, "kubectl", *args], check=False, timeout=60)


def test_a_workload_a_fence_holds_stopped_is_not_restarted_from_outside(cluster: Cluster) -> None:
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    began = time.monotonic()
    for name in (w1.name, w2.name):
        node = cluster.get("nodes.longhorn.io", name, "-n", "longhorn-system")
        tags = sorted({*(node["spec"].get("tags") or []), "t-pair"})
        body = json.dumps({"spec": {"tags": tags}})
        cluster.kubectl("patch", "nodes.longhorn.io", name, "-n", "longhorn-system", "--type", "merge", "-p", body)
    cluster.kubectl("label", "node", w1.name, f"{HELD_LABEL}=yes")
    app = deployment("held-app", "pair", pod_hosts.busybox_image())
    app["spec"]["template"]["spec"]["nodeSelector"] = {HELD_LABEL: "yes"}
    cluster.apply("held", [PAIR_CLASS, claim("pair", "fence-test-pair"), app])
    wait_until("held-app Running on fp-w1", lambda: cluster.running("held-app") == [w1.name], 240, cluster.diagnose)
    volume = cluster.get("pvc", "pair")["spec"]["volumeName"]

    def healthy_on() -> set[str]:
        replicas = cluster.get("replicas.longhorn.io", "-n", "longhorn-system")["items"]
        return {
            r["spec"].get("nodeID")
            for r in replicas
            if r["spec"].get("volumeName") == volume and r["spec"].get("healthyAt") and not r["spec"].get("failedAt")
        }

    wait_until("pair's copies healthy on fp-w1 and fp-w2", lambda: healthy_on() == {w1.name, w2.name}, 120)
    # Both workers go down: the copy on fp-w2 may be older than fp-w1's, so the fence holds held-app.
    for worker in (w2, w1):
        worker.run(["systemctl", "stop", "k3s-agent"])
    wait_until("fp-w1 and fp-w2 NotReady", lambda: "True" not in {cluster.ready(w1), cluster.ready(w2)}, 90)
    print(f"held-app running, both workers NotReady: {time.monotonic() - began:.1f} s")
    time.sleep(62)  # the minute a fence asks for
    cluster.config["fences"] = {w1.name: {}}
    cluster.stack.write_config(cluster.config)
    fenced = time.monotonic()
    output = cluster.stack.up_output()
    if output:
        pytest.fail(output[-8000:])
    print(f"fence up {time.monotonic() - fenced:.1f} s")
    text = cluster.stack.text()
    assert "Deployment default/held-app stays stopped: no other node holds a current copy" in text, text[-4000:]
    held = cluster.get("deployment", "held-app")
    assert held["spec"]["replicas"] == 0
    assert json.loads(held["metadata"]["annotations"][STOPPED_ANNOTATION])["reason"] == "stale"

    # A user scales it up (the scale subresource), as KEDA or a script would: refused, naming the fence.
    start = f"scripts/hk3s --stack {cluster.stack.name} workload start default/Deployment/held-app"
    scaled = as_user(cluster, "scale", "deployment", "held-app", "--replicas=1")
    print(f"kubectl scale: exit {scaled.returncode}: {scaled.stdout}{scaled.stderr}")
    assert scaled.returncode != 0, scaled.stdout
    for part in (f"held stopped by the fence of {w1.name}", start, "--accept-stale-data"):
        assert part in scaled.stderr, scaled.stderr
    # An apply of the manifest with replicas: 1, as Argo CD's or Flux's self-heal or a CI job does.
    (server.root / "root/held-app.json").write_text(json.dumps(app))
    applied = as_user(cluster, "apply", "-f", "/root/held-app.json")
    assert applied.returncode != 0, applied.stdout
    assert f"held stopped by the fence of {w1.name}" in applied.stderr and start in applied.stderr, applied.stderr
    assert cluster.get("deployment", "held-app")["spec"]["replicas"] == 0

    # The hold's binding deleted by hand: the scale goes through, and status names the workload.
    bindings = "validatingadmissionpolicybindings"
    binding = cluster.get(bindings, "hk3s-fence-holds")
    cluster.kubectl("delete", bindings, binding["metadata"]["name"])
    wait_until(
        "the scale accepted without the binding",
        lambda: as_user(cluster, "scale", "deployment", "held-app", "--replicas=1").returncode == 0,
        30,
    )
    for args in (("status",), ("status", "--check")):
        asked = time.monotonic()
        status = cluster.stack.hk3s(*args)
        print(f"{' '.join(args)} {time.monotonic() - asked:.1f} s")
        assert status.returncode == 0, status.output + status.stderr
        said = status.output
        assert "Deployment default/held-app" in said and f"held stopped by the fence of {w1.name}" in said, said
        assert "runs anyway" in said and start in said, said

    # The binding back; a scale down is never refused; `workload start` still starts it.
    meta = binding["metadata"]
    again = {"apiVersion": binding["apiVersion"], "kind": binding["kind"], "metadata": {"name": meta["name"]}}
    (server.root / "root/binding.json").write_text(json.dumps({**again, "spec": binding["spec"]}))
    cluster.kubectl("create", "-f", "/root/binding.json")
    wait_until(  # a server-side dry run goes through admission and changes nothing
        "a scale up refused again",
        lambda: as_user(cluster, "scale", "deployment", "held-app", "--replicas=2", "--dry-run=server").returncode != 0,
        30,
    )
    assert as_user(cluster, "scale", "deployment", "held-app", "--replicas=0").returncode == 0
    started = cluster.stack.hk3s("workload", "start", "default/Deployment/held-app", "--accept-stale-data", "--yes")
    assert started.returncode == 0, started.output + started.stderr
    held = cluster.get("deployment", "held-app")
    assert held["spec"]["replicas"] == 1 and STOPPED_ANNOTATION not in held["metadata"].get("annotations", {})
    # No hold is left on it: a scale is a scale again.
    assert as_user(cluster, "scale", "deployment", "held-app", "--replicas=2").returncode == 0
    w2.run(["systemctl", "start", "k3s-agent"])
