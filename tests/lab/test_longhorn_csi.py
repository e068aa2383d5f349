"""A pod using a one-copy Longhorn volume runs on a worker while the volume's only copy is on the
server, through the real engine and Longhorn's CSI path as the lab models it.

Real parts: the Pulumi engine and Kubernetes provider (the product installs the Longhorn stand-in
chart with its CSIDriver, and the storage classes), the kube-apiserver, the kube-controller-manager
(the PV controller hands the claim to the driver and binds it; the attach/detach controller makes
and deletes the VolumeAttachment) and the kubelet, containerd and runc of a pod-capable worker
(the kubelet registers the node plugin, stages, publishes, unpublishes and unstages the volume).
Lab stand-ins: Longhorn's manager and the CSI controller sidecars (lab/longhorn_standin/manager.py,
csi_controller.py) and Longhorn's CSI node plugin (lab/longhorn_standin/csi), each reached only
through the real part's own API.

One cluster for the module (the tests run in order): the server, whose Longhorn disk is a small
FUSE filesystem (a plain lab host's disk is this machine's, which may be fuller than Longhorn's
minimal-available rule allows), and a pod-capable worker.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

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
    worker_spec,
)

pytestmark = pytest.mark.lab

K3S = "/usr/local/bin/k3s"
DRIVER = "driver.longhorn.io"
PLUGIN_UNIT = "hk3s-lab-longhorn-csi@k3s-agent.service"
T = TypeVar("T")
CLAIM = """apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: hk3s-one-copy
  resources: {requests: {storage: 16Mi}}
"""
# The pod can only run on the worker; it writes a file into the volume, then waits.
POD = """apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: default}
spec:
  nodeSelector: {kubernetes.io/hostname: WORKER}
  terminationGracePeriodSeconds: 1
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
  containers:
    - name: app
      image: IMAGE
      imagePullPolicy: Never
      command: ["sh", "-c", "echo NAME >> /data/written-by && sync && exec sleep 3600"]
      volumeMounts: [{name: data, mountPath: /data}]
