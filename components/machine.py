"""The machine under a node: a Hetzner server the program creates, or an
existing host given by address; then a probe of its facts. Shared by
`ClusterServer` and `WorkerNode`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_hcloud as hcloud

from cluster_settings.models import HostSettings, StackSettings
from components.hetzner_project import hetzner_name, server_labels
from components.hetzner_ssh_key import stack_owner
from components.node_endpoint import NodeEndpoint, SshCredentials
from components.private_network import PrivateNetwork
from components.provider_shards import OperationShards
from providers.host_key_pair import HostKeyPair, cloud_config
from providers.host_probe import HostProbe, HostProbeInputs
from providers.inputs import NodeLogin
from providers.login_key import NodeLoginKey, NodeLoginKeyInputs

# hcloud.Server inputs Hetzner sets only at creation (ssh_keys, image, location, datacenter,
# user_data replace the server; server_type powers it off to resize): never changed later.
CREATION_ONLY_SERVER_INPUTS = ("ssh_keys", "image", "location", "datacenter", "user_data", "server_type")
# Set at creation only, so a new server is never on the internet without a cloud firewall; later the
# cluster's firewalls are attached by FirewallRules (a FirewallAttachment) and the server is taken off the
# SSH-only one (providers.bootstrap_firewall): firewall_ids, ignored after creation, must undo neither.
CREATION_FIREWALL_INPUTS = ("firewall_ids",)
# Hetzner moves a server into or out of a placement group only while it is powered off: a running
# worker keeps the group it was created in (a group's size or a pool's locations changing later
# applies to servers created later).
CREATION_PLACEMENT_INPUTS = ("placement_group_id",)


def report_creation_drift(server: hcloud.Server, node: str, role: str, wanted: dict[str, str]) -> None:
    """Say at preview and up which creation-only settings this server no longer matches: a worker
    keeps its values (new servers get the new ones), the server's are reported, never applied."""

    def report(current: list[str | None]) -> None:
        drift = [
            f"{key} {have} (settings now say {wanted[key]})"
            for key, have in zip(wanted, current, strict=True)
            if have is not None and have != wanted[key]
        ]
        if not drift:
            return
        consequence = (
            "servers created from now on get the new values; replace this worker (remove it, then add it) to move it"
            if role == "worker"
            else "the control plane keeps them: the change is never applied to it"
        )
        pulumi.log.warn(f"{node} runs {', '.join(drift)}: {consequence}", resource=server)

    pulumi.Output.all(*(getattr(server, key) for key in wanted)).apply(report)


@dataclass(frozen=True)
class _Machine:
    """Where a node's machine is reached, whichever way it came to be."""

    public_address: pulumi.Output[str]
    ssh_address: pulumi.Output[str]
    private_address: pulumi.Output[str | None]
    depends: list[pulumi.Resource]
    generated_host_key: pulumi.Output[str | None]
    hcloud_server_id: pulumi.Output[str] | None = None
    server: pulumi.Resource | None = None
    replacement_host_key: HostKeyPair | None = None
    """The key that replaces generated_host_key after the first pinned login (providers.login_key)."""


def _existing_machine(host: HostSettings) -> _Machine:
    assert host.address is not None  # the settings rules guarantee it
    return _Machine(
        public_address=pulumi.Output.from_input(host.address),
        ssh_address=pulumi.Output.from_input(host.ssh_address or host.address),
        private_address=pulumi.Output.from_input(host.private_address),
        depends=[],
        generated_host_key=pulumi.Output.from_input(None),
    )


