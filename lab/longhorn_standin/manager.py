"""Longhorn manager stand-in (LAB ONLY, never shipped): a small controller that does, through the
real Kubernetes API, what the product relies on Longhorn's manager for. Longhorn's images cannot
be fetched here; its CRDs and Settings come from the stand-in chart (chart/), this process plays
the manager's part. The lab starts it (lab/stack_harness.py `ensure_longhorn_manager`) when a
lab stack installs Longhorn, and the lab's teardown stops it (its command line names the lab's
run directory).

Each pass (every `--interval` seconds) reads Settings, Kubernetes Nodes, Longhorn Nodes,
Volumes and Replicas, and does what follows. Each behaviour and the Longhorn source it follows
(longhorn-manager 1.9; `controller/`, `scheduler/`, `types/`, `k8s/pkg/apis/longhorn/v1beta2/`):

* **A Longhorn node per Kubernetes node** (`controller/node_controller.go`, the manager
  DaemonSet): created, same name, in longhorn-system, once the Kubernetes node is Ready and
  carries no taint a DaemonSet pod does not tolerate by default (Longhorn's manager pod is a
  DaemonSet pod with no tolerations of its own while the `taint-toleration` setting is empty:
  a node under the join's NoSchedule validation taint gets no manager pod, so no Longhorn
  node). Its default disk (`create-default-disk-labeled-nodes` false: every node gets one) is
  `/var/lib/longhorn`, `allowScheduling: true`, `storageReserved` =
  `storage-reserved-percentage-for-default-disk` of the disk's size when the disk is made.
* **Node and disk status** (`node_controller.go` `syncDiskStatus`/`syncNodeStatus`):
  `diskStatus` with the host's real figures (statvfs of the host's `/var/lib/longhorn`:
  `storageMaximum` = blocks x fragment size, `storageAvailable` = blocks free to unprivileged
  users x fragment size), `storageScheduled` and `scheduledReplica` from the replicas placed on
  it; the disk's `Schedulable` condition False with reason `DiskPressure` when no replica could
  be placed on it (`IsSchedulableToDisk(0, 0)`). Node condition `Ready` follows the Kubernetes
  node's Ready (reason `KubernetesNodeNotReady`), `Schedulable` is False with reason
  `KubernetesNodeCordoned` while the node is cordoned and `disable-scheduling-on-cordoned-node`
  is true (its default).
* **Replicas for each Volume** (`controller/volume_controller.go` `replenishReplicas`,
  `reconcileVolumeCondition`; `scheduler/replica_scheduler.go`): a new volume gets
  `numberOfReplicas` replica objects at once, placed or not. A replica is placed only on a node
  that is Ready, Schedulable and `allowScheduling`, whose tags hold every tag of the volume's
  `nodeSelector`, on a disk that allows scheduling, is not being evicted (nor is its node), and
  has room: `storageAvailable - size > storageMaximum x storage-minimal-available-percentage`
  and `storageScheduled + size <= (storageMaximum - storageReserved) x
  storage-over-provisioning-percentage` (`IsSchedulableToDisk`); never on a node that already
  holds a replica of the volume (`replica-soft-anti-affinity` false; the stand-in refuses to
  run with it true). Among the candidates, the disk with the most room left. A replica that
  cannot be placed stays unplaced and is placed when a node becomes eligible.
* **The volume's `Scheduled` condition** (`reconcileVolumeCondition`): True when every replica
  is placed; else False, reason `ReplicaSchedulingFailure`, the message Longhorn's scheduler
  errors joined (`insufficient storage`, `disks are unavailable`, `nodes are unavailable`;
  `replica scheduling failed` when the candidates were only filtered out, as by tags or
  anti-affinity). As Longhorn does, a volume that is not attached and has at least one placed,
  unfailed replica reads True ("Reset schedulable due to allow volume creation with degraded
  availability") while `allow-volume-creation-with-degraded-availability` is true.
* **Volume status** (`volume_controller.go` `ReconcileVolumeState`): `state` `creating` (no
  replica yet), `attached` (its `spec.nodeID` set, the node up and a healthy replica) or
  `detached`; `currentNodeID` the node it is attached on; `robustness` `healthy`, `degraded`
  (fewer healthy replicas than `numberOfReplicas`; `lastDegradedAt` recorded) or `faulted`
  (none) while attached, `unknown` while detached.
* **Eviction** (`volume_controller.go` replica eviction; `scheduler` `onlyEvictingNodes`): a
  replica on a node or disk with `evictionRequested: true` is not counted as one of the
  volume's copies, so a new replica is made and placed elsewhere by the rules above; once it is
  healthy, the evicted replica is deleted. When no other node can take it, the new replica
  stays unplaced and the old one stays: the eviction waits.
* **The engine** (`controller/volume_controller.go` `openVolumeDependentResources`,
  `closeVolumeDependentResources`; `controller/instance_handler.go`
  `syncStatusWithInstanceManager`): one Engine per volume, `<volume>-e-0`, owned by it. A volume
  attached by its `spec.nodeID` starts its engine there (`spec.nodeID`, `status.started`,
  `status.currentState: running`, `status.replicaModeMap` `RW` for each healthy copy and `ERR`
  for a failed one) once that node is up and a healthy copy exists; a detach (`spec.nodeID`
  cleared) stops it (`stopped`, its node cleared), on a down node too (an instance not started
  reads stopped). **An engine whose node goes down reads `unknown`**: Longhorn's instance
  handler marks a started instance `InstanceStateUnknown` when its instance manager is unknown
  ("Marking the instance as state UNKNOWN since the related node ... is down or deleted"), and
  `ReconcileEngineReplicaState` returns at once for an engine in that state, so no copy of the
  volume is marked failed or healthy while it lasts: every copy keeps the fields the engine
  last reported (the engine itself may go on writing to the copies it still reaches and drop
  the others, unseen). The volume stays `attached` on that node, robustness `unknown`, and is
  not rebuilt. The engine reads `running` again once its node is back.
* **A replica on a node that goes down fails** while Longhorn can see it: with the volume's
  engine running on a node that is up, its data plane reports the copy `ERR`
  (`ReconcileEngineReplicaState` sets `failedAt`); with the volume not attached, at once
  (stricter than Longhorn, which marks it when the volume next attaches: `openVolumeDependentResources`,
  `canInstanceManagerLaunchReplica`). Never while the engine is `unknown` (above). `failedAt` and
  `lastFailedAt` set (`lastFailedAt` is never cleared; `healthyAt` is left as it was, since
  Longhorn clears it only before a rebuild: `replica.go`). **Rebuilt only as Longhorn does**
  (`scheduler.RequireNewReplica`): while the failed replica could be reused (its node and disk
  known, not evicted, fewer than 5 rebuild retries), no new replica is made until
  `replica-replenishment-wait-interval` (600 s by default) has passed since the volume became
  degraded; a failed replica whose node is back is reused (rebuilt: `failedAt` cleared,
  `healthyAt` set again) when another healthy replica exists to rebuild from. Rebuilds happen
  only for an attached volume, as in Longhorn (a detached volume is rebuilt at its next attach).
* **Health** (the data plane is not modeled): a placed replica on an up node is healthy
  (`healthyAt`, `lastHealthyAt`, `status.currentState: running`) at once when the volume holds
  no data yet (no replica of it was ever healthy), else once a healthy replica of the volume
  exists to rebuild it from and the volume is attached or the replica replaces an evicted one
  (Longhorn attaches a detached volume for an eviction).

What it does not model (see README.md): the data plane (the engine's process, instance managers, actual data;
a replica placed on a Ready node of an attached volume, or made for an eviction, is in sync at
once: rebuilds take no time), Longhorn's VolumeAttachment tickets (a volume is attached by
setting its `spec.nodeID`, as Longhorn's attachment controller does), auto-salvage, the removal
of stale failed replicas or of replicas beyond `numberOfReplicas`, zones, disk tags and the
`diskSelector`, data locality, replica auto-balance, backing images, and the deletion of
Longhorn nodes (the product deletes them). The CSI driver's controller side is csi_controller.py,
run after each pass; its node side is the lab's node plugin (csi/main.go).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lab.longhorn_standin.csi_controller import CsiController
from lab.longhorn_standin.kube import LONGHORN_GROUP, Kube, KubeError

log = logging.getLogger("longhorn-standin-manager")

DEFAULT_DISK_PATH = "/var/lib/longhorn"
#: Longhorn's defaults (types/setting.go) for the settings the manager reads, used while a Setting
#: object does not exist yet.
SETTING_DEFAULTS = {
    "storage-reserved-percentage-for-default-disk": "30",
    "storage-minimal-available-percentage": "25",
    "storage-over-provisioning-percentage": "100",
    "replica-soft-anti-affinity": "false",
    "allow-volume-creation-with-degraded-availability": "true",
    "replica-replenishment-wait-interval": "600",
    "disable-scheduling-on-cordoned-node": "true",
}
#: Taints a DaemonSet pod tolerates without being told (Kubernetes' DaemonSet controller adds
#: these tolerations to every DaemonSet pod).
DAEMONSET_TOLERATED = {
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/unschedulable",
}
FAILED_REPLICA_MAX_RETRY_COUNT = 5
DEGRADED_RESET_MESSAGE = "Reset schedulable due to allow volume creation with degraded availability"


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def as_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "t", "true")


def condition(conditions: Iterable[dict[str, Any]] | None, kind: str) -> dict[str, Any]:
    for item in conditions or []:
        if item.get("type") == kind:
            return item
    return {}


def set_condition(conditions: list[dict[str, Any]], kind: str, status: str, reason: str, message: str) -> None:
    """Set one condition; its transition time moves only when its status changes (as Longhorn's
    types.SetCondition)."""
    for item in conditions:
        if item.get("type") == kind:
            if item.get("status") != status:
                item["lastTransitionTime"] = now_text()
            item.update(status=status, reason=reason, message=message)
            return
    conditions.append(
        {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now_text()}
    )


def volume_child_metadata(child: str, volume: dict[str, Any]) -> dict[str, Any]:
    """Metadata of an object of `volume` (its engine, a replica): in longhorn-system, labelled with
    the volume's name and owned by it, as longhorn-manager creates them."""
    name = volume["metadata"]["name"]
    return {
        "name": child,
        "namespace": "longhorn-system",
        "labels": {"longhornvolume": name},
        "ownerReferences": [
            {"apiVersion": "longhorn.io/v1beta2", "kind": "Volume", "name": name, "uid": volume["metadata"]["uid"]}
        ],
    }


