"""The Kubernetes API layer: nodes, taints, labels and join tokens.

Every call runs `k3s kubectl` (or `k3s token`) on the server over its SSH
session. That needs no API port open to the operator's machine, works before
any kubeconfig has left the server, and is pinned by the server's host key.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from remote_access.ssh import RemoteCommandError, SshSession

K3S = "/usr/local/bin/k3s"
KUBECTL_DEADLINE_SECONDS = 30.0
FIELD_MANAGER = "hk3s"
APPLY_ATTEMPTS = 3
TOKEN_PATTERN = re.compile(r"^K10[0-9a-f]{64}::([a-z0-9]{6})\.([a-z0-9]{16})$")


@dataclass(frozen=True)
class Taint:
    """A node taint."""

    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"

    @classmethod
    def parse(cls, text: str) -> Taint:
        """Parse `key=value:Effect` (or `key:Effect`)."""
        key_value, _, effect = text.rpartition(":")
        key, _, value = key_value.partition("=")
        if not key or not effect:
            raise ValueError(f"{text!r} is not a taint (key=value:Effect)")
        return cls(key, value, effect)


@dataclass(frozen=True)
class NodeStatus:
    """What the program needs to know about a Node."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    ready: bool = False
    ready_reason: str = ""
    unschedulable: bool = False
    addresses: dict[str, str] = field(default_factory=dict)  # InternalIP/ExternalIP/Hostname -> address
    kubelet_version: str = ""
    container_runtime: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeStatus:
        metadata, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        ready: Mapping[str, Any] = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), {})
        return cls(
            name=metadata["name"],
            labels=dict(metadata.get("labels") or {}),
            taints=[Taint(t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or []],
            ready=ready.get("status") == "True",
            ready_reason=ready.get("reason", ""),
            unschedulable=bool(spec.get("unschedulable")),
            addresses={a["type"]: a["address"] for a in status.get("addresses") or []},
            kubelet_version=status.get("nodeInfo", {}).get("kubeletVersion", ""),
            container_runtime=status.get("nodeInfo", {}).get("containerRuntimeVersion", ""),
        )

    def has_taint(self, key: str) -> bool:
        return any(taint.key == key for taint in self.taints)


@dataclass(frozen=True)
class JoinToken:
    """A short-lived, per-node bootstrap token. `value` is secret: never log it."""

    token_id: str
    value: str = field(repr=False)


class ClusterApi:
    """Kubernetes operations through the server's `k3s kubectl`."""

    def __init__(self, server: SshSession) -> None:
        self._server = server

    @property
    def node(self) -> str:
        return self._server.target.node

    async def kubectl(
        self, args: Sequence[str], *, stdin: str | None = None, deadline: float = KUBECTL_DEADLINE_SECONDS
    ) -> str:
        result = await self._server.run(
            [K3S, "kubectl", *args], stdin=stdin, deadline=deadline, what=f"kubectl {' '.join(args[:2])}"
        )
        return result.stdout

    async def nodes(self) -> list[NodeStatus]:
        data = json.loads(await self.kubectl(["get", "nodes", "-o", "json"]))
        return [NodeStatus.from_object(item) for item in data.get("items", [])]

    async def get_node(self, name: str) -> NodeStatus | None:
        result = await self._server.run(
            [K3S, "kubectl", "get", "node", name, "-o", "json", "--ignore-not-found"],
            deadline=KUBECTL_DEADLINE_SECONDS,
            what=f"kubectl get node {name}",
        )
        return NodeStatus.from_object(json.loads(result.stdout)) if result.stdout.strip() else None

    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Set labels (a None value removes the label)."""
        args = [f"{key}-" if value is None else f"{key}={value}" for key, value in sorted(labels.items())]
        if args:
            await self.kubectl(["label", "node", name, "--overwrite", *args])

    async def add_taint(self, name: str, taint: Taint) -> None:
        await self.kubectl(["taint", "node", name, "--overwrite", str(taint)])

    async def remove_taint(self, name: str, key: str) -> None:
        node = await self.get_node(name)
        if node is not None and node.has_taint(key):
            await self.kubectl(["taint", "node", name, f"{key}-"])

    async def cordon(self, name: str, cordoned: bool) -> None:
        await self.kubectl(["cordon" if cordoned else "uncordon", name])

    async def apply(self, manifest: str) -> None:
        """Create or update the manifest's objects. Server-side apply, because joins run side
        by side: client-side apply reads then creates, and two joins creating the same object
        at once fail with AlreadyExists. A conflict left over is retried."""
        args = ["apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-"]
        for attempt in range(APPLY_ATTEMPTS):
            try:
                await self.kubectl(args, stdin=manifest)
                return
            except RemoteCommandError as error:
                retried = any(word in str(error) for word in ("AlreadyExists", "Conflict"))
                if attempt + 1 == APPLY_ATTEMPTS or not retried:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))

    async def create_join_token(self, node: str, ttl: str = "10m") -> JoinToken:
        """`k3s token create` for one node: short-lived, described by the node's name."""
        result = await self._server.run(
            [K3S, "token", "create", "--ttl", ttl, "--description", node],
            deadline=KUBECTL_DEADLINE_SECONDS,
            what=f"k3s token create for {node}",
        )
        value = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        match = TOKEN_PATTERN.match(value)
        if match is None:
            # Never echo what was printed: it may be a token in an unexpected shape.
            raise RemoteCommandError(self.node, f"k3s token create for {node}", 0, "printed no K10 token")
        return JoinToken(token_id=match.group(1), value=value)

    async def token_ids(self) -> dict[str, str]:
        """Existing bootstrap token ids and their descriptions."""
        data = json.loads(
            await self.kubectl(
                [
                    "get",
                    "secrets",
                    "-n",
                    "kube-system",
                    "--field-selector",
                    "type=bootstrap.kubernetes.io/token",
                    "-o",
                    "json",
                ]
            )
        )
        tokens: dict[str, str] = {}
        for item in data.get("items", []):
            name = item["metadata"]["name"]
            description = item.get("data", {}).get("description", "")
            tokens[name.removeprefix("bootstrap-token-")] = _b64(description)
        return tokens

    async def delete_token(self, token_id: str) -> None:
        await self.kubectl(
            ["delete", "secret", "-n", "kube-system", f"bootstrap-token-{token_id}", "--ignore-not-found"]
        )


def _b64(text: str) -> str:
    import base64  # noqa: PLC0415 - only token descriptions need it

    return base64.b64decode(text).decode() if text else ""