def _hetzner_machine(
    parent: pulumi.ComponentResource,
    *,
    host: HostSettings,
    role: Literal["server", "worker"],
    settings: StackSettings,
    ssh_key_id: pulumi.Output[str] | None,
    creation_firewall_id: pulumi.Output[str] | None,
    placement_group_id: pulumi.Output[str] | None,
    private_network: PrivateNetwork | None,
    shards: OperationShards,
) -> _Machine:
    """A Hetzner server the program creates, with the SSH host key it is given at creation."""
    if ssh_key_id is None:
        raise ValueError(f"{host.name}: a Hetzner server needs the cluster's SSH key")
    wanted = {
        "server_type": host.server_type or settings.cluster.server_type,
        "image": host.image or settings.cluster.image,
        "location": host.location or settings.cluster.location,
    }
    # The server's SSH host key, made here and given at creation: pinned from the first login.
    host_key = HostKeyPair(
        f"{host.name}-host-key",
        host.name,
        opts=pulumi.ResourceOptions(parent=parent, provider=shards.for_node(host.name)),
    )
    replacement = HostKeyPair(
        f"{host.name}-host-key-replacement",
        host.name,
        opts=pulumi.ResourceOptions(parent=parent, provider=shards.for_node(host.name)),
    )
    rendered: pulumi.Output[str] = pulumi.Output.all(host_key.private_key, host_key.public_key).apply(
        lambda keys: cloud_config(*keys)
    )
    user_data: pulumi.Output[str] = pulumi.Output.secret(rendered)
    # Hetzner's own lock on the control plane: Pulumi's `protect` stops only Pulumi, not a delete or
    # rebuild in the Cloud Console or the hcloud CLI. Hetzner requires a server's delete and rebuild
    # protection to be equal. The teardown's `up` (hk3s:cluster.teardown: allowed) lifts it with
    # `protect`, before the destroy. Workers are deleted by their removal: never locked.
    locked = settings.cluster.control_plane_protected if role == "server" else None
    server = hcloud.Server(
        host.name,
        # Unique per Hetzner project: two stacks (dev, staging) may name their nodes alike.
        name=hetzner_name(settings.cluster.name, pulumi.get_stack(), host.name),
        server_type=wanted["server_type"],
        image=wanted["image"],
        location=wanted["location"],
        ssh_keys=[ssh_key_id],
        user_data=user_data,
        public_nets=[hcloud.ServerPublicNetArgs(ipv4_enabled=True, ipv6_enabled=True)],
        # Labels change in place; the owner and node labels tell this stack's servers at preview
        # (components.hetzner_project: a renamed control plane is refused there).
        labels=server_labels(settings.cluster.name, pulumi.get_stack(), stack_owner(), host.name, role),
        # On the internet from its first boot: an SSH-only cloud firewall is attached at creation,
        # the cluster's full one (FirewallRules) once every address is known, and then the SSH-only
        # one is taken off (Hetzner lets in what any attached firewall allows).
        firewall_ids=[creation_firewall_id.apply(int)] if creation_firewall_id is not None else None,
        placement_group_id=placement_group_id.apply(int) if placement_group_id is not None else None,
        delete_protection=locked,
        rebuild_protection=locked,
        opts=pulumi.ResourceOptions(
            parent=parent,
            # Creation-only in Hetzner's provider: a change would replace the machine (or, for the
            # type, power it off). Later values apply to servers created later (report_creation_drift).
            ignore_changes=[*CREATION_ONLY_SERVER_INPUTS, *CREATION_FIREWALL_INPUTS, *CREATION_PLACEMENT_INPUTS],
            protect=role == "server" and settings.cluster.control_plane_protected,
            additional_secret_outputs=["user_data"],
        ),
    )
    report_creation_drift(server, host.name, role, wanted)
    # A server created before the program gave keys has no user data: its key was recorded on
    # first use (kept in the probe's state), so the generated one, which it never got, is not pinned.
    generated_key: pulumi.Output[str | None] = pulumi.Output.unsecret(
        pulumi.Output.all(server.user_data, host_key.public_key).apply(lambda values: values[1] if values[0] else None)
    )
    public_address: pulumi.Output[str] = server.ipv4_address
    ssh_address = server.ipv4_address
    private_address: pulumi.Output[str | None] = pulumi.Output.from_input(None)
    depends: list[pulumi.Resource] = [server]
    if private_network is not None:
        attachment = private_network.attach(host.name, server.id, control_plane=role == "server")
        private_address = attachment.ip
        depends.append(attachment)
    return _Machine(
        public_address=public_address,
        ssh_address=ssh_address,
        private_address=private_address,
        depends=depends,
        generated_host_key=generated_key,
        hcloud_server_id=server.id,
        server=server,
        replacement_host_key=replacement,
    )