@dataclass
class DiskFigures:
    maximum: int
    available: int
    fsid: int


def statvfs_figures(path: Path) -> DiskFigures | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return DiskFigures(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, st.f_fsid)


@dataclass
class HostDisks:
    """Where each node's `/var/lib/longhorn` is seen from this machine: a lab host's path inside
    its running container (through /proc/<its init>/root, so a disk mounted inside the host
    counts), or a directory given for a node by name."""

    lab_run_dir: Path | None = None
    fixed: dict[str, Path] = field(default_factory=dict)

    def path(self, node: str) -> Path | None:
        if node in self.fixed:
            return self.fixed[node]
        root = self.root(node)
        return None if root is None else root / DEFAULT_DISK_PATH.lstrip("/")

    def root(self, node: str) -> Path | None:
        """The running lab host's root directory, seen through its init's /proc entry."""
        if self.lab_run_dir is None:
            return None
        from lab.hosts.processes import _container_leader  # noqa: PLC0415

        try:
            nspawn = int((self.lab_run_dir / "hosts" / node / "nspawn.pid").read_text())
        except (OSError, ValueError):
            return None
        leader = _container_leader(nspawn)
        if leader is None:
            return None
        return Path(f"/proc/{leader}/root")

    def figures(self, node: str) -> DiskFigures | None:
        path = self.path(node)
        if path is None:
            return None
        # Longhorn's manager creates the default disk's directory when it is missing.
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return statvfs_figures(path)


