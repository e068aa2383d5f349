"""WorkerNode: one worker's machine, its connection checks, its join, and (when
it may hold copies) its disk probe; its fence when the stack fences it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi

from cluster_settings.loading import SettingsError
from cluster_settings.models import StackSettings, WorkerSettings
from cluster_settings.rules import SettingProblem
from components.cluster_server import ClusterServer, k3s_release
from components.hetzner_project import NODE_LABEL, hetzner_api_token
from components.hetzner_ssh_key import OWNER_LABEL, stack_owner
from components.machine import provision_machine
from components.node_endpoint import NodeEndpoint, SshCredentials
from components.private_network import PrivateNetwork
from components.provider_shards import OperationShards
from node_operations.firewall_plan import KUBE_API_PORT
from providers.connectivity_check import ConnectivityCheck, ConnectivityCheckInputs
from providers.disk_probe import OUTPUTS as DISK_PROBE_OUTPUTS
from providers.disk_probe import DiskProbe, DiskProbeInputs
from providers.node_fence import NodeFence, NodeFenceInputs
from providers.node_join import NodeJoin, NodeJoinInputs

LONGHORN_DISK_PATH = "/var/lib/longhorn"
HCLOUD_TOKEN = "hcloud:token"
VALIDATION_TAINT = "hk3s.dev/validating=true:NoSchedule"


def hetzner_api_access(worker: str) -> tuple[pulumi.Output[str], str | None]:
    """The Hetzner API's token (a secret) and endpoint for fencing `worker`, read where the Hetzner
    Pulumi provider reads them: hcloud:token and hcloud:endpoint, else HCLOUD_TOKEN and
    HCLOUD_ENDPOINT in the environment. No token is a settings error: the fence cannot prove the
    worker off without it."""
    token, endpoint = hetzner_api_token()
    if token is None:
        raise SettingsError(
            [
                SettingProblem(
                    HCLOUD_TOKEN,
                    f"hk3s:fences.{worker} fences a Hetzner server, which the fence powers off through the Hetzner "
                    f"API, but there is no token; set it: pulumi config set --secret {HCLOUD_TOKEN} <token>",
                )
            ]
        )
    return token, endpoint


@dataclass(frozen=True)
class WorkerNodeArgs:
    """Arguments of `WorkerNode`."""

    settings: StackSettings
    """The validated stack settings."""
    worker: WorkerSettings
    """This worker's entry of hk3s:workers."""
    credentials: SshCredentials
    """The SSH key that logs in to every node."""
    ssh_key_id: pulumi.Output[str] | None
    """The cluster's Hetzner SSH key, for a worker the program creates."""
    private_network: PrivateNetwork | None
    """The Hetzner network to attach a created worker to."""
    shards: OperationShards
    """The provider processes node operations run in."""
    creation_firewall_id: pulumi.Output[str] | None = None
    """The SSH-only cloud firewall a created worker carries from its first boot."""
    placement_group_id: pulumi.Output[str] | None = None
    """The spread placement group a created worker of a pool starts in."""


