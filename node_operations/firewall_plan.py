"""Which ports a node opens to whom (the product's port table), as data.

Both the Hetzner cloud firewall and each host firewall are built from this
plan, so the two layers always agree: a cloud firewall in silent disagreement
with the host firewall is how a node joins and is unreachable an hour later.
That holds for ICMP (`ICMP_RULE`) and for the SSH-only firewall a new Hetzner
server carries from its first boot (`bootstrap_rules`) too: Hetzner lets in
what any attached firewall allows, so a rule kept anywhere outside this plan
could never be narrowed by it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

ANY_IPV4 = "0.0.0.0/0"
ANY_IPV6 = "::/0"
SSH_PORT = "22"
KUBE_API_PORT = "6443"
KUBELET_PORT = "10250"
NODE_METRICS_PORT = "9100"
WIREGUARD_PORT = "51820"
VXLAN_PORT = "8472"
NODEPORT_RANGE = "30000-32767"
# k3s's Traefik, published by ServiceLB as hostPorts: only on the server, and only when asked for.
INGRESS_PORTS = ("80", "443")

Role = Literal["server", "worker"]

# Hetzner Cloud's metadata service: it serves the server's user_data (which carries the
# server's private SSH host keys) to anything that asks from the server, for the server's
# whole life. Pods have no business there; on a Hetzner server the forward path drops their
# traffic to it (`NodeFirewallPlan.block_metadata`).
METADATA_ADDRESS = "169.254.169.254"


@dataclass(frozen=True)
class PortRule:
    """One inbound rule: a port (or range) and protocol, open to these sources."""

    port: str
    protocol: Literal["tcp", "udp"]
    sources: tuple[str, ...]
    purpose: str


@dataclass(frozen=True)
class IcmpRule:
    """ICMP every node lets in: the host firewall names its types; Hetzner's cloud firewall
    has no types, so it lets in ICMP from the same sources."""

    sources: tuple[str, ...]
    ipv4_types: tuple[str, ...]
    ipv6_types: tuple[str, ...]
    purpose: str


# Path-MTU discovery rides on ICMP errors (pod traffic is encapsulated twice: WireGuard or
# VXLAN inside the node's link), so dropping them stalls every large packet; echo lets an
# operator ping a node. IPv6 needs neighbour discovery as well.
ICMP_RULE = IcmpRule(
    sources=(ANY_IPV4, ANY_IPV6),
    ipv4_types=("echo-request", "echo-reply", "destination-unreachable", "time-exceeded", "parameter-problem"),
    ipv6_types=(
        "echo-request",
        "echo-reply",
        "destination-unreachable",
        "time-exceeded",
        "parameter-problem",
        "packet-too-big",
        "nd-neighbor-solicit",
        "nd-neighbor-advert",
        "nd-router-solicit",
        "nd-router-advert",
    ),
    purpose="ICMP errors and echo (path-MTU discovery)",
)


def ssh_rule() -> PortRule:
    """SSH, open to every source on every node: the program logs in from wherever it runs."""
    return PortRule(SSH_PORT, "tcp", (ANY_IPV4,), "SSH")


def bootstrap_rules() -> list[PortRule]:
    """What a new Hetzner server lets in before its peers' addresses are known (with ICMP_RULE):
    the plan's own SSH rule, so narrowing SSH here narrows it from the first boot too."""
    return [ssh_rule()]


def pod_network_port(pod_network: str) -> tuple[str, str]:
    """The node-to-node port of the pod network: (port, purpose)."""
    if pod_network == "wireguard":
        return WIREGUARD_PORT, "pod network (WireGuard)"
    if pod_network == "vxlan":
        return VXLAN_PORT, "pod network (VXLAN)"
    raise ValueError(f"unknown pod network {pod_network!r}; expected wireguard or vxlan")


def port_rules_from(data: Sequence[Mapping[str, object]]) -> tuple[PortRule, ...]:
    """Port rules from their plain form (a resource's inputs: `dataclasses.asdict` of each)."""
    return tuple(
        PortRule(str(r["port"]), r["protocol"], tuple(r["sources"]), str(r.get("purpose", "")))  # type: ignore[arg-type]
        for r in data
    )


def listening_ports(role: Role, pod_network: str) -> list[PortRule]:
    """Every port a node of `role` listens on for the cluster besides SSH, each with no
    source of its own: the plan (`inbound_rules`) opens each to named sources only (a
    server alone has no peers and opens none of them), so a firewall that lets any other
    source in exposes it. 8888/tcp and the NodePorts are judged on their own."""
    port, purpose = pod_network_port(pod_network)
    ports = [PortRule(KUBELET_PORT, "tcp", (), "kubelet"), PortRule(port, "udp", (), purpose)]
    if role == "server":
        return [PortRule(KUBE_API_PORT, "tcp", (), "Kubernetes API"), *ports]
    return [*ports, PortRule(NODE_METRICS_PORT, "tcp", (), "node metrics")]


def _cidr(address: str) -> str:
    return address if "/" in address else f"{address}/32"


def inbound_rules(
    *,
    role: Role,
    node: str,
    peers: Mapping[str, str],
    server: str,
    pod_network: str,
    operator_access: Sequence[str] = (),
    nodeports_open: bool = False,
    ingress: bool = False,
) -> list[PortRule]:
    """Inbound rules for `node`.

    `peers` maps every node of the cluster (this one included or not) to the
    address the cluster's network mode uses for it. Sources are sorted so the
    same cluster always yields the same rules (no spurious diffs). `ingress`
    opens 80/443 on the server, the one node ServiceLB publishes Traefik on;
    a worker never opens more than SSH to every source (NodePorts aside, when
    the stack opens them).
    """
    others = tuple(sorted(_cidr(address) for name, address in peers.items() if name != node))
    port, purpose = pod_network_port(pod_network)
    rules = [ssh_rule()]
    if role == "server":
        workers = tuple(sorted(_cidr(address) for name, address in peers.items() if name != server))
        api_sources = tuple(sorted({*workers, *(_cidr(net) for net in operator_access)}))
        if api_sources:
            rules.append(PortRule(KUBE_API_PORT, "tcp", api_sources, "Kubernetes API from workers and operators"))
    if others:
        rules.append(PortRule(port, "udp", others, purpose))
        rules.append(PortRule(KUBELET_PORT, "tcp", others, "kubelet"))
    if role == "worker" and server in peers:
        rules.append(PortRule(NODE_METRICS_PORT, "tcp", (_cidr(peers[server]),), "node metrics from the server"))
    if role == "server" and ingress:
        for ingress_port in INGRESS_PORTS:
            rules.append(PortRule(ingress_port, "tcp", (ANY_IPV4,), "ingress (Traefik through ServiceLB)"))
    if nodeports_open:
        rules.append(PortRule(NODEPORT_RANGE, "tcp", (ANY_IPV4,), "NodePorts (opened by config)"))
        rules.append(PortRule(NODEPORT_RANGE, "udp", (ANY_IPV4,), "NodePorts (opened by config)"))
    return rules
