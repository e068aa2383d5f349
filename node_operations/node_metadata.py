"""A joined worker's labels and taints, kept in step with the config through the API.

k3s applies --node-label and --node-taint only when a node registers, so every later change
is made here: at the end of a join or rejoin, and on its own when labels and taints are all
that changed (no rejoin, no cordon, nothing run on the worker: a pool's change reaches all
its workers at once, and cordoning them all for checks would stop the pool taking pods).
What the config drops is removed; labels and taints anyone else set are left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from remote_access.kube import ClusterApi, Taint
from remote_access.ssh import SshTarget, open_session

WORKER_ROLE_LABEL = "node-role.kubernetes.io/worker"
MANAGED_LABEL = "hk3s.dev/managed"

Progress = Callable[[str], None]


class NodeMetadata(Protocol):
    """A node's labels and taints as the stack sets them, and those an earlier config set and
    this one drops (labels by key, taints as key:Effect)."""

    @property
    def node(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def removed_labels(self) -> tuple[str, ...]: ...
    @property
    def taints(self) -> tuple[str, ...]: ...
    @property
    def removed_taints(self) -> tuple[str, ...]: ...


def wanted_labels(metadata: NodeMetadata) -> dict[str, str | None]:
    """The labels to set (None: to remove): those the config dropped go, the stack's and the
    program's own are set."""
    labels: dict[str, str | None] = {key: None for key in metadata.removed_labels}
    labels.update({**metadata.labels, MANAGED_LABEL: "true", WORKER_ROLE_LABEL: "true"})
    return labels


async def put_metadata_in_step(cluster: ClusterApi, metadata: NodeMetadata) -> None:
    """Labels and taints as the config says: those it dropped removed, the others set; labels
    and taints that anyone else set are left alone."""
    await cluster.set_labels(metadata.node, wanted_labels(metadata))
    for pair in metadata.removed_taints:
        key, _, effect = pair.rpartition(":")
        await cluster.remove_taint(metadata.node, key, effect)
    for text in metadata.taints:
        await cluster.add_taint(metadata.node, Taint.parse(text))


@dataclass(frozen=True)
class MetadataChange:
    """A change of a joined worker's labels or taints alone (see `update_node_metadata`)."""

    node: str
    labels: dict[str, str]
    removed_labels: tuple[str, ...]
    taints: tuple[str, ...]
    removed_taints: tuple[str, ...]


async def update_node_metadata(server: SshTarget, change: MetadataChange, api_wait: float, progress: Progress) -> None:
    """Put a running worker's labels and taints in step with the config through the API: no
    rejoin, no cordon, nothing run on the worker (a pool's change reaches all its workers at
    once, and cordoning them all for checks would stop the pool taking pods)."""
    async with open_session(server) as session:
        cluster = ClusterApi(session, progress, api_wait)
        await put_metadata_in_step(cluster, change)
    progress(
        f"labels and taints in step ({len(change.labels)} label(s), {len(change.taints)} taint(s); "
        f"removed {len(change.removed_labels)} label(s), {len(change.removed_taints)} taint(s)); no rejoin"
    )