"""


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, diagnose: Callable[[], str] = lambda: "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{diagnose()}")
        time.sleep(1)


@dataclass
class Cluster:
    lab: Lab
    server: Host
    worker: Host
    stack: LabStack
    image: str

    def kubectl(self, *args: str, check: bool = True) -> str:
        return self.server.run([K3S, "kubectl", *args], timeout=60, check=check).stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def apply(self, text: str) -> None:
        (self.server.root / "root/apply.yaml").write_text(text)
        self.kubectl("apply", "-f", "/root/apply.yaml")

    def start_pod(self, name: str) -> None:
        self.apply(POD.replace("NAME", name).replace("WORKER", self.worker.name).replace("IMAGE", self.image))

    def pod_phase(self, name: str) -> str:
        found = self.get("pods", "-n", "default", "--field-selector", f"metadata.name={name}")["items"]
        return str(found[0]["status"].get("phase", "")) if found else ""

    def attachments(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("volumeattachments")["items"]
        return items

    def volume_name(self) -> str:
        return str(self.get("pvc", "-n", "default", "data")["spec"].get("volumeName") or "")

    def longhorn(self, kind: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("-n", "longhorn-system", kind)["items"]
        return items

    def worker_mounts(self, volume: str) -> list[str]:
        """The worker's mount points of the volume: the pod's (named by the PV) and the kubelet's
        staging path (named by the SHA-256 of the volume handle, as the kubelet names it)."""
        digest = hashlib.sha256(volume.encode()).hexdigest()
        mounts = [line.split()[1] for line in self.worker.run(["cat", "/proc/self/mounts"]).stdout.splitlines()]
        return [m for m in mounts if volume in m or digest in m]

    def diagnose(self) -> str:
        plugin = self.worker.run(["journalctl", "-u", PLUGIN_UNIT, "-n", "30", "--no-pager"], check=False)
        return "\n".join(
            [
                self.kubectl("get", "pods,pvc,pv,volumeattachments", "-A", "-o", "wide", check=False),
                self.kubectl("describe", "pods", "-n", "default", check=False)[-3000:],
                plugin.stdout,
            ]
        )


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    skip_without_kubernetes_provider()
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    server = lab.add_host(server_spec("lv-server", disk_sync_delay_ms=0))
    worker = lab.add_host(worker_spec("lv-worker", pods=True))
    lab.wait_ssh_ready([server, worker])
    pod_hosts.place_airgap_images(worker.root, DEFAULT_CACHE_DIR)  # before k3s, as k3s's air-gap steps say
    storage = {"install_longhorn": True, "longhorn_chart": str(LONGHORN_STANDIN_CHART), "max_copies": 1}
    config = base_config(lab, server, [worker], storage=storage)
    stack = LabStack(tmp_path_factory.mktemp("longhorn-csi-stack"))
    stack.write_config(config)
    up_or_fail(stack)
    image = pod_hosts.busybox_image()
    wait_for(
        "the worker imports the air-gap images",
        lambda: image in worker.run([K3S, "ctr", "images", "ls", "-q"]).stdout,
        60,
    )
    return Cluster(lab, server, worker, stack, image)


def test_a_pod_on_the_worker_uses_a_volume_whose_only_copy_is_on_the_server(cluster: Cluster) -> None:
    server, worker = cluster.server, cluster.worker
    cluster.apply(CLAIM)
    cluster.start_pod("writer")
    wait_for("the pod Running", lambda: cluster.pod_phase("writer") == "Running", 240, cluster.diagnose)
    pod = cluster.get("pod", "-n", "default", "writer")
    assert pod["spec"]["nodeName"] == worker.name
    volume = cluster.volume_name()
    pv = cluster.get("pv", volume)
    assert pv["spec"]["csi"]["driver"] == DRIVER and pv["spec"]["csi"]["volumeHandle"] == volume, pv["spec"]

    # The pod wrote into the volume the kubelet mounted through the node plugin.
    written = cluster.kubectl("exec", "-n", "default", "writer", "--", "cat", "/data/written-by")
    assert written.split() == ["writer"], written
    on_disk = worker.run(["cat", f"/var/lib/longhorn/lab-csi/{volume}/written-by"]).stdout
    assert on_disk.split() == ["writer"], on_disk
    mounts = cluster.worker_mounts(volume)
    assert any(m.startswith("/var/lib/kubelet/pods/") and m.endswith(f"/{volume}/mount") for m in mounts), mounts
    staging = f"/var/lib/kubelet/plugins/kubernetes.io/csi/{DRIVER}/{hashlib.sha256(volume.encode()).hexdigest()}"
    assert f"{staging}/globalmount" in mounts, mounts

    # The volume's one copy is on the server; the volume is attached on the worker.
    replicas = [r for r in cluster.longhorn("replicas.longhorn.io") if r["spec"]["volumeName"] == volume]
    assert [r["spec"]["nodeID"] for r in replicas] == [server.name], replicas
    longhorn_volume = next(v for v in cluster.longhorn("volumes.longhorn.io") if v["metadata"]["name"] == volume)
    assert longhorn_volume["status"]["state"] == "attached"
    assert longhorn_volume["status"]["currentNodeID"] == worker.name

    # The VolumeAttachment is the attach/detach controller's: named as its CSI attacher names it.
    expected = "csi-" + hashlib.sha256(f"{volume}{DRIVER}{worker.name}".encode()).hexdigest()
    attachments = cluster.attachments()
    assert [a["metadata"]["name"] for a in attachments] == [expected], attachments
    attachment = attachments[0]
    assert attachment["spec"]["nodeName"] == worker.name and attachment["spec"]["attacher"] == DRIVER
    assert attachment["spec"]["source"]["persistentVolumeName"] == volume
    assert attachment["status"]["attached"] is True, attachment["status"]

    # The pod gone: unmounted on the worker, the VolumeAttachment deleted, the volume detached.
    cluster.kubectl("delete", "pod", "-n", "default", "writer", "--wait=true", "--timeout=120s")
    wait_for("the VolumeAttachment gone", lambda: not cluster.attachments(), 120, cluster.diagnose)
    assert cluster.worker_mounts(volume) == []
    assert worker.run(["test", "-e", f"/dev/longhorn/{volume}"], check=False).returncode != 0
    detached = next(v for v in cluster.longhorn("volumes.longhorn.io") if v["metadata"]["name"] == volume)
    assert detached["status"]["state"] == "detached" and not detached["spec"].get("nodeID"), detached


def test_without_the_node_plugin_the_pod_waits_and_its_volume_is_not_attached(cluster: Cluster) -> None:
    """The path depends on the node plugin: with it stopped, the kubelet deregisters the driver, the
    attachment fails (the node's CSINode names no Longhorn driver) and the pod does not start; with
    it back the pod starts and finds what the first pod wrote."""
    worker = cluster.worker
    worker.run(["systemctl", "stop", PLUGIN_UNIT])

    def deregistered() -> bool:
        drivers = cluster.get("csinode", worker.name)["spec"].get("drivers") or []
        return all(d["name"] != DRIVER for d in drivers)

    wait_for("the kubelet to deregister the driver", deregistered, 60, cluster.diagnose)
    cluster.start_pod("reader")

    def attach_error() -> str:
        found = cluster.attachments()
        return str(((found[0].get("status") or {}).get("attachError") or {}).get("message", "")) if found else ""

    message = wait_for("the attachment to fail", attach_error, 120, cluster.diagnose)
    assert f"CSINode {worker.name} does not contain driver {DRIVER}" in message
    time.sleep(10)
    assert cluster.pod_phase("reader") == "Pending", cluster.diagnose()
    assert not cluster.attachments()[0].get("status", {}).get("attached")

    worker.run(["systemctl", "start", PLUGIN_UNIT])
    wait_for("the pod Running", lambda: cluster.pod_phase("reader") == "Running", 240, cluster.diagnose)
    written = cluster.kubectl("exec", "-n", "default", "reader", "--", "cat", "/data/written-by")
    assert written.split() == ["writer", "reader"], written
    cluster.kubectl("delete", "pod", "-n", "default", "reader", "--wait=true", "--timeout=120s")
    wait_for("the VolumeAttachment gone", lambda: not cluster.attachments(), 120, cluster.diagnose)
