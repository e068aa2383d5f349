"""What `status(check_hosts=True)` warns of about copies: read-only, from Longhorn's own objects
through the server's `k3s kubectl`.

- Volumes that wait for copies (below).
- A single-copy volume whose copy sits on a worker: losing that worker loses the volume, so the
  operator should move it (a reboot moves one pinned to the server: node_operations.pinned_copies).
- Workloads a fence cannot hold stopped: on a fenced Node, `NODE_UNHELD_ANNOTATION` (written by
  node_operations/fence_workloads.py) names each workload with no current copy elsewhere whose
  owner the program cannot stop (an operator's custom resource): it may start on a copy that may
  be older, and only the operator can stop it.
- Little room for copies: when the roomiest disk that may hold copies (a node carrying the copies
  tag and allowing scheduling) can take less than 5 GiB more by Longhorn's rules, the next volume
  of any size waits.

A Longhorn volume keeps `numberOfReplicas` copies, each on a node whose tags hold the volume's whole
node selector and that allows scheduling, never two on one node. With too few such nodes (a worker
whose disk failed the probe holds none) a copy waits, and the volume runs with fewer copies than it
asks for. Longhorn says so in the volume's `Scheduled` condition; the line quotes it, and names the
nodes that could hold the volume's copies, so the operator sees what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from node_operations.longhorn_node_role import COPIES_TAG
from node_operations.longhorn_objects import longhorn_items
from node_operations.pinned_copies import node_room
from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import SshTarget, open_session

LOW_ROOM_BYTES = 5 * 1024**3
# On a fenced Node: JSON {"Kind namespace/name": why} of the workloads its fence cannot hold stopped.
NODE_UNHELD_ANNOTATION = "hk3s.dev/fence-unheld-workloads"
# Longhorn's default for storage-minimal-available-percentage, when its Setting cannot be read.
MINIMAL_AVAILABLE_DEFAULT = 25


@dataclass(frozen=True)
class WaitingVolume:
    """A volume with fewer placed copies than it asks for."""

    name: str
    wanted: int
    placed: list[str]
    selector: list[str]
    scheduled: Mapping[str, Any]
    eligible: list[str]

    def line(self) -> str:
        condition = (
            f"Longhorn's Scheduled condition: {self.scheduled.get('status', 'unknown')}"
            + (f" ({self.scheduled['reason']})" if self.scheduled.get("reason") else "")
            + (f": {self.scheduled['message']}" if self.scheduled.get("message") else "")
        )
        where = ", ".join(self.placed) or "no node"
        tags = ", ".join(self.selector) or "none"
        return (
            f"volume {self.name} keeps {len(self.placed)} of its {self.wanted} copies (on {where}); the rest wait. "
            f"{condition}. Nodes that may hold its copies (tags {tags}, scheduling allowed): "
            f"{', '.join(self.eligible) or 'none'}; a worker holds copies once its disk passes the probe "
            "(scripts/hk3s node check-disk NAME)"
        )


def waiting_volumes(
    volumes: list[dict[str, Any]], replicas: list[dict[str, Any]], nodes: list[dict[str, Any]]
) -> list[WaitingVolume]:
    """The volumes with fewer placed, unfailed copies than `numberOfReplicas`."""
    waiting = []
    for volume in volumes:
        name = volume["metadata"]["name"]
        spec = volume.get("spec") or {}
        wanted = int(spec.get("numberOfReplicas") or 0)
        placed = sorted(
            str(r["spec"]["nodeID"])
            for r in replicas
            if (r.get("spec") or {}).get("volumeName") == name
            and r["spec"].get("nodeID")
            and not r["spec"].get("failedAt")
        )
        if len(placed) >= wanted:
            continue
        selector = [str(tag) for tag in spec.get("nodeSelector") or []]
        eligible = sorted(
            n["metadata"]["name"]
            for n in nodes
            if (n.get("spec") or {}).get("allowScheduling") and set(selector) <= set(n["spec"].get("tags") or [])
        )
        conditions = (volume.get("status") or {}).get("conditions") or []
        scheduled: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Scheduled"), {})
        waiting.append(WaitingVolume(name, wanted, placed, selector, scheduled, eligible))
    return waiting


def single_copies_on_workers(volumes: list[dict[str, Any]], replicas: list[dict[str, Any]], server: str) -> list[str]:
    """A line per single-copy volume whose copy sits on a worker."""
    lines = []
    for volume in volumes:
        name = volume["metadata"]["name"]
        if int((volume.get("spec") or {}).get("numberOfReplicas") or 0) != 1:
            continue
        nodes = sorted(
            str(r["spec"]["nodeID"])
            for r in replicas
            if (r.get("spec") or {}).get("volumeName") == name and r["spec"].get("nodeID") not in (None, "", server)
        )
        if nodes:
            lines.append(
                f"volume {name} keeps its only copy on worker {', '.join(nodes)}: losing that worker loses it; move "
                f"it to {server} (a reboot of the worker moves it when its volume is pinned to the server)"
            )
    return lines


async def single_copies_for_join(cluster: ClusterApi, server: str) -> list[str]:
    """`single_copies_on_workers` for a join's summary: a worker added is no reason to keep a
    volume's only copy on another worker, so the join names them as `status` does. None where
    Longhorn does not run (its resources not defined)."""
    defined = await cluster.kubectl(
        ["get", "crd", "volumes.longhorn.io", "replicas.longhorn.io", "--ignore-not-found", "-o", "name"],
        repeat=Repeat.READ,
    )
    if len(defined.split()) < 2:
        return []
    volumes = await longhorn_items(cluster, "volumes.longhorn.io")
    replicas = await longhorn_items(cluster, "replicas.longhorn.io") if volumes else []
    return single_copies_on_workers(volumes, replicas, server)


def unheld_workloads(nodes: list[dict[str, Any]]) -> list[str]:
    """A line per workload a fence cannot hold stopped, from its Node's list (see the module
    docstring); a list that is not the fence's JSON is skipped."""
    lines = []
    for node in nodes:
        meta = node.get("metadata") or {}
        try:
            unheld = json.loads((meta.get("annotations") or {}).get(NODE_UNHELD_ANNOTATION) or "{}")
        except ValueError:
            continue
        if isinstance(unheld, dict):
            lines += [
                f"{meta['name']} is fenced, and its fence cannot hold this workload stopped: {why}"
                for _owner, why in sorted(unheld.items())
            ]
    return lines


