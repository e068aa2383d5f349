"""FirewallRules: the Hetzner cloud firewalls and one host firewall per managed
node, both from node_operations.firewall_plan so the two layers agree (ICMP too).

Each Hetzner server is created with the SSH-only cloud firewall (components.cluster_server,
the plan's bootstrap rules) and taken off it once its role's full firewall is attached
(providers.bootstrap_firewall): Hetzner lets in what any attached firewall allows, so only
then do the full firewall's rules, SSH's included, say what reaches the server."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pulumi
import pulumi_hcloud as hcloud

from cluster_settings.models import StackSettings
from components.barrier import Barrier
from components.hetzner_project import hetzner_api_token, hetzner_name, ownership_labels
from components.node_endpoint import NodeEndpoint, SshCredentials
from node_operations.firewall_plan import ICMP_RULE, PortRule, Role, inbound_rules
from providers.bootstrap_firewall import BootstrapFirewallRelease, BootstrapFirewallReleaseInputs
from providers.host_firewall import HostFirewall, HostFirewallInputs


@dataclass(frozen=True)
class FirewallRulesArgs:
    """Arguments of `FirewallRules`."""

    settings: StackSettings
    """The validated stack settings."""
    credentials: SshCredentials
    """The SSH key that logs in to every node."""
    nodes: Sequence[NodeEndpoint]
    """Every node of the cluster, server first."""
    cluster_addresses: pulumi.Output[dict[str, str]]
    """Every node's address in the cluster's network mode (the NetworkPlan's decision)."""
    bootstrap_firewall_id: pulumi.Output[str] | None = None
    """The SSH-only cloud firewall the Hetzner servers are created with, which each leaves once
    its full firewall is attached; None when the stack has no cloud firewall."""


def _rules_for(settings: StackSettings, role: Role, node: str, server: str, peers: dict[str, str]) -> list[PortRule]:
    return inbound_rules(
        role=role,
        node=node,
        peers=peers,
        server=server,
        pod_network=settings.cluster.pod_network,
        operator_access=settings.firewall.operator_access,
        nodeports_open=settings.firewall.nodeports_open,
        ingress=settings.cluster.ingress,
    )


def cloud_firewall_rules(port_rules: Sequence[PortRule]) -> list[hcloud.FirewallRuleArgs]:
    """A Hetzner cloud firewall's rules: the plan's port rules, and its ICMP (Hetzner's rule
    has no ICMP types: it lets in ICMP from the plan's sources)."""
    rules = [
        hcloud.FirewallRuleArgs(
            direction="in",
            protocol=rule.protocol,
            port=rule.port,
            source_ips=list(rule.sources),
            description=rule.purpose,
        )
        for rule in port_rules
    ]
    rules.append(
        hcloud.FirewallRuleArgs(
            direction="in", protocol="icmp", source_ips=list(ICMP_RULE.sources), description=ICMP_RULE.purpose
        )
    )
    return rules


def _cloud_rules(
    settings: StackSettings, role: Role, node: str, server: str, peers: dict[str, str]
) -> list[hcloud.FirewallRuleArgs]:
    return cloud_firewall_rules(_rules_for(settings, role, node, server, peers))


def _host_rules(
    settings: StackSettings, role: Role, node: str, server: str, peers: dict[str, str]
) -> list[dict[str, Any]]:
    return [{**asdict(rule), "sources": list(rule.sources)} for rule in _rules_for(settings, role, node, server, peers)]


def _peer_map(nodes: Sequence[NodeEndpoint], addresses: Sequence[pulumi.Output[str]]) -> pulumi.Output[dict[str, str]]:
    names = [node.name for node in nodes]
    return pulumi.Output.all(*addresses).apply(lambda values: dict(zip(names, values, strict=True)))


class FirewallRules(pulumi.ComponentResource):
    """Cloud firewalls for the Hetzner servers and host firewalls on managed nodes."""

    host_firewalls: dict[str, HostFirewall]
    node_rules: dict[str, pulumi.Output[list[dict[str, Any]]]]
    cloud_firewall_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: FirewallRulesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hk3s:index:FirewallRules", name, None, opts)
        settings = args.settings
        server = next(node for node in args.nodes if node.role == "server")
        names = [node.name for node in args.nodes]
        cluster_peers = args.cluster_addresses.apply(lambda addresses: {name: addresses[name] for name in names})
        # The cloud firewall sees public traffic only, so its sources are public addresses.
        public_peers = _peer_map(args.nodes, [node.public_address for node in args.nodes])

        self.cloud_firewall_ids = {}
        self._waits: list[pulumi.Resource] = []
        if settings.firewall.cloud_firewall:
            for role in ("server", "worker"):
                members = [node for node in args.nodes if node.role == role and node.hcloud_server_id is not None]
                if not members:
                    continue
                # One firewall per role: the server's excludes itself; the workers'
                # admits every node, each worker's peers being all the others.
                rules = public_peers.apply(
                    functools.partial(
                        _cloud_rules, settings, role, server.name if role == "server" else "", server.name
                    )
                )
                firewall = hcloud.Firewall(
                    f"{settings.cluster.name}-{role}s",
                    name=hetzner_name(settings.cluster.name, pulumi.get_stack(), f"{role}s"),
                    rules=rules,
                    labels=ownership_labels(settings.cluster.name, pulumi.get_stack()),
                    opts=pulumi.ResourceOptions(parent=self),
                )
                attachment = hcloud.FirewallAttachment(
                    f"{settings.cluster.name}-{role}s-attachment",
                    firewall_id=firewall.id.apply(int),
                    server_ids=[node.hcloud_server_id.apply(int) for node in members if node.hcloud_server_id],
                    opts=pulumi.ResourceOptions(parent=self),
                )
                self.cloud_firewall_ids[role] = firewall.id
                self._waits.append(attachment)
                if args.bootstrap_firewall_id is not None:
                    self._release_bootstrap(args.bootstrap_firewall_id, firewall, attachment, members)

        self.host_firewalls = {}
        # Hetzner's metadata service serves a server's user_data, its SSH host keys in it, to
        # whatever asks from the server, pods included, unless the forward path drops them: a
        # server the program created there, or an existing worker named as a Hetzner server
        # (hcloud_server). Any other existing host's provider is unknown to the program, and its
        # pods may rely on that provider's metadata service (docs/network-and-firewalls.md, "Which ports are open").
        on_hetzner = {node.name for node in args.nodes if node.hcloud_server_id is not None} | {
            worker.name for worker in settings.all_workers() if worker.hcloud_server is not None
        }
        # Every node's inbound rules: applied where the program runs the firewall, checked
        # by the join where the operator does.
        self.node_rules = {
            node.name: cluster_peers.apply(functools.partial(_host_rules, settings, node.role, node.name, server.name))
            for node in args.nodes
        }
        for node in args.nodes:
            if not node.firewall_managed:
                continue
            rules_data = self.node_rules[node.name]
            inputs = HostFirewallInputs(
                login=node.login(args.credentials),
                role=node.role,
                rules=rules_data,
                nodeports_open=settings.firewall.nodeports_open,
                block_metadata=node.name in on_hetzner,
                cluster_networks=[settings.cluster.pod_cidr, settings.cluster.service_cidr],
                node_addresses=cluster_peers.apply(lambda addresses: sorted(set(addresses.values()))),
                teardown_allowed=settings.cluster.teardown_allowed,
            )
            opts = node.options(self, [node.probe])
            if node.name in settings.fenced_workers():
                # A fenced worker may be powered off: its rules stay as they were while the others
                # change (peers added or removed), so those runs never stop at it. Lifting the fence
                # (its entry removed, the host up again) brings them up to date in the same run.
                # Retained: a fenced worker given up (force_remove) may be gone for good, so its
                # rules are forgotten, not removed over SSH; a lifted fence registers it without.
                opts = pulumi.ResourceOptions.merge(
                    opts,
                    pulumi.ResourceOptions(
                        ignore_changes=["rules", "block_metadata", "cluster_networks", "node_addresses"],
                        retain_on_delete=True,
                    ),
                )
            self.host_firewalls[node.name] = HostFirewall(f"{node.name}-firewall", inputs, opts=opts)
        self._waits.extend(self.host_firewalls.values())
        # Every firewall change as one dependency: each join and each check waits for all of them.
        self._in_place = Barrier("firewalls-in-place", self._waits, opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs(
            {
                "cloud_firewall_ids": self.cloud_firewall_ids,
                "host_firewall_nodes": sorted(self.host_firewalls),
            }
        )

    def _release_bootstrap(
        self,
        bootstrap_firewall_id: pulumi.Output[str],
        firewall: hcloud.Firewall,
        attachment: hcloud.FirewallAttachment,
        members: Sequence[NodeEndpoint],
    ) -> None:
        """Each member leaves the SSH-only firewall, only after `attachment` put it in `firewall`:
        a server is never without a cloud firewall, and from then on the plan alone says what
        reaches it (SSH narrowed in the plan is narrowed at Hetzner too)."""
        token, endpoint = hetzner_api_token()
        for node in members:
            assert node.hcloud_server_id is not None  # members are Hetzner servers
            BootstrapFirewallRelease(
                f"{node.name}-ssh-only-release",
                BootstrapFirewallReleaseInputs(
                    node=node.name,
                    server_id=node.hcloud_server_id,
                    bootstrap_firewall_id=bootstrap_firewall_id,
                    full_firewall_id=firewall.id,
                    hcloud_token=token,
                    hcloud_endpoint=endpoint,
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[attachment], provider=node.operations),
            )

    def in_place(self, node: str) -> list[pulumi.Resource]:
        """What `node`'s join, its checks or the server's set-up waits for: every firewall change
        (one barrier), and the node's own host firewall directly, so that when a worker leaves
        the stack its join's delete (which logs in to it) still runs before its firewall's
        (components.barrier: a barrier that stays orders no delete)."""
        own = self.host_firewalls.get(node)
        return [self._in_place, *([own] if own is not None else [])]
