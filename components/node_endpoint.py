"""Typed boundary between the node components and the components that act on
all nodes (firewalls, storage): how to reach a node and at which addresses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pulumi

from providers.host_probe import HostProbe
from providers.inputs import NodeLogin
from providers.login_key import NodeLoginKey


@dataclass(frozen=True)
class SshCredentials:
    """The key that logs in to every node; the private half is a Pulumi secret."""

    user: str
    private_key: pulumi.Output[str]
    public_key: str | None
    recorded_host_keys: dict[str, str]
    previous_private_key: pulumi.Output[str] | None = None
    """hk3s:ssh.previous_private_key_file, a secret: the key a rotation logs in with when the state has none."""


@dataclass(frozen=True)
class NodeEndpoint:
    """One node as the other components see it."""

    name: str
    role: Literal["server", "worker"]
    public_address: pulumi.Output[str]
    private_address: pulumi.Output[str | None]
    ssh_address: pulumi.Output[str]
    ssh_port: int
    hcloud_server_id: pulumi.Output[str] | None
    firewall_managed: bool
    probe: HostProbe
    operations: pulumi.ProviderResource
    """The provider process this node's dynamic resources run in (components.provider_shards)."""
    login_key: NodeLoginKey | None = None
    """The node's NodeLoginKey: every resource that logs in to the node comes after it (a rotation)."""
    machine: pulumi.Resource | None = None
    """The Hetzner server the program created for the node, if it did."""

    def options(
        self, parent: pulumi.Resource, depends_on: list[pulumi.Resource] | None = None
    ) -> pulumi.ResourceOptions:
        """Options of a dynamic resource acting on this node; it comes after the node's login key."""
        after = [*(depends_on or []), *([self.login_key] if self.login_key is not None else [])]
        return pulumi.ResourceOptions(parent=parent, provider=self.operations, depends_on=after)

    def login(self, credentials: SshCredentials) -> NodeLogin:
        """How a node-facing dynamic resource logs in to this node, pinned to the host key
        the probe recorded (or the stack config gives)."""
        return NodeLogin(
            node=self.name,
            address=self.ssh_address,
            ssh_port=self.ssh_port,
            ssh_user=credentials.user,
            private_key=credentials.private_key,
            recorded_host_key=self.probe.host_key,
        )
