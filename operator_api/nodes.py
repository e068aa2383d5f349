"""The cluster as the stack outputs describe it: nodes and status, typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from node_operations.health import HostHealth


@dataclass(frozen=True)
class DiskCheck:
    """A worker's last disk probe: may it hold volume copies, and what was measured.

    `eligible` false with `override` false: the disk was refused (`verdict` says why and the
    fix). `override` true: the disk was over the threshold and ignore_slow_disk accepted it."""

    eligible: bool
    override: bool
    sync_p99_ms: float | None
    sync_worst_ms: float | None
    writes: int | None
    threshold_ms: float | None
    verdict: str | None
    probe_seconds: float | None = None

    @classmethod
    def from_output(cls, data: Mapping[str, Any]) -> DiskCheck:
        def number(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        writes = data.get("writes")
        return cls(
            eligible=bool(data.get("eligible", False)),
            override=bool(data.get("override", False)),
            sync_p99_ms=number("sync_p99_ms"),
            sync_worst_ms=number("sync_worst_ms"),
            writes=None if writes is None else int(writes),
            threshold_ms=number("threshold_ms"),
            verdict=None if data.get("verdict") is None else str(data["verdict"]),
            probe_seconds=number("probe_seconds"),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Node:
    """One node of the stack's `nodes` output.

    `state` is the join's state for a worker (e.g. ``ready``) and ``server`` for the server, as
    the last run recorded it, except that a worker the stack fences reads ``OutOfService`` (a
    fenced worker never counts as ready; its last join's state is history). `nodes()` and
    `status()` replace it with the cluster's state now where the server answers.
    `network_mode` and `k3s_version` are None for the server, whose output does not carry them.
    """

    name: str
    role: str
    state: str
    address: str | None
    private_address: str | None
    ssh_address: str | None
    network_mode: str | None
    k3s_version: str | None
    holds_copies: bool
    """Whether the node may hold volume copies now: the server always; a worker whose disk passed
    its probe or was accepted by ignore_slow_disk."""
    fenced: bool
    disk: DiskCheck | None = None
    """A worker's last disk probe; None for the server and for a worker with holds_copies: false."""
    recorded_state: str | None = None
    """With `nodes(live=True)`: the state the last run recorded (`state` is then the cluster's now)."""
    live_error: str | None = None
    """With `nodes(live=True)`: why the cluster could not be asked (`state` is then the recorded one)."""

    @classmethod
    def from_output(cls, data: Mapping[str, Any]) -> Node:
        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value in (None, "") else str(value)

        fenced = bool(data.get("fenced", False))
        return cls(
            name=str(data["name"]),
            role=str(data.get("role", "worker")),
            state="OutOfService" if fenced else str(data.get("state") or "unknown"),
            address=text("address"),
            private_address=text("private_address"),
            ssh_address=text("ssh_address"),
            network_mode=text("network_mode"),
            k3s_version=text("k3s_version"),
            holds_copies=bool(data.get("holds_copies", False)),
            fenced=fenced,
            disk=DiskCheck.from_output(data["disk"]) if isinstance(data.get("disk"), Mapping) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LastRun:
    """The stack's most recent operation, from its history."""

    kind: str
    result: str
    started: str
    ended: str | None
    resource_changes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HostCheck:
    """One node's read-only host checks (`status(check_hosts=True)`)."""

    node: str
    reachable: bool
    error: str | None
    k3s_unit: str | None
    k3s_active: bool | None
    disk_free_percent: dict[str, int]
    time_synced: bool | None
    cert_expires_in_days: int | None

    @classmethod
    def from_health(cls, health: HostHealth) -> HostCheck:
        return cls(
            node=health.node,
            reachable=health.reachable,
            error=health.error,
            k3s_unit=health.k3s_unit,
            k3s_active=health.k3s_active,
            disk_free_percent=dict(health.disk_free_percent),
            time_synced=health.time_synced,
            cert_expires_in_days=health.cert_expires_in_days,
        )


@dataclass(frozen=True)
class StrandedWorkload:
    """A workload whose pods wait on a worker that is NotReady and not fenced
    (node_operations/stranded.py): where a current copy of each of its Longhorn volumes is."""

    worker: str
    workload: str
    pods: list[str]
    current_copies: dict[str, list[str]]
    """Volume -> the other nodes holding a current copy (healthy now, on a node Ready and not fenced)."""
    verdict: str
    """What a fence would decide now: moves, stale, only-copy or unjudged."""
    line: str


@dataclass(frozen=True)
class DownWorker:
    """A worker the cluster sees NotReady that no fence holds, and the command that fences it."""

    name: str
    command: str
    advice: str
    stranded: list[StrandedWorkload] = field(default_factory=list)


@dataclass(frozen=True)
class ClusterStatus:
    """The stack at a glance. Holds no secret: the kubeconfig is not part of it."""

    stack: str
    api_endpoint: str | None
    k3s_version: str | None
    storage_classes: list[str]
    nodes: list[Node]
    """Each node's state as the cluster sees it now (`recorded_state` keeps the last run's), or,
    with `live_error`, as recorded."""
    last_run: LastRun | None
    pending_operations: list[str]
    locked_by: list[str]
    host_checks: list[HostCheck] = field(default_factory=list)
    """Filled by `status(check_hosts=True)` only."""
    warnings: list[str] = field(default_factory=list)
    """What the host checks found wrong, one line per finding, naming the node."""
    down_workers: list[DownWorker] = field(default_factory=list)
    """Workers NotReady and not fenced, with the workloads stranded on them."""
    live_error: str | None = None
    """Why the cluster could not be asked (node states are then the recorded ones)."""
    held_running: list[str] = field(default_factory=list)
    """Workloads a fence holds stopped that run anyway, one line each (node_operations/fence_holds.py)."""

    @property
    def deployed(self) -> bool:
        return bool(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
