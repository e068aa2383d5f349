"""Which ports a node opens to whom (the product's port table), as data.

Both the Hetzner cloud firewall and each host firewall are built from this
plan, so the two layers always agree: a cloud firewall in silent disagreement
with the host firewall is how a node joins and is unreachable an hour later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

ANY_IPV4 = "0.0.0.0/0"
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


@dataclass(frozen=True)
class PortRule:
    """One inbound rule: a port (or range) and protocol, open to these sources."""

    port: str
    protocol: Literal["tcp", "udp"]
    sources: tuple[str, ...]
    purpose: str


def pod_network_port(pod_network: str) -> tuple[str, str]:
    """The node-to-node port of the pod network: (port, purpose)."""
    if pod_network == "wireguard":
        return WIREGUARD_PORT, "pod network (WireGuard)"
    if pod_network == "vxlan":
        return VXLAN_PORT, "pod network (VXLAN)"
    raise ValueError(f"unknown pod network {pod_network!r}; expected wireguard or vxlan")


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
    rules = [PortRule(SSH_PORT, "tcp", (ANY_IPV4,), "SSH")]
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
