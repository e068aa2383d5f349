"""The DNAT guard: a forward chain that holds traffic Kubernetes DNATs to the plan, keeps
pods away from the cloud's metadata service and keeps non-nodes away from the pod and Service
networks; beside UFW or firewalld, an input chain that holds DNAT'd traffic to the node itself;
and on every backend a prerouting chain that drops forged packets out of VXLAN
(`fabric_guard_lines`).

DNAT'd traffic (kube-proxy's NodePorts and LoadBalancer addresses, the
hostPorts ServiceLB publishes) is forwarded to a pod and never meets an input
chain, so the chain `dnat_guard` lets a DNAT'd connection through only when the
port it was sent to is open to its source in the plan. It is part of the
program's table with nftables, and a table of its own (`inet hk3s_dnat_guard`,
kept for boot by its own unit) beside UFW or firewalld, whose rules do not
filter DNAT'd traffic by port.

The same chain drops every forwarded packet to the metadata service where the plan asks
(`block_metadata`, a Hetzner server): a pod's traffic leaves through the node's forward path,
never its output path, so one rule here holds on every backend. Traffic the node itself sends
(hostNetwork pods included) goes through the output path and is not held: a hostNetwork pod is
the node, as far as the network can tell.

A Service whose endpoint is the node itself (a hostNetwork pod), and the `kubernetes` Service
(DNAT'd to the server's 6443/tcp), are DNAT'd to the node's own address: the packet meets the
input path, not the forward path. firewalld accepts every DNAT'd packet there before its zones
(firewalld's src/firewall/core/nftables.py, build_default_rules: "Generic accept of all DNAT'd
packets", unless StrictForwardPorts=yes), so beside UFW or firewalld the guard table has a
second chain, `dnat_guard_input`, on the input hook: a DNAT'd connection from outside the
fabric passes only when the port it is delivered to is open to its source in the plan, what
UFW's and the program's own input chains already hold it to.

A host on the nodes' segment (a shared L2 network, a vSwitch) can route the pod and Service
networks through a node: flannel accepts every forwarded packet to the pod network, and a
Service port the plan opens (22/tcp, say) lets its DNAT through. Both chains drop traffic to
those networks (`ct original ip daddr`: the address the client sent to, before any DNAT) that
arrives outside the fabric from an address that is not a node's; nodes' own traffic still passes.
"""

from __future__ import annotations

from collections.abc import Sequence

from host_scripts import script_path
from node_operations.firewall_plan import METADATA_ADDRESS, NODEPORT_RANGE
from node_operations.host_firewall import remote
from node_operations.host_firewall.inspection import FirewallInspection
from node_operations.host_firewall.nft import (
    NftRuleset,
    nft_accept_rules,
    nft_comment,
    nft_fabric,
    nft_objects,
    nft_set_lines,
    nft_table_loaded,
)
from node_operations.host_firewall.plan import NodeFirewallPlan, PlannedRule, planned_rules, port_range, port_text
from remote_access.ssh import SshSession

# Beside UFW or firewalld: the DNAT guard alone, in a table of its own.
NFT_GUARD_TABLE = "hk3s_dnat_guard"
NFT_GUARD_CHAIN = "dnat_guard"
NFT_GUARD_INPUT_CHAIN = "dnat_guard_input"
DNAT_GUARD_PURPOSE = "DNAT to a port the plan keeps closed (NodePort, hostPort, LoadBalancer)"
DNAT_INPUT_PURPOSE = "DNAT to this node on a port the plan keeps closed to the source"
NODEPORTS_CLOSED_PURPOSE = "NodePorts closed (hk3s:firewall.nodeports_open), kube-proxy health-check ports included"
CLUSTER_NETWORKS_PURPOSE = "pod and Service networks from a non-node outside the fabric"
METADATA_PURPOSE = "pods to the cloud metadata service (it serves the host keys)"
REMOTE_GUARD_FILE = f"{remote.REMOTE_DIR}/dnat-guard.nft"


def cluster_networks_rule(cluster_networks: Sequence[str], node_addresses: Sequence[str]) -> list[str]:
    """The drop of traffic to the pod and Service networks from a non-node (none without networks)."""
    if not cluster_networks:
        return []
    rule = f"ct original ip daddr {{ {', '.join(cluster_networks)} }} "
    if node_addresses:
        rule += f"ip saddr != {{ {', '.join(node_addresses)} }} "
    return [rule + f"drop comment {nft_comment(CLUSTER_NETWORKS_PURPOSE)}"]


