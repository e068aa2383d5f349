"""Copies pinned to the server that still sit on a worker, moved to the server before the worker
goes down (a reboot).

A single-copy volume is pinned to the server (its Longhorn `nodeSelector` holds the server's tag)
so that losing a worker never loses it. Its one copy can still sit on a worker: made before the
pin, or while the server had no room, since Longhorn never moves a placed copy to follow a
changed selector. Rebooting that worker takes the volume's only copy down with it, and a worker
that does not come back loses it. So before a reboot each such copy moves to the server:

1. **Refused up front when the server has no room**: the sizes of the copies to move against
   what the server's roomiest schedulable disk can still take by Longhorn's own rules (the
   minimal available share kept free, the reserved storage never scheduled), naming each
   volume and the space needed. Nothing is changed then.
2. **Refused for a detached volume**: Longhorn rebuilds a copy only while its volume is
   attached, so a second copy would never come; the message says to start its workload (which
   attaches it) or move it by hand.
3. **A second copy first**: the volume is asked for two copies (`numberOfReplicas: 2`) and
   marked with `MOVING_ANNOTATION`; Longhorn places the new copy by the volume's selector, on
   the server, and rebuilds it there.
4. **Once that copy is healthy** (`healthyAt` set, `failedAt` empty), the volume goes back to
   one copy, then the worker's copy is deleted, then the mark goes. In that order because
   Longhorn does nothing while a volume has more healthy copies than it asks for (with replica
   auto-balance disabled, as the program keeps it), and rebuilds nothing after a deletion that
   leaves as many healthy copies as it asks for.
Each step is a fixed patch or a delete that accepts NotFound, and the mark says a move is under
way, so a move cut anywhere (even SIGKILL) is finished by the next call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node_operations.longhorn_node_role import SERVER_TAG
from node_operations.longhorn_objects import LONGHORN_NAMESPACE, disks, longhorn_items
from remote_access.kube import ClusterApi, Repeat

MOVING_ANNOTATION = "hk3s.dev/moving-to-server"
MOVE_TIMEOUT_SECONDS = 3600.0  # a copy is rebuilt over the network: 100 GiB at 100 MB/s is 17 min
POLL_SECONDS = 2.0

Progress = Callable[[str], None]


class PinnedCopyRefusedError(RuntimeError):
    """The server cannot take the copies; nothing was changed."""


@dataclass(frozen=True)
class PinnedCopy:
    """A volume pinned to the server whose copy sits on the worker."""

    volume: str
    replica: str
    size: int
    moving: bool  # a move of an earlier call is under way
    attached: bool


def _healthy(replica: Mapping[str, Any]) -> bool:
    spec = replica.get("spec") or {}
    return bool(spec.get("healthyAt")) and not spec.get("failedAt")


def pinned_copies_on(
    node: str, volumes: Sequence[Mapping[str, Any]], replicas: Sequence[Mapping[str, Any]]
) -> list[PinnedCopy]:
    """The volumes pinned to the server (one copy, or being moved by this module) with a copy on `node`."""
    found = []
    for volume in volumes:
        spec, name = volume.get("spec") or {}, str(volume["metadata"]["name"])
        moving = MOVING_ANNOTATION in (volume["metadata"].get("annotations") or {})
        if SERVER_TAG not in (spec.get("nodeSelector") or []) or not (moving or spec.get("numberOfReplicas") == 1):
            continue
        for replica in replicas:
            replica_spec = replica.get("spec") or {}
            if replica_spec.get("volumeName") == name and replica_spec.get("nodeID") == node:
                attached = (volume.get("status") or {}).get("state") == "attached"
                replica_name = str(replica["metadata"]["name"])
                found.append(PinnedCopy(name, replica_name, int(spec.get("size") or 0), moving, attached))
    return sorted(found, key=lambda copy: copy.volume)


def node_room(node: Mapping[str, Any], minimal_available_percent: int) -> int:
    """Bytes a Longhorn node's roomiest schedulable disk can still take a copy of, by Longhorn's
    rules (`Disk.room`); 0 for a node that takes no new copies."""
    spec = node.get("spec") or {}
    if spec.get("allowScheduling") is False or spec.get("evictionRequested"):
        return 0
    return max((disk.room(minimal_available_percent) for disk in disks(node)), default=0)


def _gib(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB"


async def _patch_volume(api: ClusterApi, name: str, replicas: int, moving: bool) -> None:
    patch = {
        "spec": {"numberOfReplicas": replicas},
        "metadata": {"annotations": {MOVING_ANNOTATION: "true" if moving else None}},
    }
    await api.patch_merge("volumes.longhorn.io", name, LONGHORN_NAMESPACE, patch)


async def move_pinned_copies(
    api: ClusterApi,
    node: str,
    server: str,
    *,
    minimal_available_percent: int,
    progress: Progress,
    timeout: float = MOVE_TIMEOUT_SECONDS,
) -> list[str]:
    """Move the copies pinned to `server` off `node` (see the module docstring); the volumes moved.
    Raises PinnedCopyRefusedError, with nothing changed, when the server has no room for them."""
    pinned = pinned_copies_on(
        node, await longhorn_items(api, "volumes.longhorn.io"), await longhorn_items(api, "replicas.longhorn.io")
    )
    if not pinned:
        return []
    detached = [copy.volume for copy in pinned if not copy.attached]
    if detached:
        raise PinnedCopyRefusedError(
            f"the only copy of {', '.join(detached)}, pinned to the server, is on {node}, and Longhorn rebuilds a copy "
            "only while its volume is attached: start the workload that uses it (which attaches it) and reboot "
            f"again, or move the copy to {server} in Longhorn first"
        )
    nodes = {n["metadata"]["name"]: n for n in await longhorn_items(api, "nodes.longhorn.io")}
    to_start = [copy for copy in pinned if not copy.moving]
    need, room = sum(copy.size for copy in to_start), node_room(nodes.get(server) or {}, minimal_available_percent)
    if need > room:
        listed = ", ".join(f"{copy.volume} ({_gib(copy.size)})" for copy in to_start)
        raise PinnedCopyRefusedError(
            f"the only copy of {listed}, pinned to the server, is on {node}, and {server} has room for "
            f"{_gib(room)} of the {_gib(need)} they need: free {_gib(need - room)} on {server}'s Longhorn disk "
            "(or lower its reserved storage), then reboot again"
        )
    for copy in pinned:
        progress(f"moving the copy of {copy.volume} ({_gib(copy.size)}) to {server} first: it is pinned there")
        await _patch_volume(api, copy.volume, 2, moving=True)
        deadline = time.monotonic() + timeout
        while not [
            r
            for r in await longhorn_items(api, "replicas.longhorn.io")
            if r["spec"].get("volumeName") == copy.volume and r["spec"].get("nodeID") == server and _healthy(r)
        ]:
            if time.monotonic() > deadline:
                raise PinnedCopyRefusedError(
                    f"the copy of {copy.volume} was not rebuilt on {server} within {timeout:.0f} s; it keeps its "
                    f"copy on {node} (and asks for two until the move finishes): reboot again to keep waiting"
                )
            await asyncio.sleep(POLL_SECONDS)
        await _patch_volume(api, copy.volume, 1, moving=True)
        await api.kubectl(
            ["delete", "replicas.longhorn.io", copy.replica, "-n", LONGHORN_NAMESPACE, "--ignore-not-found"],
            repeat=Repeat.IDEMPOTENT,
        )
        await _patch_volume(api, copy.volume, 1, moving=False)
    return [copy.volume for copy in pinned]
