"""Volumes that wait for copies: read-only, from Longhorn's own objects through the server's
`k3s kubectl`, for `status(check_hosts=True)`.

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

from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import SshTarget, open_session

LONGHORN_NAMESPACE = "longhorn-system"


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


async def read_waiting_volumes(server: SshTarget, api_wait: float) -> list[WaitingVolume]:
    """`waiting_volumes` of the cluster the server runs (none where Longhorn is not installed)."""
    async with open_session(server) as session:
        cluster = ClusterApi(session, api_wait=api_wait)

        async def items(kind: str) -> list[dict[str, Any]]:
            out = await cluster.kubectl(["get", kind, "-n", LONGHORN_NAMESPACE, "-o", "json"], repeat=Repeat.READ)
            return list(json.loads(out).get("items") or [])

        return waiting_volumes(
            await items("volumes.longhorn.io"), await items("replicas.longhorn.io"), await items("nodes.longhorn.io")
        )
