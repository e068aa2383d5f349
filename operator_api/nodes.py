"""The cluster as the stack outputs describe it: nodes and status, typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Node:
    """One node of the stack's `nodes` output.

    `state` is the join's state for a worker (e.g. ``ready``) and ``server`` for the server;
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
    fenced: bool

    @classmethod
    def from_output(cls, data: Mapping[str, Any]) -> Node:
        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value in (None, "") else str(value)

        return cls(
            name=str(data["name"]),
            role=str(data.get("role", "worker")),
            state=str(data.get("state") or "unknown"),
            address=text("address"),
            private_address=text("private_address"),
            ssh_address=text("ssh_address"),
            network_mode=text("network_mode"),
            k3s_version=text("k3s_version"),
            holds_copies=bool(data.get("holds_copies", False)),
            fenced=bool(data.get("fenced", False)),
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
class ClusterStatus:
    """The stack at a glance. Holds no secret: the kubeconfig is not part of it."""

    stack: str
    api_endpoint: str | None
    k3s_version: str | None
    storage_classes: list[str]
    nodes: list[Node]
    last_run: LastRun | None
    pending_operations: list[str]
    locked_by: list[str]

    @property
    def deployed(self) -> bool:
        return bool(self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
