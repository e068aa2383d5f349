"""Who may hold copies of data, written on Longhorn's own node objects.

Longhorn places a volume's copies (replicas) only on Longhorn nodes whose tags hold every tag of
the volume's node selector, and only on nodes that allow scheduling. The program's storage classes
select `hk3s-server` (one copy, pinned to the server) or `hk3s-copies` (two copies). So:

* the server always holds copies: tags `hk3s-server` and `hk3s-copies`, scheduling allowed;
* a worker whose disk passed the probe (or was accepted by `ignore_slow_disk`): `hk3s-copies`,
  scheduling allowed;
* a worker whose disk failed the probe, or that opted out (`holds_copies: false`): no program tag,
  and scheduling disabled on its Longhorn node (`spec.allowScheduling: false`). The node flag, not
  the disks' flags: Longhorn's scheduler then leaves the whole node out for every volume, including
  a volume made outside the program's storage classes with no node selector (the tag alone would
  not keep those off), and a disk an operator adds to the node later is covered too. Replicas
  already on the node stay where they are (Longhorn moves nothing when scheduling is disabled;
  moving them is an eviction, done when a worker is removed).

Tags the operator set on a node are kept: only the program's two tags are added or removed.

Longhorn's manager makes a node's Longhorn node once its manager pod runs there, which is after
the node is Ready and free of the join's NoSchedule validation taint; the role waits for it. Every
call goes through `k3s kubectl` on the server (remote_access.kube), as the join's do, and the
patch is a merge patch of fixed values: running it again changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from remote_access.kube import ClusterApi, Progress, Repeat
from remote_access.ssh import SshError, SshTarget, open_session

LONGHORN_NAMESPACE = "longhorn-system"
LONGHORN_NODE_KIND = "nodes.longhorn.io"
SERVER_TAG = "hk3s-server"
COPIES_TAG = "hk3s-copies"
PROGRAM_TAGS = (SERVER_TAG, COPIES_TAG)
# How long a node's Longhorn node may take to appear: Longhorn's manager pod is scheduled once the
# node is Ready and untainted, and starts its container (already pulled on an air-gapped host) in
# seconds; a slow registry pull on a new host can take minutes.
LONGHORN_NODE_WAIT_SECONDS = 300.0
POLL_SECONDS = 2.0


class LonghornNodeMissingError(SshError):
    """A node's Longhorn node did not appear in time."""


@dataclass(frozen=True)
class NodeRole:
    """What one node's Longhorn node should say."""

    node: str
    server: bool
    holds_copies: bool

    @property
    def tags(self) -> tuple[str, ...]:
        if self.server:
            return PROGRAM_TAGS
        return (COPIES_TAG,) if self.holds_copies else ()

    @property
    def allow_scheduling(self) -> bool:
        return self.server or self.holds_copies


@dataclass(frozen=True)
class RoleApplied:
    """The node's tags and scheduling flag after the role was applied."""

    tags: list[str]
    allow_scheduling: bool


def wanted_tags(current: list[str], role: NodeRole) -> list[str]:
    """The operator's own tags, kept in their order, then the program's tags for `role`."""
    kept = [tag for tag in current if tag not in PROGRAM_TAGS]
    return kept + list(role.tags)


async def _longhorn_node(cluster: ClusterApi, node: str) -> dict[str, object] | None:
    out = await cluster.kubectl(
        ["get", LONGHORN_NODE_KIND, node, "-n", LONGHORN_NAMESPACE, "-o", "json", "--ignore-not-found"],
        repeat=Repeat.READ,
    )
    return json.loads(out) if out.strip() else None


async def wait_longhorn_node(
    cluster: ClusterApi, node: str, timeout: float = LONGHORN_NODE_WAIT_SECONDS, progress: Progress | None = None
) -> dict[str, object]:
    """The node's Longhorn node, once Longhorn's manager has made it."""
    started = time.monotonic()
    said = False
    while True:
        found = await _longhorn_node(cluster, node)
        if found is not None:
            return found
        if not said and progress is not None:
            progress(f"waiting for Longhorn's node object for {node} (Longhorn's manager makes it)")
            said = True
        if time.monotonic() - started - cluster.waited_seconds > timeout:
            raise LonghornNodeMissingError(
                node,
                f"Longhorn has no node object for it after {timeout:.0f} s, so the program cannot "
                f"say whether it holds copies. Check that Longhorn's manager pod runs on {node} "
                f"(k3s kubectl -n {LONGHORN_NAMESPACE} get pods -o wide) and run up again",
            )
        await asyncio.sleep(POLL_SECONDS)


async def apply_role(
    cluster: ClusterApi,
    role: NodeRole,
    *,
    timeout: float = LONGHORN_NODE_WAIT_SECONDS,
    progress: Progress | None = None,
) -> RoleApplied:
    """Wait for the node's Longhorn node and give it `role`'s tags and scheduling flag."""
    found = await wait_longhorn_node(cluster, role.node, timeout, progress)
    spec = found.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    current = [str(tag) for tag in spec.get("tags") or []]
    tags = wanted_tags(current, role)
    if tags != current or spec.get("allowScheduling") is not role.allow_scheduling:
        await cluster.patch_merge(
            LONGHORN_NODE_KIND,
            role.node,
            LONGHORN_NAMESPACE,
            {"spec": {"tags": tags, "allowScheduling": role.allow_scheduling}},
        )
    return RoleApplied(tags=tags, allow_scheduling=role.allow_scheduling)


async def set_node_role(
    server: SshTarget,
    role: NodeRole,
    *,
    api_wait: float,
    timeout: float = LONGHORN_NODE_WAIT_SECONDS,
    progress: Progress | None = None,
) -> RoleApplied:
    """`apply_role` through the server's `k3s kubectl`."""
    async with open_session(server) as session:
        cluster = ClusterApi(session, progress=progress, api_wait=api_wait)
        return await apply_role(cluster, role, timeout=timeout, progress=progress)
