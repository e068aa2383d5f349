"""The DNAT guard: a forward chain that holds traffic Kubernetes DNATs to the plan, and keeps
pods away from the cloud's metadata service.

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
"""

from __future__ import annotations

from collections.abc import Sequence

from host_scripts import script_path
from node_operations.firewall_plan import METADATA_ADDRESS
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
from node_operations.host_firewall.plan import NodeFirewallPlan, PlannedRule, planned_rules, port_text
from remote_access.ssh import SshSession

# Beside UFW or firewalld: the DNAT guard alone, in a table of its own.
NFT_GUARD_TABLE = "hk3s_dnat_guard"
NFT_GUARD_CHAIN = "dnat_guard"
DNAT_GUARD_PURPOSE = "DNAT to a port the plan keeps closed (NodePort, hostPort, LoadBalancer)"
METADATA_PURPOSE = "pods to the cloud metadata service (it serves the host keys)"
REMOTE_GUARD_FILE = f"{remote.REMOTE_DIR}/dnat-guard.nft"


def dnat_guard_lines(planned: Sequence[PlannedRule], *, block_metadata: bool = False) -> list[str]:
    """The chain that holds DNAT'd traffic to the plan.

    kube-proxy (NodePorts, LoadBalancer addresses) and the hostPorts ServiceLB
    publishes DNAT in prerouting, so their packets are forwarded to a pod and
    never reach an input chain, UFW's or firewalld's included (firewalld even
    accepts every DNAT'd flow in its forward chain, flannel every flow to the
    pod network). Here a DNAT'd connection from outside the cluster fabric
    passes only when the port it was sent to (`ct original proto-dst`) is one
    the plan opens to its source; traffic that was not DNAT'd is left alone.
    With `block_metadata`, first of all: nothing is forwarded to the metadata service (a
    reject, so a pod's client fails at once instead of waiting out its timeout)."""
    rules = [f"ip daddr {METADATA_ADDRESS} reject comment {nft_comment(METADATA_PURPOSE)}"] if block_metadata else []
    rules += [
        "ct state established,related accept",
        # Pods reaching a Service's ClusterIP are DNAT'd too, on the fabric.
        f"iifname {{ {nft_fabric()} }} accept",
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


def guard_rule_count(lines: Sequence[str]) -> int:
    return sum(1 for line in lines if line.startswith("\t\t") and not line.startswith("\t\ttype "))


def render_dnat_guard(plan: NodeFirewallPlan) -> NftRuleset:
    """`table inet hk3s_dnat_guard`: the DNAT guard alone, for a node whose
    firewall is UFW or firewalld (neither filters DNAT'd traffic by port)."""
    plan.check()
    planned = planned_rules(plan)
    guard = dnat_guard_lines(planned, block_metadata=plan.block_metadata)
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