def low_room(nodes: list[dict[str, Any]], minimal_available_percent: int) -> str | None:
    """A line when the roomiest disk that may hold copies can take less than 5 GiB more."""
    eligible = [n for n in nodes if COPIES_TAG in ((n.get("spec") or {}).get("tags") or [])]
    if not eligible:
        return None
    room, where = max((node_room(n, minimal_available_percent), n["metadata"]["name"]) for n in eligible)
    if room >= LOW_ROOM_BYTES:
        return None
    return (
        f"the roomiest disk that may hold copies ({where}) can take {room / 1024**3:.1f} GiB more, under 5 GiB: "
        "a new volume's copies may wait; free space there or add a worker whose disk passes the probe"
    )


async def read_copies_warnings(server: SshTarget, api_wait: float) -> list[str]:
    """The copies warnings of the cluster the server runs (see the module docstring)."""
    async with open_session(server) as session:
        cluster = ClusterApi(session, api_wait=api_wait)
        volumes, replicas = (
            await longhorn_items(cluster, "volumes.longhorn.io"),
            await longhorn_items(cluster, "replicas.longhorn.io"),
        )
        nodes, settings = (
            await longhorn_items(cluster, "nodes.longhorn.io"),
            await longhorn_items(cluster, "settings.longhorn.io"),
        )
        kube_nodes = json.loads(await cluster.kubectl(["get", "nodes", "-o", "json"], repeat=Repeat.READ))["items"]
    minimal = next(
        (int(s.get("value") or 0) for s in settings if s["metadata"]["name"] == "storage-minimal-available-percentage"),
        MINIMAL_AVAILABLE_DEFAULT,
    )
    lines = [volume.line() for volume in waiting_volumes(volumes, replicas, nodes)]
    lines += single_copies_on_workers(volumes, replicas, server.node)
    lines += unheld_workloads(kube_nodes)
    room = low_room(nodes, minimal)
    return [*lines, *([room] if room else [])]
