"""The order the components are built in; `__main__` and the component tests
both call `build_cluster`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_hcloud as hcloud

from cluster_settings.models import StackSettings
from cluster_settings.values import NETWORK_ZONE_OF_LOCATION
from components.cluster_server import ClusterServer, ClusterServerArgs
from components.firewall_rules import FirewallRules, FirewallRulesArgs
from components.hetzner_project import (
    check_hetzner_project,
    hetzner_api_token,
    hetzner_name,
    ownership_labels,
    planned_names,
)
from components.login_key_rotation import retire_previous_login_keys
from components.node_endpoint import NodeEndpoint, SshCredentials
from components.private_network import PrivateNetwork, PrivateNetworkArgs
from components.provider_shards import OperationShards
from components.storage_copies import StorageCopies, StorageCopiesArgs, cluster_identity
from components.worker_node import WorkerNode, WorkerNodeArgs
from providers.longhorn_node_role import LonghornNodeRole, LonghornNodeRoleInputs
from providers.teardown_guard import TeardownGuard, TeardownGuardInputs
from providers.worker_roster import RosterMember, WorkerRoster, WorkerRosterInputs
from remote_access.api_forward import forward_port


@dataclass(frozen=True)
class BuiltCluster:
    """Everything `build_cluster` made, for exports and tests."""

    private_network: PrivateNetwork | None
    server: ClusterServer
    workers: list[WorkerNode]
    firewall: FirewallRules
    storage: StorageCopies


def read_credentials(settings: StackSettings) -> SshCredentials:
    """The SSH key files named by the settings; the private key becomes a secret."""
    key_file = settings.ssh.private_key_file.expanduser()
    public_file = key_file.with_name(key_file.name + ".pub")
    return SshCredentials(
        user=settings.ssh.user,
        private_key=pulumi.Output.secret(key_file.read_text()),
        public_key=public_file.read_text().strip() if public_file.is_file() else None,
        recorded_host_keys=dict(settings.ssh.host_keys),
        previous_private_key=pulumi.Output.secret(previous.expanduser().read_text())
        if (previous := settings.ssh.previous_private_key_file)
        else None,
    )


def _order(
    registered: list[pulumi.Resource], roster: list[WorkerRoster], args: pulumi.ResourceTransformationArgs
) -> pulumi.ResourceTransformationResult | None:
    """Every custom resource is listed in `registered`, for the teardown guard. Every resource
    made after the roster waits for it (`roster` holds it once it exists; resources made
    before it are the machines it records the logins of): Pulumi runs updates before deletes,
    so a leaving worker is removed (or its removal refused) by the roster before any peer's
    firewall drops it."""
    if isinstance(args.resource, pulumi.CustomResource):
        registered.append(args.resource)
    if not roster or args.resource is roster[0]:
        return None
    return pulumi.ResourceTransformationResult(
        args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(depends_on=[roster[0]]))
    )


def _roster(
    settings: StackSettings, credentials: SshCredentials, server: ClusterServer, workers: list[WorkerNode]
) -> WorkerRoster:
    """The roster, with how to log in to each node: a worker that leaves the stack is removed
    with the login recorded here."""

    def member(endpoint: NodeEndpoint) -> RosterMember:
        return RosterMember(
            node=endpoint.name,
            address=endpoint.ssh_address,
            ssh_port=endpoint.ssh_port,
            recorded_host_key=endpoint.probe.host_key,
            firewall_managed=endpoint.firewall_managed,
        )

    endpoints = [server.endpoint, *(worker.endpoint for worker in workers)]
    return WorkerRoster(
        "workers",
        WorkerRosterInputs(
            workers=sorted(worker.name for worker in settings.all_workers()),
            server=member(server.endpoint),
            members=[member(worker.endpoint) for worker in workers],
            ssh_user=credentials.user,
            private_key=credentials.private_key,
            longhorn=settings.storage.install_longhorn,
            minimal_available_percent=settings.storage.minimal_available_percent,
            pod_network=settings.cluster.pod_network,
            api_wait_seconds=settings.cluster.api_wait_seconds,
            forced=settings.forced_removals(),
        ),
        # It logs in to the server with the run's key: after a rotation put that key there.
        opts=pulumi.ResourceOptions(depends_on=[e.login_key for e in endpoints if e.login_key is not None]),
    )


def placement_groups(settings: StackSettings) -> dict[str, hcloud.PlacementGroup]:
    """One Hetzner spread placement group per pool, location and 10 workers (Hetzner's limit),
    so a pool's workers run on different physical hosts. A group exists while one of its
    workers does: created before its first server, deleted after its last."""
    stack = pulumi.get_stack()
    return {
        group: hcloud.PlacementGroup(
            f"placement-{group}",
            name=hetzner_name(settings.cluster.name, stack, group),
            type="spread",
            labels=ownership_labels(settings.cluster.name, stack),
        )
        for group in settings.placement_groups()
    }


def _private_network(settings: StackSettings) -> PrivateNetwork:
    """The Hetzner network the created servers are attached to."""
    return PrivateNetwork(
        "private-network",
        PrivateNetworkArgs(
            cluster_name=settings.cluster.name,
            ip_range=settings.network.private_network_cidr,
            subnet_range=settings.network.private_subnet_cidr,
            network_zone=NETWORK_ZONE_OF_LOCATION[settings.server.location or settings.cluster.location],
            protect=settings.cluster.control_plane_protected,
        ),
    )


def _api_forward_port(settings: StackSettings) -> int:
    """The local port of the stack's forward to the Kubernetes API (remote_access.api_forward)."""
    return settings.cluster.api_forward_port or forward_port(pulumi.get_project(), pulumi.get_stack())


def _storage(
    settings: StackSettings, credentials: SshCredentials, server: ClusterServer, workers: Sequence[WorkerNode]
) -> StorageCopies:
    """Longhorn and the storage classes, applied through a forward of the server's SSH session;
    uninstalled by a teardown before any worker is wiped (the server's k3s, which the Kubernetes
    provider depends on, is wiped after it too)."""
    return StorageCopies(
        "storage",
        StorageCopiesArgs(
            storage=settings.storage,
            kubeconfig=server.kubeconfig,
            after=[server.k3s],
            server_login=server.endpoint.login(credentials),
            forward_port=_api_forward_port(settings),
            teardown_allowed=settings.cluster.teardown_allowed,
            control_plane_lost=settings.cluster.control_plane_lost,
            cluster_identity=cluster_identity(
                settings.server.name, server.endpoint.hcloud_server_id or server.endpoint.ssh_address
            ),
            wiped_after=[worker.join_resource for worker in workers if worker.join_resource is not None],
            node_taints=[taint for worker in settings.all_workers() for taint in worker.taints],
        ),
    )


def _longhorn_roles(
    settings: StackSettings,
    credentials: SshCredentials,
    server: ClusterServer,
    workers: Sequence[WorkerNode],
    storage: StorageCopies,
) -> list[LonghornNodeRole]:
    """Where Longhorn may place copies (node_operations/longhorn_node_role.py): the server always,
    a worker once its disk passed the probe; applied once Longhorn runs and the node has joined and
    (a worker) had its disk probed. None without Longhorn."""
    if storage.release is None:
        return []
    login = server.endpoint.login(credentials)
    api_wait = settings.cluster.api_wait_seconds
    roles = [
        LonghornNodeRole(
            f"{settings.server.name}-longhorn-role",
            LonghornNodeRoleInputs(
                login=login,
                longhorn_node=settings.server.name,
                server=True,
                holds_copies=True,
                api_wait_seconds=api_wait,
            ),
            # Each node's role runs in its node's provider process (as its other operations do).
            opts=server.endpoint.options(storage, [storage.release]),
        )
    ]
    for worker in workers:
        join, probe = worker.join_resource, worker.disk_probe
        if join is None:
            continue
        roles.append(
            LonghornNodeRole(
                f"{worker.endpoint.name}-longhorn-role",
                LonghornNodeRoleInputs(
                    login=login,
                    longhorn_node=worker.endpoint.name,
                    # A worker that opted out (holds_copies: false) has no probe and holds none.
                    holds_copies=probe.eligible if probe is not None else False,
                    join_run=join.join_run,
                    api_wait_seconds=api_wait,
                ),
                opts=worker.endpoint.options(storage, [storage.release, join, *([probe] if probe is not None else [])]),
            )
        )
    return roles


def build_cluster(settings: StackSettings, credentials: SshCredentials) -> BuiltCluster:
    """Machines first (so every address is known), then the roster (a leaving worker is
    judged and removed before anything of the cluster changes), then the network decision,
    then firewalls, then k3s on the server, then the joins, then storage."""
    uses_private_network = bool(settings.hetzner_hosts()) and settings.network.mode != "public"
    # What Hetzner would refuse halfway through the run (a type it does not offer there, a name
    # another owner holds) fails here, before anything is registered.
    check_hetzner_project(
        settings, pulumi.get_stack(), planned_names(settings, pulumi.get_stack(), uses_private_network)
    )
    registered: list[pulumi.Resource] = []
    roster_made: list[WorkerRoster] = []
    # Registered first, so the components made now run it for the children they make later.
    pulumi.runtime.register_stack_transformation(functools.partial(_order, registered, roster_made))
    network = _private_network(settings) if uses_private_network else None
    shards = OperationShards()
    server = ClusterServer(
        settings.server.name,
        ClusterServerArgs(settings=settings, credentials=credentials, private_network=network, shards=shards),
    )
    placement = placement_groups(settings)
    workers: list[WorkerNode] = []
    for spec in settings.all_workers():
        member = settings.pool_member(spec)
        group = placement.get(member.placement_group) if member and member.placement_group else None
        workers.append(
            WorkerNode(
                spec.name,
                WorkerNodeArgs(
                    settings=settings,
                    worker=spec,
                    credentials=credentials,
                    ssh_key_id=server.ssh_key_id,
                    creation_firewall_id=server.creation_firewall_id,
                    private_network=network,
                    shards=shards,
                    placement_group_id=group.id if group is not None else None,
                ),
            )
        )
    # After the machines (it records how to log in to each), before everything that touches the cluster.
    roster = _roster(settings, credentials, server, workers)
    roster_made.append(roster)
    network_plan = server.plan_network([worker.endpoint for worker in workers])
    firewall = FirewallRules(
        "firewall",
        FirewallRulesArgs(
            settings=settings,
            credentials=credentials,
            nodes=[server.endpoint, *(w.endpoint for w in workers)],
            cluster_addresses=network_plan.addresses,
            bootstrap_firewall_id=server.creation_firewall_id,
        ),
    )
    server.install_k3s(
        after=firewall.in_place(server.endpoint.name), firewall_rules=firewall.node_rules[server.endpoint.name]
    )
    # A fenced worker may be off for good: runs that add or remove others never log in to it.
    fenced = settings.fenced_workers()
    node_access = server.check_node_access([w.endpoint for w in workers if w.endpoint.name not in fenced])
    server.upgrade_workers([worker.endpoint for worker in workers])
    for worker in workers:
        worker.join(
            server,
            after=[*firewall.in_place(worker.endpoint.name), node_access],
            firewall_rules=firewall.node_rules[worker.endpoint.name],
        )
    storage = _storage(settings, credentials, server, workers)
    roles = _longhorn_roles(settings, credentials, server, workers, storage)
    # Last: a rotated login key leaves the nodes only once every resource holds the new one.
    retire_previous_login_keys(
        [server.endpoint, *(w.endpoint for w in workers)],
        credentials,
        [roster, server, *workers, firewall, *storage.logins, *roles],
    )
    # Very last, depending on everything: in a destroy its delete runs first and alone, and
    # refuses unless hk3s:cluster.teardown allowed it (providers.teardown_guard).
    # The token the Hetzner resources record now: a destroy checks it is still taken.
    token, endpoint = hetzner_api_token() if settings.hetzner_hosts() else (None, None)
    TeardownGuard(
        "teardown-guard",
        TeardownGuardInputs(
            teardown_allowed=settings.cluster.teardown_allowed,
            stack=pulumi.get_stack(),
            hcloud_token=token,
            hcloud_endpoint=endpoint,
            # No forward serves a lost control plane: the destroy forgets Longhorn's objects instead.
            api_forward_port=_api_forward_port(settings)
            if settings.storage.install_longhorn and not settings.cluster.control_plane_lost
            else 0,
        ),
        opts=pulumi.ResourceOptions(depends_on=list(registered)),
    )
    return BuiltCluster(network, server, workers, firewall, storage)
