"""ClusterServer: the k3s server, the cluster's only control plane."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_hcloud as hcloud

from cluster_settings.models import ClusterSettings, StackSettings
from components.firewall_rules import cloud_firewall_rules
from components.hetzner_project import hetzner_name, ownership_labels
from components.hetzner_ssh_key import cluster_ssh_key
from components.machine import provision_machine
from components.node_endpoint import NodeEndpoint, SshCredentials
from components.private_network import PrivateNetwork
from components.provider_shards import OperationShards
from node_operations.firewall_plan import bootstrap_rules
from providers.inputs import K3sRelease
from providers.k3s_server import K3sServer, K3sServerInputs
from providers.k3s_upgrade import K3sUpgrade, K3sUpgradeInputs, UpgradedWorker
from providers.network_plan import NetworkPlan, NetworkPlanInputs, PlanHost
from providers.node_access_check import NodeAccessCheck, NodeAccessCheckInputs, RecordedHost

FLANNEL_BACKEND = {"wireguard": "wireguard-native", "vxlan": "vxlan"}


def k3s_release(cluster: ClusterSettings, version: pulumi.Input[str]) -> K3sRelease:
    """The k3s a node runs: `version`, uploaded from hk3s:cluster.k3s_binary when it is set."""
    return K3sRelease(
        k3s_version=version,
        k3s_binary=str(cluster.k3s_binary) if cluster.k3s_binary else None,
        k3s_sha256=cluster.k3s_sha256,
    )


@dataclass(frozen=True)
class ClusterServerArgs:
    """Arguments of `ClusterServer`."""

    settings: StackSettings
    """The validated stack settings."""
    credentials: SshCredentials
    """The SSH key that logs in to every node."""
    private_network: PrivateNetwork | None
    """The Hetzner network to attach the server to, when the program creates one."""
    shards: OperationShards
    """The provider processes node operations run in."""


def creation_firewall(parent: pulumi.Resource, settings: StackSettings) -> hcloud.Firewall:
    """The cloud firewall every Hetzner server carries from creation: the plan's SSH rule and
    ICMP (what the program and the operator need from the first boot; every other port opens
    with the cluster's firewall once the peers' addresses are known, and each server leaves this
    one then: components.firewall_rules)."""
    name = hetzner_name(settings.cluster.name, pulumi.get_stack(), "ssh-only")
    return hcloud.Firewall(
        f"{settings.cluster.name}-ssh-only",
        name=name,
        rules=cloud_firewall_rules(bootstrap_rules()),
        labels=ownership_labels(settings.cluster.name, pulumi.get_stack()),
        opts=pulumi.ResourceOptions(parent=parent),
    )


class ClusterServer(pulumi.ComponentResource):
    """The server's machine (Hetzner server or existing host), the cluster's
    Hetzner SSH key, and k3s on the server (`install_k3s`)."""

    endpoint: NodeEndpoint
    ssh_key_id: pulumi.Output[str] | None
    version: pulumi.Output[str]
    ca_hash: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    api_endpoint: pulumi.Output[str]

    def __init__(self, name: str, args: ClusterServerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hk3s:index:ClusterServer", name, None, opts)
        self._args = args
        settings = args.settings
        self.ssh_key_id = None
        self.creation_firewall_id: pulumi.Output[str] | None = None
        if settings.hetzner_hosts():
            if args.credentials.public_key is None:
                raise ValueError("Hetzner servers need the public half of hk3s:ssh.private_key_file")
            self.ssh_key_id = cluster_ssh_key(self, settings, args.credentials.public_key)
            if settings.firewall.cloud_firewall:
                self.creation_firewall_id = creation_firewall(self, settings).id
        self.endpoint = provision_machine(
            self,
            host=settings.server,
            role="server",
            settings=settings,
            credentials=args.credentials,
            ssh_key_id=self.ssh_key_id,
            creation_firewall_id=self.creation_firewall_id,
            private_network=args.private_network,
            firewall_managed=settings.firewall.managed,
            shards=args.shards,
        )
        self._k3s: K3sServer | None = None
        self._network: NetworkPlan | None = None

    @property
    def k3s(self) -> K3sServer:
        if self._k3s is None:
            raise RuntimeError("install_k3s() has not been called")
        return self._k3s

    @property
    def network(self) -> NetworkPlan:
        if self._network is None:
            raise RuntimeError("plan_network() has not been called")
        return self._network

    def plan_network(self, workers: Sequence[NodeEndpoint]) -> NetworkPlan:
        """Decide the network mode and every node's cluster address from the probes
        of the server and `workers` (providers.network_plan)."""
        settings = self._args.settings

        def host(endpoint: NodeEndpoint) -> PlanHost:
            return PlanHost(
                node=endpoint.name,
                ssh_address=endpoint.ssh_address,
                ssh_port=endpoint.ssh_port,
                host_key=endpoint.probe.host_key,
                public_address=endpoint.public_address,
                private_address=endpoint.private_address,
                ipv4_addresses=endpoint.probe.ipv4_addresses,
                ipv4_routes=endpoint.probe.ipv4_routes,
            )

        self._network = NetworkPlan(
            "network-plan",
            NetworkPlanInputs(
                mode_setting=settings.network.mode,
                private_network=settings.network.private_network,
                pod_cidr=settings.cluster.pod_cidr,
                service_cidr=settings.cluster.service_cidr,
                ssh_user=self._args.credentials.user,
                private_key=self._args.credentials.private_key,
                server=host(self.endpoint),
                workers=[host(worker) for worker in workers],
                pod_network=settings.cluster.pod_network,
                vxlan_over_public_addresses=settings.cluster.vxlan_over_public_addresses == "allowed",
            ),
            opts=self.endpoint.options(self, [self.endpoint.probe, *(worker.probe for worker in workers)]),
        )
        return self._network

    def cluster_address(self, node: str) -> pulumi.Output[str]:
        """The address the other nodes use for `node`, in the decided mode."""
        return self.network.addresses.apply(lambda addresses: addresses[node])

    def node_ip(self, node: str) -> pulumi.Output[str]:
        """The address `node`'s k3s binds to: its cluster address, or behind a 1:1 NAT the
        host's own address (the cluster address is then its external IP)."""
        return pulumi.Output.all(self.network.node_ips, self.network.addresses).apply(
            lambda maps: (maps[0] or maps[1])[node]
        )

    def check_node_access(self, workers: Sequence[NodeEndpoint]) -> NodeAccessCheck:
        """Once per run that changes the stack's nodes, before any join: log in to every
        worker already registered in the cluster (their firewalls change with each join)."""
        return NodeAccessCheck(
            "node-access",
            NodeAccessCheckInputs(
                login=self.endpoint.login(self._args.credentials),
                server_firewall_managed=self.endpoint.firewall_managed,
                nodes=[
                    RecordedHost(
                        node=worker.name,
                        address=worker.ssh_address,
                        ssh_port=worker.ssh_port,
                        host_key=worker.probe.host_key,
                        firewall_managed=worker.firewall_managed,
                    )
                    for worker in workers
                ],
            ),
            opts=self.endpoint.options(self, [self.k3s, *(worker.probe for worker in workers)]),
        )

    def upgrade_workers(self, workers: Sequence[NodeEndpoint]) -> K3sUpgrade:
        """After k3s on the server, before any join: the joined workers moved to the server's
        release one at a time when it changed (providers.k3s_upgrade). `worker_version` is the
        release the workers join and run at, known once they all run it."""
        cluster = self._args.settings.cluster
        upgrade = K3sUpgrade(
            "k3s-upgrade",
            K3sUpgradeInputs(
                login=self.endpoint.login(self._args.credentials),
                k3s=k3s_release(cluster, self.version),
                target_version=cluster.k3s_version,
                workers=[
                    UpgradedWorker(
                        node=worker.name,
                        address=worker.ssh_address,
                        ssh_port=worker.ssh_port,
                        recorded_host_key=worker.probe.host_key,
                    )
                    for worker in workers
                ],
                drain_on_minor_upgrade=cluster.drain_on_minor_upgrade,
                api_wait_seconds=cluster.api_wait_seconds,
                fenced=self._args.settings.fenced_workers(),
            ),
            opts=self.endpoint.options(self, [self.k3s, *(worker.probe for worker in workers)]),
        )
        self.worker_version = upgrade.version
        return upgrade

    def install_k3s(
        self, after: Sequence[pulumi.Resource], firewall_rules: pulumi.Output[list[dict[str, Any]]] | None = None
    ) -> None:
        """Install or adopt k3s once the resources in `after` (the firewalls) exist;
        `firewall_rules` (the server's plan) is checked against a firewall the operator runs."""
        settings = self._args.settings
        cluster = settings.cluster
        self._k3s = K3sServer(
            f"{self.endpoint.name}-k3s",
            K3sServerInputs(
                login=self.endpoint.login(self._args.credentials),
                k3s=k3s_release(cluster, cluster.k3s_version),
                pod_cidr=cluster.pod_cidr,
                service_cidr=cluster.service_cidr,
                flannel_backend=FLANNEL_BACKEND[cluster.pod_network],
                pod_network=cluster.pod_network,
                ingress=cluster.ingress,
                flannel_external_ip=self.network.nat_nodes.apply(lambda nodes: True if nodes else None),
                node_ip=self.node_ip(self.endpoint.name),
                node_external_ip=self.endpoint.public_address,
                network_mode=self.network.mode,
                approve_restart=settings.network.approve_server_restart,
                registry=cluster.registry,
                teardown_allowed=cluster.teardown_allowed,
                firewall_managed=self.endpoint.firewall_managed,
                no_firewall_acknowledged=settings.firewall.none_acknowledged,
                operator_firewall_rules=None if self.endpoint.firewall_managed else firewall_rules,
                kubeconfig_used=settings.storage.install_longhorn,
            ),
            opts=self.endpoint.options(self, [self.endpoint.probe, self.network, *after]),
        )
        self.version = self._k3s.version
        self.ca_hash = self._k3s.ca_hash
        self.kubeconfig = self._k3s.kubeconfig
        self.api_endpoint = self._k3s.api_endpoint
        self.register_outputs(
            {
                "address": self.endpoint.public_address,
                "version": self.version,
                "ca_hash": self.ca_hash,
                "kubeconfig": self.kubeconfig,
                "api_endpoint": self.api_endpoint,
            }
        )