def provision_machine(
    parent: pulumi.ComponentResource,
    *,
    host: HostSettings,
    role: Literal["server", "worker"],
    settings: StackSettings,
    credentials: SshCredentials,
    ssh_key_id: pulumi.Output[str] | None,
    creation_firewall_id: pulumi.Output[str] | None = None,
    placement_group_id: pulumi.Output[str] | None = None,
    private_network: PrivateNetwork | None,
    firewall_managed: bool,
    shards: OperationShards,
) -> NodeEndpoint:
    """Create (or adopt) the machine for `host` as children of `parent`."""
    if host.kind == "hetzner":
        machine = _hetzner_machine(
            parent,
            host=host,
            role=role,
            settings=settings,
            ssh_key_id=ssh_key_id,
            creation_firewall_id=creation_firewall_id,
            placement_group_id=placement_group_id,
            private_network=private_network,
            shards=shards,
        )
    else:
        machine = _existing_machine(host)
    operations = shards.for_node(host.name)
    login = NodeLogin(
        node=host.name,
        address=machine.ssh_address,
        ssh_port=host.ssh_port,
        ssh_user=credentials.user,
        private_key=credentials.private_key,
        # A key the stack records wins; else the one the program gave the server.
        recorded_host_key=credentials.recorded_host_keys.get(host.name) or machine.generated_host_key,
    )
    # First of the node's resources: a rotated hk3s:ssh.private_key_file is rotated on the host
    # before anything logs in with it (providers.login_key). On a server created here with its
    # host key in user_data it also replaces that key at creation, with one made here and never
    # in user_data (the metadata service serves user_data to anything on the server).
    replacement = machine.replacement_host_key
    login_key = NodeLoginKey(
        f"{host.name}-login-key",
        NodeLoginKeyInputs(
            login=login,
            previous_private_key=credentials.previous_private_key,
            authorized_by="program" if host.kind == "hetzner" else "operator",
            # A fenced worker's rotation waits for its host rather than hold its fence up.
            fenced=role == "worker" and host.name in settings.fenced_workers(),
            replacement_host_key=replacement.private_key if replacement is not None else None,
            replacement_host_public_key=replacement.public_key if replacement is not None else None,
            first_contact_seconds=settings.ssh.first_contact_seconds,
        ),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(machine.depends), provider=operations),
    )
    # The probe pins what the login key's resource saw: the replacement on a server created here
    # (the stack's own pin, hk3s:ssh.host_keys, still wins).
    seen: pulumi.Output[str | None] = pulumi.Output.all(login_key.host_key, machine.generated_host_key).apply(
        lambda keys: keys[0] or keys[1]
    )
    probe_login = dataclasses.replace(login, recorded_host_key=credentials.recorded_host_keys.get(host.name) or seen)
    probe = HostProbe(
        f"{host.name}-probe",
        HostProbeInputs(
            login=probe_login,
            expected_address=machine.private_address if host.kind == "hetzner" else None,
            first_contact_seconds=settings.ssh.first_contact_seconds,
            created_by_program=host.kind == "hetzner",
            trust_on_first_use=settings.ssh.trust_on_first_use,
        ),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[*machine.depends, login_key], provider=operations),
    )
    return NodeEndpoint(
        name=host.name,
        role=role,
        public_address=machine.public_address,
        private_address=machine.private_address,
        ssh_address=machine.ssh_address,
        ssh_port=host.ssh_port,
        hcloud_server_id=machine.hcloud_server_id,
        firewall_managed=firewall_managed,
        probe=probe,
        operations=operations,
        login_key=login_key,
        machine=machine.server,
    )