def dnat_guard_lines(
    planned: Sequence[PlannedRule],
    *,
    block_metadata: bool = False,
    cluster_networks: Sequence[str] = (),
    node_addresses: Sequence[str] = (),
) -> list[str]:
    """The chain that holds DNAT'd traffic to the plan.

    kube-proxy (NodePorts, LoadBalancer addresses) and the hostPorts ServiceLB
    publishes DNAT in prerouting, so their packets are forwarded to a pod and
    never reach an input chain, UFW's or firewalld's included (firewalld even
    accepts every DNAT'd flow in its forward chain, flannel every flow to the
    pod network). Here a DNAT'd connection from outside the cluster fabric
    passes only when the port it was sent to (`ct original proto-dst`) is one
    the plan opens to its source; traffic that was not DNAT'd is left alone, but for traffic to
    `cluster_networks` from outside the fabric and `node_addresses` (dropped).
    With `block_metadata`, first of all: nothing is forwarded to the metadata service (a
    reject, so a pod's client fails at once instead of waiting out its timeout)."""
    rules = [f"ip daddr {METADATA_ADDRESS} reject comment {nft_comment(METADATA_PURPOSE)}"] if block_metadata else []
    rules += [
        "ct state established,related accept",
        # Pods reaching a Service's ClusterIP are DNAT'd too, on the fabric.
        f"iifname {{ {nft_fabric()} }} accept",
        *cluster_networks_rule(cluster_networks, node_addresses),
    ]
    rules += nft_accept_rules(
        planned,
        lambda item: (
            f"meta l4proto {item.rule.protocol} ct original proto-dst {port_text(item.first_port, item.last_port)}"
        ),
        prefix="ct status dnat ",
    )
    rules.append(f"ct status dnat drop comment {nft_comment(DNAT_GUARD_PURPOSE)}")
    lines = [f"\tchain {NFT_GUARD_CHAIN} {{", "\t\ttype filter hook forward priority filter - 5; policy accept;"]
    lines += [f"\t\t{rule}" for rule in rules]
    lines.append("\t}")
    return lines


def dnat_guard_input_lines(
    planned: Sequence[PlannedRule],
    *,
    cluster_networks: Sequence[str] = (),
    node_addresses: Sequence[str] = (),
    nodeports_closed: bool = False,
) -> list[str]:
    """The input chain beside UFW or firewalld (module docstring): a DNAT'd connection to the
    node itself from outside the fabric passes only when the port it is delivered to is open to
    its source in the plan. Runs before firewalld's own input chain (priority filter + 10) and
    UFW's (filter): a drop in any base chain is final.

    With `nodeports_closed`, a new connection to the NodePort range from outside the fabric is
    dropped too, DNAT'd or not: kube-proxy (iptables mode) serves each LoadBalancer Service's
    healthCheckNodePort itself, on the node, and accepts it from a jump it puts first in the
    filter table's INPUT chain (kubernetes pkg/proxy/iptables/proxier.go: iptablesJumpChains,
    ensured with Prepend; "Capture healthCheckNodePorts"), ahead of UFW's chains and of firewalld's
    when firewalld runs on iptables. Its accept ends only that chain; this drop is final."""
    rules = [
        "ct state established,related accept",
        f'iifname {{ "lo", {nft_fabric()} }} accept',
        *cluster_networks_rule(cluster_networks, node_addresses),
    ]
    rules += nft_accept_rules(
        planned,
        lambda item: f"meta l4proto {item.rule.protocol} th dport {port_text(item.first_port, item.last_port)}",
        prefix="ct status dnat ",
    )
    if nodeports_closed:
        nodeports = port_text(*port_range(NODEPORT_RANGE))
        rules.append(
            f"meta l4proto {{ tcp, udp }} th dport {nodeports} drop comment {nft_comment(NODEPORTS_CLOSED_PURPOSE)}"
        )
    rules.append(f"ct status dnat drop comment {nft_comment(DNAT_INPUT_PURPOSE)}")
    lines = [f"\tchain {NFT_GUARD_INPUT_CHAIN} {{", "\t\ttype filter hook input priority filter - 5; policy accept;"]
    lines += [f"\t\t{rule}" for rule in rules]
    lines.append("\t}")
    return lines


# VXLAN has no authentication: what arrives on flannel.1 is whatever a packet to 8472/udp carried,
# and that port is held to the peers' outer source address, which a host on the segment can forge.
VXLAN_INTERFACES = ("flannel.1", "flannel-v6.1")
FABRIC_GUARD_CHAIN = "fabric_guard"
FABRIC_SOURCE_PURPOSE = "VXLAN inner source outside the cluster networks (forged)"
FABRIC_PATH_PURPOSE = "VXLAN inner source not routed back out of flannel.1 (forged)"


