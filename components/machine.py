"""The machine under a node: a Hetzner server the program creates, or an
existing host given by address; then a probe of its facts. Shared by
`ClusterServer` and `WorkerNode`."""

from __future__ import annotations

from typing import Literal

import pulumi
import pulumi_hcloud as hcloud

from cluster_settings.models import HostSettings, StackSettings
from components.node_endpoint import NodeEndpoint, SshCredentials
from components.private_network import PrivateNetwork
from components.provider_shards import OperationShards
from providers.host_probe import HostProbe


def provision_machine(
    parent: pulumi.ComponentResource,
    *,
    host: HostSettings,
    role: Literal["server", "worker"],
    settings: StackSettings,
    credentials: SshCredentials,
    ssh_key_id: pulumi.Output[str] | None,
    private_network: PrivateNetwork | None,
    firewall_managed: bool,
    shards: OperationShards,
) -> NodeEndpoint:
    """Create (or adopt) the machine for `host` as children of `parent`."""
    child = pulumi.ResourceOptions(parent=parent)
    hcloud_server_id: pulumi.Output[str] | None = None
    if host.kind == "hetzner":
        if ssh_key_id is None:
            raise ValueError(f"{host.name}: a Hetzner server needs the cluster's SSH key")
        server = hcloud.Server(
            host.name,
            name=host.name,
            server_type=host.server_type or settings.cluster.server_type,
            image=host.image or settings.cluster.image,
            location=host.location or settings.cluster.location,
            ssh_keys=[ssh_key_id],
            public_nets=[hcloud.ServerPublicNetArgs(ipv4_enabled=True, ipv6_enabled=True)],
            labels={"hk3s-cluster": settings.cluster.name, "hk3s-role": role},
            opts=child,
        )
        hcloud_server_id = server.id
        public_address: pulumi.Output[str] = server.ipv4_address
        ssh_address = server.ipv4_address
        private_address: pulumi.Output[str | None] = pulumi.Output.from_input(None)
        depends: list[pulumi.Resource] = [server]
        if private_network is not None:
            attachment = private_network.attach(host.name, server.id)
            private_address = attachment.ip
            depends.append(attachment)
    else:
        assert host.address is not None  # the settings rules guarantee it
        public_address = pulumi.Output.from_input(host.address)
        ssh_address = pulumi.Output.from_input(host.ssh_address or host.address)
        private_address = pulumi.Output.from_input(host.private_address)
        depends = []
    operations = shards.for_node(host.name)
    probe = HostProbe(
        f"{host.name}-probe",
        node=host.name,
        address=ssh_address,
        ssh_port=host.ssh_port,
        ssh_user=credentials.user,
        private_key=credentials.private_key,
        recorded_host_key=credentials.recorded_host_keys.get(host.name),
        # A Hetzner network's address: the facts wait for it, so the network decision sees it.
        expected_address=private_address if host.kind == "hetzner" else None,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends, provider=operations),
    )
    return NodeEndpoint(
        name=host.name,
        role=role,
        public_address=public_address,
        private_address=private_address,
        ssh_address=ssh_address,
        ssh_port=host.ssh_port,
        hcloud_server_id=hcloud_server_id,
        firewall_managed=firewall_managed,
        probe=probe,
        operations=operations,
    )