class WorkerNode(pulumi.ComponentResource):
    """A worker: machine first, then (`join`) checks, join, disk probe, fence."""

    endpoint: NodeEndpoint
    name: pulumi.Output[str]
    addresses: pulumi.Output[list[str]]
    network_mode: pulumi.Output[str]
    k3s_version: pulumi.Output[str]
    state: pulumi.Output[str]

    def __init__(self, name: str, args: WorkerNodeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hk3s:index:WorkerNode", name, None, opts)
        self._args = args
        self.endpoint = provision_machine(
            self,
            host=args.worker,
            role="worker",
            settings=args.settings,
            credentials=args.credentials,
            ssh_key_id=args.ssh_key_id,
            creation_firewall_id=args.creation_firewall_id,
            placement_group_id=args.placement_group_id,
            private_network=args.private_network,
            firewall_managed=args.settings.worker_firewall_managed(args.worker),
            shards=args.shards,
        )
        self.join_resource: NodeJoin | None = None
        self.disk_probe: DiskProbe | None = None

    def join(
        self,
        server: ClusterServer,
        after: Sequence[pulumi.Resource],
        firewall_rules: pulumi.Output[list[dict[str, Any]]] | None = None,
    ) -> None:
        """Join the worker to `server` once `after` (the firewalls and the run's check of
        the recorded nodes) exist."""
        settings, worker = self._args.settings, self._args.worker
        # The fence never waits on the worker's own join: a dead worker's pending change (an address,
        # a registry, a validation image) cannot be applied while it is down, and its join's update
        # would fail before the fence could run. So the fence comes first and the join after it: the
        # join then finds the fence's record and leaves the change pending until the lift (a lift
        # is the fence's delete, which the engine runs after the run's updates, the join's included).
        login = self.endpoint.login(self._args.credentials)
        fence = settings.fences.get(worker.name)
        fence_resource: NodeFence | None = None
        if fence is not None:
            hcloud_server = self.endpoint.hcloud_server_id if worker.kind == "hetzner" else worker.hcloud_server
            token, endpoint = hetzner_api_access(worker.name) if hcloud_server is not None else (None, None)
            network = self._args.private_network
            fence_resource = NodeFence(
                f"{worker.name}-fence",
                NodeFenceInputs(
                    login=login,
                    powered_off=fence.powered_off,
                    accept_stale_data=fence.accept_stale_data,
                    hcloud_server=hcloud_server,
                    hcloud_token=token,
                    hcloud_endpoint=endpoint,
                    # What proves the server is this worker (node_operations.hetzner_identity): a private
                    # address only in this cluster's network; the labels of a server the program created.
                    hcloud_network=network.network_id if network is not None and hcloud_server is not None else None,
                    hcloud_labels={OWNER_LABEL: stack_owner(), NODE_LABEL: worker.name}
                    if worker.kind == "hetzner"
                    else None,
                    kubeconfig=server.kubeconfig,
                    # The fence goes through the server's API, logged in as the join logs in there.
                    server_node=server.endpoint.name,
                    server_address=server.endpoint.ssh_address,
                    server_ssh_port=server.endpoint.ssh_port,
                    server_host_key=server.endpoint.probe.host_key,
                    kubelet_address=server.cluster_address(worker.name),
                    api_wait_seconds=settings.cluster.api_wait_seconds,
                    network_mode=server.network.mode,
                    # Lifting the fence rejoins the worker through the join's checks.
                    server_url=server.cluster_address(server.endpoint.name).apply(
                        lambda address: f"https://{address}:{KUBE_API_PORT}"
                    ),
                    registry=settings.cluster.registry,
                    validation_taint=VALIDATION_TAINT,
                    validation_image=settings.cluster.validation_image,
                    teardown_allowed=settings.cluster.teardown_allowed,
                    node_external_ip=self.endpoint.public_address,
                    stack=pulumi.get_stack(),
                ),
                opts=self.endpoint.options(self, [self.endpoint.probe, server.network, server.k3s, *after]),
            )
        checks = self._connectivity_checks(server, after) if settings.network.mode != "public" else []
        self.join_resource = NodeJoin(
            f"{worker.name}-join",
            self._join_inputs(server, firewall_rules),
            opts=self.endpoint.options(
                self,
                [
                    self.endpoint.probe,
                    server.network,
                    server.k3s,
                    *after,
                    *checks,
                    *([fence_resource] if fence_resource is not None else []),
                ],
            ),
        )
        if worker.holds_copies:
            # At the end of the join, and again at every rejoin (join_run changes with each run of it).
            self.disk_probe = DiskProbe(
                f"{worker.name}-disk",
                DiskProbeInputs(
                    login=login,
                    disk_path=LONGHORN_DISK_PATH,
                    ignore_slow_disk=worker.ignore_slow_disk,
                    threshold_ms=settings.storage.disk_sync_p99_ms,
                    join_run=self.join_resource.join_run,
                ),
                opts=self.endpoint.options(self, [self.join_resource]),
            )
        self.name = self.join_resource.name
        self.addresses = self.join_resource.addresses
        self.network_mode = self.join_resource.network_mode_in_use
        self.k3s_version = self.join_resource.k3s_version_in_use
        self.state = self.join_resource.state
        self.register_outputs(
            {
                "name": self.name,
                "addresses": self.addresses,
                "network_mode": self.network_mode,
                "k3s_version": self.k3s_version,
                "state": self.state,
            }
        )

    def _connectivity_checks(self, server: ClusterServer, after: Sequence[pulumi.Resource]) -> list[pulumi.Resource]:
        """Before joining a private-mode cluster: the server reaches this host's SSH port and
        this host reaches the server's API over the private network (recorded as not
        needed when the plan decides public)."""
        worker, credentials, plan = self._args.worker, self._args.credentials, server.network
        server_end = server.endpoint
        return [
            ConnectivityCheck(
                f"{worker.name}-from-server-ssh",
                ConnectivityCheckInputs(
                    login=server_end.login(credentials),
                    target_node=worker.name,
                    target_address=server.cluster_address(worker.name),
                    target_port=self.endpoint.ssh_port,
                    network_mode=plan.mode,
                ),
                opts=server_end.options(self, [plan, *after]),
            ),
            ConnectivityCheck(
                f"{worker.name}-to-server-api",
                ConnectivityCheckInputs(
                    login=self.endpoint.login(credentials),
                    target_node=server_end.name,
                    target_address=server.cluster_address(server_end.name),
                    target_port=int(KUBE_API_PORT),
                    network_mode=plan.mode,
                ),
                opts=self.endpoint.options(self, [plan, server.k3s, *after]),
            ),
        ]

    def _join_inputs(
        self, server: ClusterServer, firewall_rules: pulumi.Output[list[dict[str, Any]]] | None
    ) -> NodeJoinInputs:
        settings, worker = self._args.settings, self._args.worker
        server_address = server.cluster_address(server.endpoint.name)
        return NodeJoinInputs(
            login=self.endpoint.login(self._args.credentials),
            server_node=server.endpoint.name,
            # The join logs in to the server too (to create this node's token) with the same key.
            server_address=server.endpoint.ssh_address,
            server_ssh_port=server.endpoint.ssh_port,
            server_host_key=server.endpoint.probe.host_key,
            server_firewall_managed=server.endpoint.firewall_managed,
            server_url=server_address.apply(lambda address: f"https://{address}:{KUBE_API_PORT}"),
            ca_hash=server.ca_hash,
            # The release the workers run: known once every joined worker runs it (K3sUpgrade).
            k3s=k3s_release(settings.cluster, server.worker_version),
            # Checked against the host's own firewall when the operator runs it.
            operator_firewall_rules=None if self.endpoint.firewall_managed else firewall_rules,
            no_firewall_acknowledged=settings.firewall.none_acknowledged,
            recorded_nodes=sorted([settings.server.name, *(w.name for w in settings.all_workers())]),
            network_mode=server.network.mode,
            node_ip=server.node_ip(worker.name),
            # Where peers reach it (differs from the node IP behind a 1:1 NAT).
            cluster_address=server.cluster_address(worker.name),
            node_external_ip=self.endpoint.public_address,
            labels=dict(worker.labels),
            # Given at registration beside the validation taint: no ordinary pod lands first.
            taints=list(worker.taints),
            validation_taint=VALIDATION_TAINT,
            registry=settings.cluster.registry,
            pod_network=settings.cluster.pod_network,
            api_wait_seconds=settings.cluster.api_wait_seconds,
            validation_image=settings.cluster.validation_image,
            teardown_allowed=settings.cluster.teardown_allowed,
        )

    def copies_output(self) -> dict[str, Any]:
        """The worker's entries about volume copies in the stack's `nodes` output: whether it may
        hold them (its disk probe's verdict) and the probe's figures."""
        probe = self.disk_probe
        if probe is None:
            return {"holds_copies": False, "disk": None}
        return {"holds_copies": probe.eligible, "disk": {name: getattr(probe, name) for name in DISK_PROBE_OUTPUTS}}
