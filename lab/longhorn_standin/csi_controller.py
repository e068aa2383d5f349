"""The controller side of Longhorn's CSI driver, for the Longhorn stand-in (LAB ONLY, never shipped).

On a real cluster Longhorn's driver deployer runs the Kubernetes CSI sidecars csi-provisioner and
csi-attacher beside Longhorn's CSI controller server (longhorn-manager `csi/controller_server.go`);
here one pass of :class:`CsiController` plays both sidecars and the server, through the real
Kubernetes API, beside the manager stand-in (manager.py runs it after each of its own passes).
The node side is the lab's CSI node plugin (csi/main.go), which the real kubelet calls.

Each behaviour and the source it follows:

* **Provisioning** (kubernetes-csi external-provisioner, Longhorn's `CreateVolume`): a
  PersistentVolumeClaim that the real PV controller handed to the driver (annotation
  `volume.kubernetes.io/storage-provisioner: driver.longhorn.io`, which the PV controller sets for
  a storage class whose provisioner is an out-of-tree driver), still unbound, of a storage class
  whose provisioner is `driver.longhorn.io`, gets a Longhorn volume named `pvc-<claim uid>` (the
  provisioner's name for it) of the claim's requested size rounded up to Longhorn's 2 MiB size
  alignment (`util.RoundUpSize`), with `numberOfReplicas`, `nodeSelector` (comma-separated tags),
  `dataLocality`, `replicaAutoBalance` and `staleReplicaTimeout` from the class's parameters.
  Once the manager has made the volume (state `detached`, as Longhorn's `CreateVolume` waits
  for), a PersistentVolume of that name: `csi.driver` the driver, `csi.volumeHandle` the volume's
  name, `csi.fsType` `ext4` (Longhorn runs the provisioner with `--default-fstype=ext4`),
  `csi.volumeAttributes` the class's parameters (Longhorn returns them as the volume context),
  the claim's access modes, the class's reclaim policy (default Delete) and mount options, the
  claim referenced by `claimRef` and the annotation `pv.kubernetes.io/provisioned-by`. The real PV
  controller then binds the two.
* **Deletion** (external-provisioner, Longhorn's `DeleteVolume`): a PersistentVolume the driver
  provisioned whose claim is gone (`Released`) and whose reclaim policy is Delete: its Longhorn
  volume is deleted once no VolumeAttachment names the PV and the volume is detached, then the PV.
  A Retain PV and its volume stay.
* **Attaching** (kubernetes-csi external-attacher `csi_handler.go`, Longhorn's
  `ControllerPublishVolume`): a VolumeAttachment with `spec.attacher: driver.longhorn.io` (made
  by the real attach/detach controller) gets the finalizer `external-attacher/driver-longhorn-io`,
  as its PersistentVolume does; the node's ID is read from the node's CSINode object (written by
  the kubelet when it registered the node plugin): without it the attachment fails
  (`status.attachError`), as it does on a node whose plugin is not running. The Longhorn volume is
  then attached to that node by its `spec.nodeID` (Longhorn's attachment controller does the
  same for its CSI attachment ticket); a volume attached to another node is refused (Longhorn
  volumes are ReadWriteOnce). `status.attached` turns true once the volume's status says it is
  attached on that node.
* **Detaching** (external-attacher, Longhorn's `ControllerUnpublishVolume`): a VolumeAttachment
  being deleted: the volume's `spec.nodeID` is cleared if it is that node, and once its status no
  longer shows it attached there, the finalizer comes off (so the VolumeAttachment goes). The PV's
  finalizer comes off once the PV is being deleted and no VolumeAttachment names it.
* **The engine's device** (the data plane is not modelled): while a volume is attached on a node,
  the file `/dev/longhorn/<volume>` exists in that lab host, where Longhorn's engine makes the
  block device; it is removed once the volume is attached elsewhere or detached. The node plugin
  stages a volume only while it is there.

Not modelled: topology, snapshots, clones, expansion, block volumes, RWX volumes, secrets, the
provisioner's capacity tracking, the external-provisioner's own PV finalizer and its retries with
back-off (a failed step is simply retried at the next pass).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.longhorn_standin.kube import LONGHORN_GROUP, Kube, KubeError

log = logging.getLogger("longhorn-standin-csi")

DRIVER = "driver.longhorn.io"
PROVISIONER_ANNOTATION = "volume.kubernetes.io/storage-provisioner"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ATTACHER_FINALIZER = "external-attacher/" + re.sub("[^a-zA-Z0-9-]", "-", DRIVER)
SIZE_ALIGNMENT = 2 << 20
DEVICE_DIR = "dev/longhorn"
STORAGE = "/apis/storage.k8s.io/v1"
#: The class parameters Longhorn's CreateVolume reads into the volume's spec, and their types.
VOLUME_PARAMETERS: dict[str, Callable[[str], Any]] = {
    "numberOfReplicas": int,
    "nodeSelector": lambda text: [t.strip() for t in text.split(",") if t.strip()],
    "dataLocality": str,
    "replicaAutoBalance": str,
    "staleReplicaTimeout": int,
}
_SUFFIXES = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}


def parse_quantity(text: str) -> int:
    """Bytes of a Kubernetes quantity such as ``16Mi`` or ``1G`` (the forms a claim's request takes)."""
    match = re.fullmatch(r"(\d+)([KMGT]i|[kMGT])?", text.strip())
    if match is None:
        raise ValueError(f"unsupported quantity {text!r}")
    return int(match.group(1)) * _SUFFIXES.get(match.group(2) or "", 1)


def aligned(size: int) -> int:
    """Longhorn's util.RoundUpSize: up to a multiple of 2 MiB."""
    return max(SIZE_ALIGNMENT, -(-size // SIZE_ALIGNMENT) * SIZE_ALIGNMENT)


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CsiController:
    """One pass of the CSI controller roles in the module docstring."""

    def __init__(self, kube: Kube, host_root: Callable[[str], Path | None]) -> None:
        self.kube = kube
        self.host_root = host_root

    def run_once(self) -> None:
        try:
            volumes = {v["metadata"]["name"]: v for v in self.kube.items(f"{LONGHORN_GROUP}/volumes")}
        except KubeError as err:
            if err.status == 404:
                return  # Longhorn's CRDs are not installed yet
            raise
        classes = {
            c["metadata"]["name"]: c
            for c in self.kube.items(f"{STORAGE}/storageclasses")
            if c.get("provisioner") == DRIVER
        }
        pvs = {p["metadata"]["name"]: p for p in self.kube.items("/api/v1/persistentvolumes")}
        attachments = [
            a for a in self.kube.items(f"{STORAGE}/volumeattachments") if a["spec"].get("attacher") == DRIVER
        ]
        for claim in self.kube.items("/api/v1/persistentvolumeclaims"):
            self.provision(claim, classes, pvs, volumes)
        for attachment in attachments:
            self.sync_attachment(attachment, pvs, volumes)
        self.delete_released(pvs, volumes, attachments)
        self.sync_devices(volumes)

    # ---- provisioning

    def provision(
        self, claim: dict[str, Any], classes: dict[str, Any], pvs: dict[str, Any], volumes: dict[str, Any]
    ) -> None:
        meta, spec = claim["metadata"], claim.get("spec", {})
        if (meta.get("annotations") or {}).get(PROVISIONER_ANNOTATION) != DRIVER or spec.get("volumeName"):
            return
        storage_class = classes.get(spec.get("storageClassName") or "")
        name = f"pvc-{meta['uid']}"
        if storage_class is None or meta.get("deletionTimestamp") or name in pvs:
            return
        parameters = dict(storage_class.get("parameters") or {})
        size = aligned(parse_quantity(spec["resources"]["requests"]["storage"]))
        volume = volumes.get(name)
        if volume is None:
            body = {
                "apiVersion": "longhorn.io/v1beta2",
                "kind": "Volume",
                "metadata": {"name": name, "namespace": "longhorn-system"},
                "spec": {
                    "size": str(size),
                    "frontend": "blockdev",
                    "accessMode": "rwo",
                    **{k: convert(parameters[k]) for k, convert in VOLUME_PARAMETERS.items() if k in parameters},
                },
            }
            self.kube.create(f"{LONGHORN_GROUP}/volumes", body)
            log.info("volume %s created for claim %s/%s", name, meta["namespace"], meta["name"])
            return
        if (volume.get("status") or {}).get("state") != "detached":
            return  # Longhorn's CreateVolume waits until the volume is made
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {PROVISIONED_BY: DRIVER}},
            "spec": {
                "capacity": {"storage": str(size)},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
                "storageClassName": storage_class["metadata"]["name"],
                "mountOptions": storage_class.get("mountOptions") or [],
                "volumeMode": spec.get("volumeMode") or "Filesystem",
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                "csi": {"driver": DRIVER, "volumeHandle": name, "fsType": "ext4", "volumeAttributes": parameters},
            },
        }
        pvs[name] = self.kube.create("/api/v1/persistentvolumes", pv)
        log.info("persistent volume %s made for claim %s/%s", name, meta["namespace"], meta["name"])

    def delete_released(self, pvs: dict[str, Any], volumes: dict[str, Any], attachments: list[dict[str, Any]]) -> None:
        named = {a["spec"].get("source", {}).get("persistentVolumeName") for a in attachments}
        for name, pv in pvs.items():
            meta, spec = pv["metadata"], pv.get("spec", {})
            if (meta.get("annotations") or {}).get(PROVISIONED_BY) != DRIVER:
                continue
            if meta.get("deletionTimestamp") and ATTACHER_FINALIZER in (meta.get("finalizers") or []):
                if name not in named:
                    self.drop_finalizer(f"/api/v1/persistentvolumes/{name}", pv)
                continue
            released = (pv.get("status") or {}).get("phase") == "Released"
            if not released or spec.get("persistentVolumeReclaimPolicy") != "Delete" or name in named:
                continue
            handle = spec.get("csi", {}).get("volumeHandle", "")
            volume = volumes.get(handle)
            if volume is not None:
                if volume.get("spec", {}).get("nodeID") or (volume.get("status") or {}).get("state") == "attached":
                    continue
                self.kube.delete(f"{LONGHORN_GROUP}/volumes/{handle}")
                log.info("volume %s deleted (its claim is gone, reclaim policy Delete)", handle)
                continue
            self.kube.delete(f"/api/v1/persistentvolumes/{name}")
            log.info("persistent volume %s deleted", name)

    # ---- attaching

    def sync_attachment(self, attachment: dict[str, Any], pvs: dict[str, Any], volumes: dict[str, Any]) -> None:
        meta, spec = attachment["metadata"], attachment["spec"]
        node = spec.get("nodeName", "")
        pv = pvs.get(spec.get("source", {}).get("persistentVolumeName") or "")
        handle = (pv or {}).get("spec", {}).get("csi", {}).get("volumeHandle", "")
        volume = volumes.get(handle)
        if meta.get("deletionTimestamp"):
            self.detach(attachment, node, handle, volume)
            return
        if ATTACHER_FINALIZER not in (meta.get("finalizers") or []):
            attachment = self.add_finalizer(f"{STORAGE}/volumeattachments/{meta['name']}", attachment)
        if pv is not None and ATTACHER_FINALIZER not in (pv["metadata"].get("finalizers") or []):
            pvs[pv["metadata"]["name"]] = self.add_finalizer(f"/api/v1/persistentvolumes/{pv['metadata']['name']}", pv)
        node_id = self.node_id(node)
        if node_id is None:
            self.attach_error(attachment, f"CSINode {node} does not contain driver {DRIVER}")
            return
        if volume is None:
            self.attach_error(attachment, f"volume {handle or '(no PV)'} not found")
            return
        wanted = volume.get("spec", {}).get("nodeID") or ""
        if wanted and wanted != node_id:
            self.attach_error(attachment, f"volume {handle} is attached to node {wanted}, not {node_id}")
            return
        if not wanted:
            self.kube.patch(f"{LONGHORN_GROUP}/volumes/{handle}", {"spec": {"nodeID": node_id}})
            log.info("volume %s attaching to %s", handle, node_id)
            return
        status = volume.get("status") or {}
        attached = status.get("state") == "attached" and status.get("currentNodeID") == node_id
        if attached and not (attachment.get("status") or {}).get("attached"):
            self.kube.patch(
                f"{STORAGE}/volumeattachments/{meta['name']}/status",
                {"status": {"attached": True, "attachmentMetadata": None, "attachError": None}},
            )
            log.info("volume %s attached to %s (%s)", handle, node_id, meta["name"])

    def detach(self, attachment: dict[str, Any], node: str, handle: str, volume: dict[str, Any] | None) -> None:
        if ATTACHER_FINALIZER not in (attachment["metadata"].get("finalizers") or []):
            return
        if volume is not None:
            if volume.get("spec", {}).get("nodeID") == node:
                self.kube.patch(f"{LONGHORN_GROUP}/volumes/{handle}", {"spec": {"nodeID": ""}})
                log.info("volume %s detaching from %s", handle, node)
                return
            if (volume.get("status") or {}).get("currentNodeID") == node:
                return  # Longhorn's ControllerUnpublishVolume waits for the detachment
        self.drop_finalizer(f"{STORAGE}/volumeattachments/{attachment['metadata']['name']}", attachment)
        log.info("volume %s detached from %s (%s)", handle, node, attachment["metadata"]["name"])

    def node_id(self, node: str) -> str | None:
        """The node's ID for the driver, from its CSINode (as the external-attacher reads it)."""
        try:
            csinode = self.kube.request("GET", f"{STORAGE}/csinodes/{node}")
        except KubeError as err:
            if err.status == 404:
                return None
            raise
        for driver in (csinode.get("spec") or {}).get("drivers") or []:
            if driver.get("name") == DRIVER:
                return str(driver["nodeID"])
        return None

    def attach_error(self, attachment: dict[str, Any], message: str) -> None:
        error = (attachment.get("status") or {}).get("attachError") or {}
        if error.get("message") == message:
            return
        status = {"attached": False, "attachError": {"time": now_text(), "message": message}}
        self.kube.patch(f"{STORAGE}/volumeattachments/{attachment['metadata']['name']}/status", {"status": status})
        log.info("attachment %s: %s", attachment["metadata"]["name"], message)

    def add_finalizer(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        finalizers = [*(obj["metadata"].get("finalizers") or []), ATTACHER_FINALIZER]
        return self.kube.patch(
            path, {"metadata": {"finalizers": finalizers, "resourceVersion": obj["metadata"]["resourceVersion"]}}
        )

    def drop_finalizer(self, path: str, obj: dict[str, Any]) -> None:
        finalizers = [f for f in obj["metadata"].get("finalizers") or [] if f != ATTACHER_FINALIZER]
        self.kube.patch(
            path, {"metadata": {"finalizers": finalizers, "resourceVersion": obj["metadata"]["resourceVersion"]}}
        )

    # ---- the engine's device

    def sync_devices(self, volumes: dict[str, Any]) -> None:
        """`/dev/longhorn/<volume>` in the host each volume is attached on, and nowhere else."""
        attached_on: dict[str, set[str]] = {}
        for name, volume in volumes.items():
            status = volume.get("status") or {}
            if status.get("state") == "attached" and status.get("currentNodeID"):
                attached_on.setdefault(status["currentNodeID"], set()).add(name)
        for node in {n["metadata"]["name"] for n in self.kube.items("/api/v1/nodes")}:
            root = self.host_root(node)
            if root is None:
                continue
            devices = root / DEVICE_DIR
            wanted = attached_on.get(node, set())
            present = {p.name for p in devices.iterdir()} if devices.is_dir() else set()
            for name in wanted - present:
                devices.mkdir(parents=True, exist_ok=True)
                (devices / name).touch()
                log.info("engine device of %s up on %s", name, node)
            for name in present - wanted:
                (devices / name).unlink(missing_ok=True)
                log.info("engine device of %s gone from %s", name, node)