def fabric_guard_lines(cluster_networks: Sequence[str]) -> list[str]:
    """A prerouting chain that lets in on the VXLAN interfaces only what flannel carries: an inner
    source in the cluster's networks that this node would route back out of the same interface
    (strict reverse path: a peer's pod subnet; never this node's own). A forged packet whose inner
    source is the sender's own address, so that the node would answer it directly, or an address
    of this node's pods, is dropped before it reaches an input or forward chain (both accept the
    fabric). WireGuard's interfaces need none: each peer's key is bound to its allowed addresses.
    Nothing without cluster networks (a plan that does not name them)."""
    if not cluster_networks:
        return []
    interfaces = ", ".join(f'"{name}"' for name in VXLAN_INTERFACES)
    rules = [
        f"iifname {{ {interfaces} }} meta nfproto ipv4 ip saddr != {{ {', '.join(cluster_networks)} }} "
        f"drop comment {nft_comment(FABRIC_SOURCE_PURPOSE)}",
        f"iifname {{ {interfaces} }} fib saddr . iif oif missing drop comment {nft_comment(FABRIC_PATH_PURPOSE)}",
    ]
    lines = [f"\tchain {FABRIC_GUARD_CHAIN} {{", "\t\ttype filter hook prerouting priority raw; policy accept;"]
    lines += [f"\t\t{rule}" for rule in rules]
    lines.append("\t}")
    return lines


def guard_rule_count(lines: Sequence[str]) -> int:
    return sum(1 for line in lines if line.startswith("\t\t") and not line.startswith("\t\ttype "))


def render_dnat_guard(plan: NodeFirewallPlan) -> NftRuleset:
    """`table inet hk3s_dnat_guard`: the DNAT guard alone, for a node whose
    firewall is UFW or firewalld (neither filters DNAT'd traffic by port)."""
    plan.check()
    planned = planned_rules(plan)
    networks = {"cluster_networks": plan.cluster_networks, "node_addresses": plan.node_addresses}
    guard = [
        *dnat_guard_lines(planned, block_metadata=plan.block_metadata, **networks),
        *dnat_guard_input_lines(planned, nodeports_closed=not plan.nodeports_open, **networks),
        *fabric_guard_lines(plan.cluster_networks),
    ]
    lines = [
        f"# DNAT guard of {plan.node} ({plan.role}), written by hk3s beside its UFW or firewalld rules.",
        f"table inet {NFT_GUARD_TABLE} {{}}",
        f"delete table inet {NFT_GUARD_TABLE}",
        f"table inet {NFT_GUARD_TABLE} {{",
        *nft_set_lines(planned),
        *guard,
        "}",
    ]
    return NftRuleset("\n".join(lines) + "\n", guard_rule_count(guard))


def dnat_guard_rule_count(inspection: FirewallInspection) -> int | None:
    """Rules in the separate DNAT guard table (`inet hk3s_dnat_guard`); None when it is not loaded."""
    ruleset = inspection.nft_ruleset
    if not nft_table_loaded(ruleset, "inet", NFT_GUARD_TABLE):
        return None
    return sum(
        1
        for rule in nft_objects(ruleset, "rule")
        if rule.get("family") == "inet" and rule.get("table") == NFT_GUARD_TABLE
    )


async def apply_dnat_guard(session: SshSession, plan: NodeFirewallPlan) -> bool:
    """Load the DNAT guard table beside UFW or firewalld; False when it was in place already."""
    await remote.prepare_dir(session, remote.REMOTE_DIR)
    await session.upload(
        render_dnat_guard(plan).text.encode(), REMOTE_GUARD_FILE, deadline=remote.UPLOAD_DEADLINE_SECONDS, mode=0o600
    )
    result = await session.run_script(
        script_path("firewall_nftables.sh"), ["apply-guard", REMOTE_GUARD_FILE], deadline=remote.APPLY_DEADLINE_SECONDS
    )
    return "result unchanged yes" not in result.lines


async def remove_dnat_guard(session: SshSession) -> None:
    await session.run_script(
        script_path("firewall_nftables.sh"), ["remove-guard"], deadline=remote.REMOVE_DEADLINE_SECONDS
    )


def dnat_guard_present(inspection: FirewallInspection) -> bool:
    """The separate guard table is loaded or kept for boot."""
    return dnat_guard_rule_count(inspection) is not None or inspection.nft_guard_persisted


def dnat_guard_drift(inspection: FirewallInspection, plan: NodeFirewallPlan) -> list[str]:
    """How the separate guard table beside UFW or firewalld differs from the plan, one line each."""
    guard_count = dnat_guard_rule_count(inspection)
    wanted_count = render_dnat_guard(plan).rule_count
    if guard_count is None or not inspection.nft_guard_persisted:
        return [f"the DNAT guard (nftables table inet {NFT_GUARD_TABLE}) is not in place"]
    if guard_count != wanted_count:
        return [f"the DNAT guard's rules number {guard_count}, the plan's {wanted_count}"]
    return []
