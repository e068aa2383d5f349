"""What a stack's exported state says: its resources, their outputs, pending operations and
the hosts to check. Exported once per question and read as often as needed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pulumi import automation as auto

from remote_access.ssh import SshTarget

from .errors import StackError

#: A node's Longhorn role (providers/longhorn_node_role.py), named `<node>-longhorn-role`.
LONGHORN_ROLE_TYPE = "pulumi-python:dynamic/hk3s:LonghornNodeRole"


@dataclass(frozen=True)
class Deployment:
    """One export of a stack's state (`pulumi stack export`)."""

    env: str
    data: dict[str, Any]

    @classmethod
    def export(cls, stack: auto.Stack) -> Deployment:
        return cls(stack.name, dict(stack.export_stack().deployment or {}))

    @property
    def resources(self) -> list[dict[str, Any]]:
        return list(self.data.get("resources") or [])

    def pending_operations(self) -> list[str]:
        """`<op> <urn>` for each operation an interrupted run started and never saw finish."""
        return [
            f"{item.get('type', '?')} {item.get('resource', {}).get('urn', '?')}"
            for item in self.data.get("pending_operations") or []
        ]

    def resource_urn(self, type_: str, name: str) -> str | None:
        for resource in self.resources:
            urn = str(resource.get("urn", ""))
            if resource.get("type") == type_ and urn.endswith(f"::{name}"):
                return urn
        return None

    def longhorn_server(self) -> str | None:
        """The node whose Longhorn role says it is the server, where Longhorn runs; else None."""
        for resource in self.resources:
            outputs = resource.get("outputs") or {}
            if resource.get("type") == LONGHORN_ROLE_TYPE and outputs.get("server"):
                return str(outputs["longhorn_node"])
        return None

    def stack_urn(self) -> str:
        for resource in self.resources:
            if resource.get("type") == "pulumi:pulumi:Stack":
                return str(resource["urn"])
        raise StackError(f"stack {self.env} has no root resource; run up first")

    def resource_outputs(self, urn: str) -> dict[str, Any]:
        for resource in self.resources:
            if resource.get("urn") == urn:
                return dict(resource.get("outputs") or {})
        raise StackError(f"{urn} is no longer in the stack's state after the run")

    def host_targets(self, private_key: str, user: str) -> list[SshTarget]:
        """Each recorded node's SSH target: its address, port and pinned host key from the
        state (the host probes' outputs), the login key and user as given."""
        targets = []
        for resource in self.resources:
            if not str(resource.get("type", "")).endswith(":HostProbe"):
                continue
            outputs = resource.get("outputs") or {}
            targets.append(
                SshTarget(
                    node=str(outputs["node"]),
                    address=str(outputs["address"]),
                    private_key=private_key,
                    port=int(outputs.get("ssh_port") or 22),
                    user=user,
                    recorded_host_key=outputs.get("host_key") or outputs.get("recorded_host_key") or None,
                )
            )
        return sorted(targets, key=lambda target: target.node)