@dataclass
class World:
    """One pass's view of the cluster."""

    settings: dict[str, str]
    kube_nodes: dict[str, dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    volumes: dict[str, dict[str, Any]]
    replicas: dict[str, dict[str, Any]]
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)  # by its volume's name
    # The manager pods' tolerations (the chart's ConfigMap longhorn-manager-tolerations).
    manager_tolerations: list[dict[str, Any]] = field(default_factory=list)

    def setting(self, name: str) -> str:
        return self.settings.get(name, SETTING_DEFAULTS[name])

    def percent(self, name: str) -> int:
        return int(self.setting(name))

    def node_up(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and condition(node.get("status", {}).get("conditions"), "Ready").get("status") == "True"

    def volume_replicas(self, volume: str) -> list[dict[str, Any]]:
        return [r for r in self.replicas.values() if r.get("spec", {}).get("volumeName") == volume]

    def evicting(self, replica: dict[str, Any]) -> bool:
        """The replica sits on a node or disk whose eviction is requested."""
        spec = replica.get("spec", {})
        node = self.nodes.get(spec.get("nodeID") or "")
        if node is None:
            return False
        if node.get("spec", {}).get("evictionRequested"):
            return True
        for name, disk in (node.get("spec", {}).get("disks") or {}).items():
            uuid = node.get("status", {}).get("diskStatus", {}).get(name, {}).get("diskUUID")
            if uuid and uuid == spec.get("diskID") and disk.get("evictionRequested"):
                return True
        return False


class Manager:
    """The stand-in's controller: `run_once` is one pass of every behaviour in the module docstring."""

    #: How often a node's disk figures are read again (Longhorn's node controller also refreshes
    #: them on a period, not at every change).
    DISK_REFRESH_SECONDS = 30.0

    def __init__(self, kube: Kube, disks: HostDisks, clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.disks = disks
        self.clock = clock
        self._figures: dict[str, tuple[float, DiskFigures]] = {}

    def disk_figures(self, node: str) -> DiskFigures | None:
        cached = self._figures.get(node)
        if cached is not None and self.clock() - cached[0] < self.DISK_REFRESH_SECONDS:
            return cached[1]
        figures = self.disks.figures(node)
        if figures is not None:
            self._figures[node] = (self.clock(), figures)
        return figures

    # ---- reading

    def read_world(self) -> World | None:
        try:
            settings = {
                s["metadata"]["name"]: str(s.get("value", "")) for s in self.kube.items(f"{LONGHORN_GROUP}/settings")
            }
        except KubeError as err:
            if err.status == 404:
                return None  # Longhorn's CRDs are not installed yet
            raise
        by_name = lambda items: {i["metadata"]["name"]: i for i in items}  # noqa: E731
        return World(
            settings,
            by_name(self.kube.items("/api/v1/nodes")),
            by_name(self.kube.items(f"{LONGHORN_GROUP}/nodes")),
            by_name(self.kube.items(f"{LONGHORN_GROUP}/volumes")),
            by_name(self.kube.items(f"{LONGHORN_GROUP}/replicas")),
            {str(e.get("spec", {}).get("volumeName")): e for e in self.kube.items(f"{LONGHORN_GROUP}/engines")},
            self.manager_tolerations(),
        )

    def manager_tolerations(self) -> list[dict[str, Any]]:
        """The manager DaemonSet pods' tolerations, as the stand-in chart keeps them (none before
        the chart is installed)."""
        configmaps = self.kube.items("/api/v1/namespaces/longhorn-system/configmaps")
        for item in configmaps:
            if item["metadata"]["name"] == "longhorn-manager-tolerations":
                return list(json.loads((item.get("data") or {}).get("tolerations") or "[]") or [])
        return []

    def run_once(self) -> None:
        world = self.read_world()
        if world is None:
            return
        if as_bool(world.setting("replica-soft-anti-affinity")):
            log.error(
                "replica-soft-anti-affinity is true: the stand-in models only false (two copies never share a node)"
            )
            return
        self.sync_nodes(world)
        for volume in world.volumes.values():
            if volume.get("metadata", {}).get("deletionTimestamp"):
                continue
            self.sync_volume(world, volume)
        self.sync_node_status(world)

    # ---- nodes

    def sync_nodes(self, world: World) -> None:
        for name, kube_node in world.kube_nodes.items():
            if name in world.nodes or not runs_manager_pod(kube_node, world.manager_tolerations):
                continue
            figures = self.disk_figures(name)
            if figures is None:
                continue
            reserved = figures.maximum * world.percent("storage-reserved-percentage-for-default-disk") // 100
            body = {
                "apiVersion": "longhorn.io/v1beta2",
                "kind": "Node",
                "metadata": {"name": name, "namespace": "longhorn-system"},
                "spec": {
                    "name": name,
                    "allowScheduling": True,
                    "evictionRequested": False,
                    "tags": [],
                    "disks": {
                        f"default-disk-{figures.fsid & 0xFFFFFFFF:08x}": {
                            "path": DEFAULT_DISK_PATH,
                            "diskType": "filesystem",
                            "allowScheduling": True,
                            "evictionRequested": False,
                            "storageReserved": reserved,
                            "tags": [],
                        }
                    },
                },
            }
            created = self.kube.create(f"{LONGHORN_GROUP}/nodes", body)
            log.info("created Longhorn node %s", name)
            world.nodes[name] = created
            self.write_node_status(world, created)

    def sync_node_status(self, world: World) -> None:
        for node in list(world.nodes.values()):
            self.write_node_status(world, node)

    def write_node_status(self, world: World, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        status = dict(node.get("status") or {})
        conditions = [dict(c) for c in status.get("conditions") or []]
        kube_node = world.kube_nodes.get(name)
        ready = kube_node is not None and kube_ready(kube_node)
        set_condition(
            conditions,
            "Ready",
            "True" if ready else "False",
            "" if ready else ("KubernetesNodeNotReady" if kube_node else "KubernetesNodeGone"),
            "" if ready else f"Kubernetes node {name} not ready",
        )
        cordoned = bool(kube_node and kube_node.get("spec", {}).get("unschedulable"))
        blocked = cordoned and as_bool(world.setting("disable-scheduling-on-cordoned-node"))
        set_condition(
            conditions,
            "Schedulable",
            "False" if blocked else "True",
            "KubernetesNodeCordoned" if blocked else "",
            f"Node {name} is cordoned" if blocked else "",
        )
        disk_status = {k: dict(v) for k, v in (status.get("diskStatus") or {}).items()}
        figures = self.disk_figures(name) if ready else None
        for disk_name, disk in (node.get("spec", {}).get("disks") or {}).items():
            entry = disk_status.setdefault(disk_name, {})
            if figures is not None:
                entry["storageMaximum"] = figures.maximum
                entry["storageAvailable"] = figures.available
                entry["diskUUID"] = entry.get("diskUUID") or f"{name}-{disk_name}"
            placed = {
                r["metadata"]["name"]: int(r["spec"].get("volumeSize") or 0)
                for r in world.replicas.values()
                if r.get("spec", {}).get("nodeID") == name and r["spec"].get("diskID") == entry.get("diskUUID")
            }
            entry["scheduledReplica"] = placed
            entry["storageScheduled"] = sum(placed.values())
            disk_conditions = [dict(c) for c in entry.get("conditions") or []]
            has_figures = "storageMaximum" in entry
            set_condition(
                disk_conditions, "Ready", "True" if has_figures else "False", "" if has_figures else "NoDiskInfo", ""
            )
            room, why = disk_has_room(world, disk, entry, 0)
            set_condition(
                disk_conditions, "Schedulable", "True" if room else "False", "" if room else "DiskPressure", why
            )
            entry["conditions"] = disk_conditions
        new_status = {**status, "conditions": conditions, "diskStatus": disk_status}
        if new_status != node.get("status"):
            # A merge patch keeps map keys it does not name: a replica gone from a disk is named null.
            patch = {**new_status, "diskStatus": {k: dict(v) for k, v in disk_status.items()}}
            for disk_name, old in (status.get("diskStatus") or {}).items():
                gone = set(old.get("scheduledReplica") or {}) - set(
                    disk_status.get(disk_name, {}).get("scheduledReplica") or {}
                )
                if gone and disk_name in patch["diskStatus"]:
                    patch["diskStatus"][disk_name]["scheduledReplica"] = {
                        **patch["diskStatus"][disk_name]["scheduledReplica"],
                        **dict.fromkeys(gone),
                    }
            updated = self.kube.patch(f"{LONGHORN_GROUP}/nodes/{name}/status", {"status": patch})
            world.nodes[name] = updated

    # ---- volumes

    def sync_volume(self, world: World, volume: dict[str, Any]) -> None:
        name = volume["metadata"]["name"]
        spec = volume.get("spec", {})
        wanted = int(spec.get("numberOfReplicas") or 1)
        size = int(spec.get("size") or 0)
        status = dict(volume.get("status") or {})
        replicas = world.volume_replicas(name)
        attach_node = spec.get("nodeID") or ""
        engine = self.sync_engine(world, volume, replicas, attach_node)
        engine_state = engine.get("status", {}).get("currentState")
        if engine_state != "unknown":
            # Longhorn hears every copy only through a running engine (or none at all): an engine
            # in state unknown changes no copy (ReconcileEngineReplicaState returns at once).
            self.fail_replicas_on_down_nodes(world, replicas)
        attached = engine_state == "running" and any(healthy(r) for r in replicas)
        if not replicas:
            for _ in range(wanted):
                replicas.append(self.new_replica(world, volume, size))
        else:
            self.replenish(world, volume, replicas, wanted=wanted, size=size, attached=attached, status=status)
        errors = self.place(world, volume, replicas, size)
        self.mark_healthy(world, volume, replicas, attached)
        self.finish_evictions(world, replicas, wanted)
        replicas = world.volume_replicas(name)
        self.write_volume_status(
            volume,
            replicas,
            wanted=wanted,
            attached=attached,
            attach_node=attach_node,
            errors=errors,
            world=world,
            engine_unknown=engine_state == "unknown",
        )
        if engine_state == "running":
            self.write_replica_modes(engine, replicas)

    def sync_engine(
        self, world: World, volume: dict[str, Any], replicas: list[dict[str, Any]], attach_node: str
    ) -> dict[str, Any]:
        """The volume's engine, started, stopped or `unknown` as in the module docstring."""
        name = volume["metadata"]["name"]
        engine = world.engines.get(name)
        if engine is None:
            engine = self.kube.create(
                f"{LONGHORN_GROUP}/engines",
                {
                    "apiVersion": "longhorn.io/v1beta2",
                    "kind": "Engine",
                    "metadata": volume_child_metadata(f"{name}-e-0", volume),
                    "spec": {"volumeName": name, "nodeID": "", "desireState": "stopped"},
                },
            )
            world.engines[name] = engine
        spec, status = engine.get("spec", {}), dict(engine.get("status") or {})
        node = spec.get("nodeID") or ""
        if not attach_node or (node and node != attach_node):
            # closeVolumeDependentResources: the engine stops; an instance no longer started
            # reads stopped whether its node answers or not.
            new_spec = {"nodeID": "", "desireState": "stopped"}
            new_status = {"currentState": "stopped", "started": False, "replicaModeMap": None}
        elif status.get("started") and not world.node_up(node):
            new_spec = {"nodeID": node, "desireState": "running"}
            new_status = {"currentState": "unknown"}  # the modes stay as last reported
            if status.get("currentState") != "unknown":
                log.info("engine of %s unknown: its node %s is down", name, node)
        elif world.node_up(attach_node) and (status.get("started") or any(healthy(r) for r in replicas)):
            new_spec = {"nodeID": attach_node, "desireState": "running"}
            new_status = {"currentState": "running", "started": True}
        else:
            new_spec = {"nodeID": attach_node, "desireState": "running"}
            new_status = {"currentState": "stopped", "started": False}
        if {k: spec.get(k) for k in new_spec} != new_spec:
            engine = self.kube.patch(f"{LONGHORN_GROUP}/engines/{engine['metadata']['name']}", {"spec": new_spec})
        if any(status.get(k) != v for k, v in new_status.items()):
            engine = self.kube.patch(
                f"{LONGHORN_GROUP}/engines/{engine['metadata']['name']}/status", {"status": new_status}
            )
        world.engines[name] = engine
        return engine

    def write_replica_modes(self, engine: dict[str, Any], replicas: list[dict[str, Any]]) -> None:
        """A running engine's view of its copies: RW for a healthy one, ERR for a failed one."""
        modes = {
            r["metadata"]["name"]: ("ERR" if r["spec"].get("failedAt") else "RW")
            for r in replicas
            if r["spec"].get("nodeID") and r["spec"].get("healthyAt")
        }
        old = engine.get("status", {}).get("replicaModeMap") or {}
        if modes != old:
            gone = dict.fromkeys(set(old) - set(modes))
            self.kube.patch(
                f"{LONGHORN_GROUP}/engines/{engine['metadata']['name']}/status",
                {"status": {"replicaModeMap": {**gone, **modes}}},
            )

    def fail_replicas_on_down_nodes(self, world: World, replicas: list[dict[str, Any]]) -> None:
        for replica in replicas:
            spec = replica["spec"]
            if spec.get("nodeID") and not spec.get("failedAt") and not world.node_up(spec["nodeID"]):
                stamp = now_text()
                self.patch_replica(world, replica, {"spec": {"failedAt": stamp, "lastFailedAt": stamp}})
                self.patch_replica_status(world, replica, {"currentState": "stopped"})
                log.info("replica %s failed: node %s is down", replica["metadata"]["name"], spec["nodeID"])

    def replenish(
        self,
        world: World,
        volume: dict[str, Any],
        replicas: list[dict[str, Any]],
        *,
        wanted: int,
        size: int,
        attached: bool,
        status: dict[str, Any],
    ) -> None:
        """Make new replicas while the volume has fewer usable ones than it asks for (Longhorn's
        replenishReplicas and RequireNewReplica)."""
        usable = [r for r in replicas if not r["spec"].get("failedAt") and not world.evicting(r)]
        evicting = [r for r in replicas if not r["spec"].get("failedAt") and world.evicting(r)]
        missing = wanted - len(usable)
        if missing <= 0:
            return
        if evicting and len(usable) + len(evicting) >= wanted:
            # An eviction: Longhorn makes the replacement at once (the volume is healthy).
            for _ in range(missing):
                replicas.append(self.new_replica(world, volume, size))
            return
        if not attached:
            return  # a detached volume is rebuilt at its next attach
        for replica in [r for r in replicas if r["spec"].get("failedAt")]:
            if self.reusable(world, replica) and any(healthy(r) for r in replicas):
                stamp = now_text()
                self.patch_replica(
                    world, replica, {"spec": {"failedAt": "", "healthyAt": stamp, "lastHealthyAt": stamp}}
                )
                self.patch_replica_status(world, replica, {"currentState": "running"})
                log.info("replica %s reused (rebuilt) on %s", replica["metadata"]["name"], replica["spec"]["nodeID"])
                missing -= 1
                if missing <= 0:
                    return
        potentially_reusable = any(potentially_reusable_replica(r) for r in replicas)
        if potentially_reusable:
            degraded_at = status.get("lastDegradedAt") or ""
            wait = int(world.setting("replica-replenishment-wait-interval"))
            if not degraded_at or self.clock() < parse_time(degraded_at) + wait:
                return
        for _ in range(missing):
            replicas.append(self.new_replica(world, volume, size))

    def reusable(self, world: World, replica: dict[str, Any]) -> bool:
        spec = replica["spec"]
        return potentially_reusable_replica(replica) and world.node_up(spec["nodeID"]) and not world.evicting(replica)

    def new_replica(self, world: World, volume: dict[str, Any], size: int) -> dict[str, Any]:
        name = volume["metadata"]["name"]
        body = {
            "apiVersion": "longhorn.io/v1beta2",
            "kind": "Replica",
            "metadata": volume_child_metadata(f"{name}-r-{secrets.token_hex(4)}", volume),
            "spec": {
                "volumeName": name,
                "volumeSize": str(size),
                "nodeID": "",
                "diskID": "",
                "diskPath": "",
                "dataDirectoryName": "",
                "healthyAt": "",
                "failedAt": "",
                "lastHealthyAt": "",
                "lastFailedAt": "",
                "rebuildRetryCount": 0,
            },
        }
        created = self.kube.create(f"{LONGHORN_GROUP}/replicas", body)
        world.replicas[created["metadata"]["name"]] = created
        return created

    def place(self, world: World, volume: dict[str, Any], replicas: list[dict[str, Any]], size: int) -> list[str]:
        """Place every unplaced replica; the scheduler's errors for those that cannot be."""
        errors: list[str] = []
        for replica in replicas:
            if replica["spec"].get("nodeID"):
                continue
            choice, why = choose_disk(world, volume, replicas, size)
            if choice is None:
                errors.extend(why or ["replica scheduling failed"])
                break  # as Longhorn: the others would fail alike
            node_name, disk_uuid = choice
            patch = {
                "metadata": {"labels": {"longhornnode": node_name}},
                "spec": {
                    "nodeID": node_name,
                    "diskID": disk_uuid,
                    "diskPath": DEFAULT_DISK_PATH,
                    "dataDirectoryName": f"{volume['metadata']['name']}-{secrets.token_hex(4)}",
                },
            }
            self.patch_replica(world, replica, patch)
            log.info("replica %s placed on %s", replica["metadata"]["name"], node_name)
        return sorted(set(errors))

    def mark_healthy(
        self, world: World, volume: dict[str, Any], replicas: list[dict[str, Any]], attached: bool
    ) -> None:
        """A placed replica on an up node becomes healthy (its data plane is not modeled): a new
        volume's first replicas when it has no data yet, a rebuilt one only from a healthy replica
        of the volume, for an attached volume or an eviction."""
        has_data = any(r["spec"].get("lastHealthyAt") for r in replicas)
        source = any(healthy(r) for r in replicas)
        evicting = any(world.evicting(r) for r in replicas if not r["spec"].get("failedAt"))
        for replica in replicas:
            spec = replica["spec"]
            if not spec.get("nodeID") or spec.get("healthyAt") or spec.get("failedAt"):
                continue
            if not world.node_up(spec["nodeID"]):
                continue
            if has_data and not (source and (attached or evicting)):
                continue
            stamp = now_text()
            self.patch_replica(world, replica, {"spec": {"healthyAt": stamp, "lastHealthyAt": stamp}})
            self.patch_replica_status(world, replica, {"currentState": "running"})

    def finish_evictions(self, world: World, replicas: list[dict[str, Any]], wanted: int) -> None:
        """Delete an evicted replica once enough healthy replicas elsewhere hold the volume."""
        healthy_elsewhere = [r for r in replicas if healthy(r) and not world.evicting(r)]
        for replica in replicas:
            if world.evicting(replica) and len(healthy_elsewhere) >= wanted:
                self.kube.delete(f"{LONGHORN_GROUP}/replicas/{replica['metadata']['name']}")
                world.replicas.pop(replica["metadata"]["name"], None)
                log.info("evicted replica %s deleted", replica["metadata"]["name"])

    def write_volume_status(
        self,
        volume: dict[str, Any],
        replicas: list[dict[str, Any]],
        *,
        wanted: int,
        attached: bool,
        attach_node: str,
        errors: list[str],
        world: World,
        engine_unknown: bool = False,
    ) -> None:
        status = dict(volume.get("status") or {})
        conditions = [dict(c) for c in status.get("conditions") or []]
        placed_ok = [r for r in replicas if r["spec"].get("nodeID") and not r["spec"].get("failedAt")]
        all_placed = all(r["spec"].get("nodeID") for r in replicas)
        if all_placed:
            set_condition(conditions, "Scheduled", "True", "", "")
        elif not attached and placed_ok and as_bool(world.setting("allow-volume-creation-with-degraded-availability")):
            set_condition(conditions, "Scheduled", "True", "", DEGRADED_RESET_MESSAGE)
        else:
            set_condition(
                conditions,
                "Scheduled",
                "False",
                "ReplicaSchedulingFailure",
                ";".join(errors) or "replica scheduling failed",
            )
        healthy_count = len([r for r in replicas if healthy(r) and not world.evicting(r)])
        if engine_unknown:
            # ReconcileEngineReplicaState: the volume's robustness is unknown while its engine is.
            robustness, state, attached = "unknown", "attached", True
        elif attached:
            robustness = "healthy" if healthy_count >= wanted else ("degraded" if healthy_count else "faulted")
            state = "attached"
        else:
            robustness = "unknown"
            state = "detached" if replicas else "creating"
        if robustness == "degraded" and status.get("robustness") != "degraded":
            status["lastDegradedAt"] = now_text()
        status.update(
            state=state,
            robustness=robustness,
            currentNodeID=attach_node if attached else "",
            conditions=conditions,
        )
        if status != volume.get("status"):
            self.kube.patch(f"{LONGHORN_GROUP}/volumes/{volume['metadata']['name']}/status", {"status": status})

    # ---- writes

    def patch_replica(self, world: World, replica: dict[str, Any], patch: dict[str, Any]) -> None:
        updated = self.kube.patch(f"{LONGHORN_GROUP}/replicas/{replica['metadata']['name']}", patch)
        replica.clear()
        replica.update(updated)
        world.replicas[updated["metadata"]["name"]] = replica

    def patch_replica_status(self, world: World, replica: dict[str, Any], status: dict[str, Any]) -> None:
        updated = self.kube.patch(f"{LONGHORN_GROUP}/replicas/{replica['metadata']['name']}/status", {"status": status})
        replica.clear()
        replica.update(updated)
        world.replicas[updated["metadata"]["name"]] = replica


def healthy(replica: dict[str, Any]) -> bool:
    spec = replica.get("spec", {})
    return bool(spec.get("nodeID") and spec.get("healthyAt") and not spec.get("failedAt"))


def potentially_reusable_replica(replica: dict[str, Any]) -> bool:
    """Longhorn's IsPotentiallyReusableReplica."""
    spec = replica.get("spec", {})
    return bool(
        spec.get("failedAt")
        and spec.get("nodeID")
        and spec.get("diskID")
        and int(spec.get("rebuildRetryCount") or 0) < FAILED_REPLICA_MAX_RETRY_COUNT
        and not spec.get("evictionRequested")
    )


def kube_ready(kube_node: dict[str, Any]) -> bool:
    return condition(kube_node.get("status", {}).get("conditions"), "Ready").get("status") == "True"


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' rule (k8s.io/api core/v1 toleration.go, `ToleratesTaint`): the effect empty
    or the taint's; an empty key with `Exists` matches every key; `Exists` matches the key alone,
    `Equal` (the default operator) the key and the value."""
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")


def runs_manager_pod(kube_node: dict[str, Any], tolerations: Sequence[dict[str, Any]] = ()) -> bool:
    """Longhorn's manager DaemonSet pod would run on this node: it is Ready, and every
    NoSchedule/NoExecute taint on it is one a DaemonSet pod tolerates by default or one of the
    pod template's `tolerations` (the chart's `longhornManager.tolerations`) tolerates."""
    if not kube_ready(kube_node):
        return False
    for taint in kube_node.get("spec", {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute") or taint.get("key") in DAEMONSET_TOLERATED:
            continue
        if not any(tolerates(toleration, taint) for toleration in tolerations):
            return False
    return True


def disk_has_room(world: World, disk: dict[str, Any], entry: dict[str, Any], size: int) -> tuple[bool, str]:
    """Longhorn's IsSchedulableToDisk(size, size, info)."""
    maximum = int(entry.get("storageMaximum") or 0)
    available = int(entry.get("storageAvailable") or 0)
    if maximum <= 0 or available <= 0:
        return False, "the disk has no storage figures"
    minimal = maximum * world.percent("storage-minimal-available-percentage") // 100
    if available - size <= minimal:
        return False, f"storage available {available - size} is at most the minimal {minimal}"
    reserved = int(disk.get("storageReserved") or 0)
    limit = (maximum - reserved) * world.percent("storage-over-provisioning-percentage") // 100
    scheduled = int(entry.get("storageScheduled") or 0)
    if scheduled + size > limit:
        return False, f"storage scheduled {scheduled + size} is over the limit {limit}"
    return True, ""


def choose_disk(
    world: World, volume: dict[str, Any], replicas: list[dict[str, Any]], size: int
) -> tuple[tuple[str, str] | None, list[str]]:
    """Where Longhorn's replica scheduler would place a new replica of `volume`: (node, disk UUID),
    or None with the scheduler's error reasons."""
    selector = set(volume.get("spec", {}).get("nodeSelector") or [])
    schedulable = {
        name: node
        for name, node in world.nodes.items()
        if not node.get("metadata", {}).get("deletionTimestamp")
        and condition(node.get("status", {}).get("conditions"), "Ready").get("status") == "True"
        and condition(node.get("status", {}).get("conditions"), "Schedulable").get("status") == "True"
        and node.get("spec", {}).get("allowScheduling")
    }
    if not schedulable:
        return None, ["nodes are unavailable"]
    # Nodes holding a replica of the volume (an unfailed one, or a failed one that may be reused).
    used = {
        r["spec"]["nodeID"]
        for r in replicas
        if r["spec"].get("nodeID") and (not r["spec"].get("failedAt") or potentially_reusable_replica(r))
    }
    errors: list[str] = []
    best: tuple[int, str, str] | None = None
    for name, node in schedulable.items():
        if not selector <= set(node.get("spec", {}).get("tags") or []) or name in used:
            continue
        if node.get("spec", {}).get("evictionRequested"):
            continue
        disks = [
            (disk_name, disk)
            for disk_name, disk in (node.get("spec", {}).get("disks") or {}).items()
            if disk.get("allowScheduling")
            and not disk.get("evictionRequested")
            and condition(
                node.get("status", {}).get("diskStatus", {}).get(disk_name, {}).get("conditions"), "Schedulable"
            ).get("status")
            == "True"
        ]
        if not disks:
            errors.append("disks are unavailable")
            continue
        for disk_name, disk in disks:
            entry = node["status"]["diskStatus"][disk_name]
            room, _ = disk_has_room(world, disk, entry, size)
            if not room:
                errors.append("insufficient storage")
                continue
            usable = (
                int(entry["storageAvailable"])
                - int(disk.get("storageReserved") or 0)
                - int(entry.get("storageScheduled") or 0)
            )
            if best is None or usable > best[0]:
                best = (usable, name, str(entry["diskUUID"]))
    if best is None:
        return None, sorted(set(errors))
    return (best[1], best[2]), []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig of the cluster (waited for)")
    parser.add_argument("--state-dir", type=Path, required=True, help="where the manager keeps its files")
    parser.add_argument("--server", help="the API server URL to use instead of the kubeconfig's")
    parser.add_argument("--lab-run-dir", type=Path, help="the lab whose hosts are the nodes")
    parser.add_argument("--disk", action="append", default=[], metavar="NODE=PATH", help="a node's disk directory")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1)  # a stack dump on demand, for a pass that seems stuck
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    fixed = {item.split("=", 1)[0]: Path(item.split("=", 1)[1]) for item in args.disk}
    disks = HostDisks(args.lab_run_dir, fixed)
    manager: Manager | None = None
    csi: CsiController | None = None
    while True:
        try:
            if manager is None and args.kubeconfig.exists():
                kube = Kube.from_kubeconfig(args.kubeconfig, args.state_dir / "kube", args.server)
                manager = Manager(kube, disks)
                csi = CsiController(kube, disks.root)
            if manager is not None and csi is not None:
                manager.run_once()
                csi.run_once()
        except (KubeError, OSError, ValueError, KeyError) as err:
            # The API restarts with k3s, objects change under a pass: the next pass starts afresh.
            log.warning("pass failed: %s", err)
        except Exception as err:
            log.warning("pass failed: %r", err)
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
