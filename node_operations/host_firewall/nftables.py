"""The nftables backend: a table of the program's own, `table inet hk3s_node`.

Input policy drop; established connections first; loopback, the cluster fabric
interfaces and the ICMP that path-MTU discovery needs accepted; then the plan's
ports. Peers are named sets, one per distinct source list, so the rule count
does not grow with the peers. The file deletes and redefines the table in one
`nft -f` transaction: atomic, idempotent, safe over SSH. (`flush table` alone
is not enough: it keeps set elements, so a removed peer would stay allowed.) A
oneshot unit reloads the kept copy at boot. The DNAT guard is a chain of the
same table.

For a firewall the operator runs, `allows` walks every input hook's chains
(jumps and gotos included) for the probe's first packet.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from typing import Any

from host_scripts import script_path
from node_operations.firewall_plan import ANY_IPV4, ICMP_RULE, PortRule
from node_operations.host_firewall import remote
from node_operations.host_firewall.backend import Backend, Probe, UndeterminedError, ranges_cover
from node_operations.host_firewall.dnat_guard import (
    dnat_guard_lines,
    dnat_guard_present,
    fabric_guard_lines,
    guard_rule_count,
    remove_dnat_guard,
)
from node_operations.host_firewall.drift import ObservedFirewall, align_rules, merge_rules, rule_count_drift
from node_operations.host_firewall.inspection import FirewallBackend, FirewallInspection
from node_operations.host_firewall.nft import (
    NftRuleset,
    nft_accept_rules,
    nft_comment,
    nft_fabric,
    nft_objects,
    nft_ports,
    nft_set_lines,
    nft_sets,
    nft_table_loaded,
    nft_value_networks,
)
from node_operations.host_firewall.plan import (
    FABRIC_INTERFACE_PATTERNS,
    FABRIC_INTERFACES,
    FABRIC_PURPOSE,
    IPNetwork,
    NodeFirewallPlan,
    planned_rules,
    port_text,
)
from remote_access.ssh import SshSession

NFT_TABLE = "hk3s_node"
REMOTE_NFT_FILE = f"{remote.REMOTE_DIR}/host-firewall.nft"

# From the plan both firewall layers share (node_operations.firewall_plan.ICMP_RULE).
_ICMP_TYPES = ", ".join(ICMP_RULE.ipv4_types)
_ICMPV6_TYPES = ", ".join(ICMP_RULE.ipv6_types)


def _nft_port_rule(rule: dict[str, Any], sets: Mapping[str, list[IPNetwork]]) -> PortRule | None:
    """An input rule of the shape the program writes: [saddr match] dport match accept."""
    protocol: str | None = None
    ports: list[tuple[int, int]] = []
    sources: list[IPNetwork] | None = None
    accept = False
    for expression in rule.get("expr", []):
        if "accept" in expression:
            accept = True
            continue
        match = expression.get("match")
        if match is None:
            continue  # counter, log: no part of what the rule lets in
        if match.get("op") not in ("==", "in"):
            return None
        left = match.get("left", {})
        payload = left.get("payload") if isinstance(left, dict) else None
        if not payload:
            return None
        try:
            if payload.get("field") == "dport" and payload.get("protocol") in ("tcp", "udp"):
                protocol = payload["protocol"]
                ports = nft_ports(match["right"])
            elif payload.get("field") == "saddr" and payload.get("protocol") in ("ip", "ip6"):
                right = match["right"]
                if isinstance(right, str) and right.startswith("@"):
                    sources = list(sets.get(right[1:], []))
                else:
                    sources = nft_value_networks(right)
            else:
                return None
        except (ValueError, KeyError, TypeError):
            return None
    if not accept or protocol is None or len(ports) != 1:
        return None
    spelt = [str(network) for network in sources] if sources is not None else [ANY_IPV4]
    return PortRule(
        port_text(*ports[0]),
        protocol,  # type: ignore[arg-type]
        tuple(spelt),
        str(rule.get("comment", "found on the host")),
    )


# --------------------------------------------------------------------------- a firewall the operator runs


def _nft_input_chains(ruleset: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        chain
        for chain in nft_objects(ruleset, "chain")
        if chain.get("hook") == "input" and chain.get("family") in ("inet", "ip", "ip6")
    ]


def _nft_blocks(ruleset: Sequence[dict[str, Any]]) -> bool:
    """An input hook with a drop policy, or a drop/reject rule right in one."""
    for chain in _nft_input_chains(ruleset):
        if chain.get("policy") == "drop":
            return True
        for rule in nft_objects(ruleset, "rule"):
            if (rule.get("family"), rule.get("table"), rule.get("chain")) == (
                chain.get("family"),
                chain.get("table"),
                chain.get("name"),
            ) and any("drop" in expression or "reject" in expression for expression in rule.get("expr", [])):
                return True
    return False


def _nft_chain_rules(ruleset: Sequence[dict[str, Any]], family: str, table: str, chain: str) -> list[dict[str, Any]]:
    return [
        rule
        for rule in nft_objects(ruleset, "rule")
        if (rule.get("family"), rule.get("table"), rule.get("chain")) == (family, table, chain)
    ]


def _nft_compare(op: str, matched: bool) -> bool:
    return not matched if op == "!=" else matched


def _nft_address_matches(
    right: Any, probe_net: IPNetwork, sets: Mapping[str, list[IPNetwork]], where: str
) -> bool | None:
    if isinstance(right, str) and right.startswith("@"):
        if right[1:] not in sets:
            raise UndeterminedError(f"{where} uses set {right} which is not an address set")
        networks = sets[right[1:]]
    else:
        try:
            networks = nft_value_networks(right)
        except (ValueError, KeyError, TypeError):
            raise UndeterminedError(f"{where} compares an address with {right!r}") from None
    same_family = [network for network in networks if network.version == probe_net.version]
    if any(probe_net.subnet_of(network) for network in same_family):  # type: ignore[arg-type]
        return True
    if any(probe_net.overlaps(network) for network in same_family):
        return None
    return False


def _nft_match(
    match: dict[str, Any],
    probe: Probe,
    inspection: FirewallInspection,
    sets: Mapping[str, list[IPNetwork]],
    where: str,
) -> bool | None:
    """Whether a match expression holds for the probe's first packet; None when
    it depends on something the probe does not fix (a partial overlap)."""
    op = match.get("op", "==")
    left = match.get("left")
    right = match.get("right")
    if op not in ("==", "!=", "in"):
        raise UndeterminedError(f"{where} uses the comparison {op!r}")
    if isinstance(left, dict) and "payload" in left:
        return _nft_payload_match(op, left["payload"], right, probe, inspection=inspection, sets=sets, where=where)
    if isinstance(left, dict) and "meta" in left:
        return _nft_meta_match(op, left["meta"].get("key"), right, probe, inspection=inspection, where=where)
    if isinstance(left, dict) and "ct" in left:
        key = left["ct"].get("key")
        if key == "state":
            values = right if isinstance(right, list) else [right]
            return _nft_compare(op, "new" in values)
        raise UndeterminedError(f"{where} matches ct {key}")
    if isinstance(left, dict) and "fib" in left:
        return None
    raise UndeterminedError(f"{where} has a match the checker does not read ({json.dumps(left)[:80]})")


def _nft_payload_match(
    op: str,
    payload: dict[str, Any],
    right: Any,
    probe: Probe,
    *,
    inspection: FirewallInspection,
    sets: Mapping[str, list[IPNetwork]],
    where: str,
) -> bool | None:
    """`_nft_match` for a packet header field (addresses, protocol, ports)."""
    protocol, field_name = payload.get("protocol"), payload.get("field")
    if protocol in ("ip", "ip6"):
        if (protocol == "ip") != (probe.source.version == 4):
            return False  # the packet is of the other family: a payload match fails
        if field_name == "saddr":
            result = _nft_address_matches(right, probe.source, sets, where)
            return None if result is None else _nft_compare(op, result)
        if field_name == "daddr":
            local = [ipaddress.ip_network(address) for address in inspection.local_addresses()]
            results = [
                _nft_address_matches(right, net, sets, where) for net in local if net.version == probe.source.version
            ]
            if results and all(result is True for result in results):
                return _nft_compare(op, True)
            if results and all(result is False for result in results):
                return _nft_compare(op, False)
            return None
        if field_name in ("protocol", "nexthdr"):
            return _nft_compare(op, _nft_value_has(right, probe.protocol))
        raise UndeterminedError(f"{where} matches {protocol} {field_name}")
    if protocol in ("tcp", "udp", "th"):
        if protocol not in ("th", probe.protocol):
            return False  # a tcp header match fails on a udp packet, whatever the op
        if field_name == "dport":
            try:
                ranges = nft_ports(right)
            except (ValueError, KeyError, TypeError):
                raise UndeterminedError(f"{where} compares a port with {right!r}") from None
            covered = ranges_cover(ranges, probe.first, probe.last)
            return None if covered is None else _nft_compare(op, covered)
        if field_name == "sport":
            return None
        raise UndeterminedError(f"{where} matches {protocol} {field_name}")
    raise UndeterminedError(f"{where} matches the {protocol} header")


def _nft_meta_match(
    op: str, key: Any, right: Any, probe: Probe, *, inspection: FirewallInspection, where: str
) -> bool | None:
    """`_nft_match` for packet metadata (protocols, the arrival interface, the packet type)."""
    if key in ("l4proto", "protocol"):
        if key == "protocol":
            value = "ip" if probe.source.version == 4 else "ip6"
            return _nft_compare(op, _nft_value_has(right, value))
        return _nft_compare(op, _nft_value_has(right, probe.protocol))
    if key == "nfproto":
        return _nft_compare(op, _nft_value_has(right, "ipv4" if probe.source.version == 4 else "ipv6"))
    if key in ("iifname", "iif"):
        arrival = inspection.arrival_interface(probe.source)
        if arrival is None:
            # Unknown, but a peer's packet never comes in on loopback or the pod fabric.
            names = right["set"] if isinstance(right, dict) and "set" in right else [right]
            inner = ("lo", *FABRIC_INTERFACES, *FABRIC_INTERFACE_PATTERNS)
            if all(isinstance(name, str) and name in inner for name in names):
                return _nft_compare(op, False)
            return None
        return _nft_compare(op, _nft_interface_has(right, arrival))
    if key == "pkttype":
        return _nft_compare(op, _nft_value_has(right, "host"))
    raise UndeterminedError(f"{where} matches meta {key}")


def _nft_value_has(right: Any, value: str) -> bool:
    if isinstance(right, dict) and "set" in right:
        return value in right["set"]
    if isinstance(right, list):
        return value in right
    return bool(right == value)


def _nft_interface_has(right: Any, interface: str) -> bool:
    names = right["set"] if isinstance(right, dict) and "set" in right else [right]
    for name in names:
        if not isinstance(name, str):
            continue
        if name == interface or (name.endswith("*") and interface.startswith(name[:-1])):
            return True
    return False


_NFT_NEUTRAL = ("counter", "log", "limit", "meta", "mangle", "ct", "notrack", "set", "quota")


def _nft_run_chain(
    inspection: FirewallInspection, probe: Probe, family: str, table: str, chain: str, *, depth: int = 0
) -> str:
    """'accept', 'drop', 'return' (fell off or returned) for the probe in a chain."""
    ruleset = inspection.nft_ruleset
    if depth > 16:
        raise UndeterminedError(f"chain {table}/{chain} jumps too deep")
    sets = nft_sets(ruleset, family, table)
    for rule in _nft_chain_rules(ruleset, family, table, chain):
        where = f"{family} {table} {chain} rule {rule.get('handle')}"
        outcome: bool | None = True
        verdict: tuple[str, str | None] | None = None
        for expression in rule.get("expr", []):
            if "match" in expression:
                result = _nft_match(expression["match"], probe, inspection, sets, where)
                if result is False:
                    outcome = False
                    break
                if result is None:
                    outcome = None
            elif any(key in expression for key in ("accept", "drop", "reject", "return", "continue")):
                verdict = (next(iter(expression)), None)
            elif "jump" in expression or "goto" in expression:
                kind = "jump" if "jump" in expression else "goto"
                verdict = (kind, expression[kind]["target"])
            elif "xt" in expression:
                if expression["xt"].get("name") == "comment":
                    continue
                raise UndeterminedError(f"{where} uses the iptables extension {expression['xt'].get('name')!r}")
            elif any(key in expression for key in _NFT_NEUTRAL):
                continue
            else:
                raise UndeterminedError(f"{where} has the statement {next(iter(expression))!r}")
        if outcome is False or verdict is None:
            continue
        if outcome is None:
            raise UndeterminedError(f"{where} may or may not apply to traffic from {probe.source}")
        kind, target_chain = verdict
        if kind == "accept":
            return "accept"
        if kind in ("drop", "reject"):
            return "drop"
        if kind == "return":
            return "return"
        if kind in ("jump", "goto") and target_chain is not None:
            inner = _nft_run_chain(inspection, probe, family, table, target_chain, depth=depth + 1)
            if inner in ("accept", "drop") or kind == "goto":
                return inner
    return "return"


class NftablesBackend(Backend):
    """The program's own nftables table (module docstring)."""

    name: FirewallBackend = "nftables"

    def render(self, plan: NodeFirewallPlan) -> NftRuleset:
        """The node's `table inet hk3s_node`, as one file for `nft -f`."""
        plan.check()
        planned = planned_rules(plan)
        lines = [
            f"# Host firewall of {plan.node} ({plan.role}), written by hk3s: `pulumi up` rewrites it.",
            "# Loading it replaces the table in one transaction (safe to repeat, safe over SSH).",
            f"table inet {NFT_TABLE} {{}}",
            f"delete table inet {NFT_TABLE}",
            f"table inet {NFT_TABLE} {{",
            *nft_set_lines(planned),
        ]
        input_rules = [
            "ct state established,related accept",
            "ct state invalid drop",
            'iif "lo" accept',
            # Traffic on the fabric has proved itself to WireGuard/VXLAN; dropping it
            # breaks kubectl logs/exec without a trace.
            f"iifname {{ {nft_fabric()} }} accept comment {nft_comment(FABRIC_PURPOSE)}",
            # Path-MTU discovery rides on ICMP: pod traffic is encapsulated twice.
            f"icmp type {{ {_ICMP_TYPES} }} accept",
            f"icmpv6 type {{ {_ICMPV6_TYPES} }} accept",
        ]
        input_rules += nft_accept_rules(
            planned, lambda item: f"{item.rule.protocol} dport {port_text(item.first_port, item.last_port)}"
        )
        lines += ["\tchain input {", "\t\ttype filter hook input priority filter; policy drop;"]
        lines += [f"\t\t{rule}" for rule in input_rules]
        lines.append("\t}")
        # The input chain above holds DNAT'd traffic to the node itself by port and source
        # already: only the forward chain of the guard is needed here.
        guard = [
            *dnat_guard_lines(
                planned,
                block_metadata=plan.block_metadata,
                cluster_networks=plan.cluster_networks,
                node_addresses=plan.node_addresses,
            ),
            *fabric_guard_lines(plan.cluster_networks),
        ]
        lines += guard
        lines.append("}")
        return NftRuleset("\n".join(lines) + "\n", len(input_rules) + guard_rule_count(guard))

    def observe(self, inspection: FirewallInspection) -> ObservedFirewall:
        """The program's table as the ruleset shows it."""
        ruleset = inspection.nft_ruleset
        present = nft_table_loaded(ruleset, "inet", NFT_TABLE)
        sets = nft_sets(ruleset, "inet", NFT_TABLE)
        rules: list[PortRule] = []
        count = 0
        for rule in nft_objects(ruleset, "rule"):
            if rule.get("family") != "inet" or rule.get("table") != NFT_TABLE:
                continue
            count += 1
            if rule.get("chain") != "input":
                continue
            parsed = _nft_port_rule(rule, sets)
            if parsed is not None:
                rules.append(parsed)
        return ObservedFirewall(inspection.node, "nftables", present, merge_rules(rules), count)

    def structural_drift(self, inspection: FirewallInspection, plan: NodeFirewallPlan) -> list[str]:
        return rule_count_drift(self.observe(inspection), self.render(plan).rule_count)

    async def apply(self, session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
        """Load the program's table unless the one in force (and kept for boot) is
        the plan's; take away the separate DNAT guard table, now a chain of it."""
        ruleset = self.render(plan)
        observed = self.observe(inspection)
        changed = not (
            observed.present
            and inspection.nft_persisted
            and not self.structural_drift(inspection, plan)
            and align_rules(observed.rules, plan.rules) == list(plan.rules)
        )
        if changed:
            await remote.prepare_dir(session, remote.REMOTE_DIR)
            await session.upload(
                ruleset.text.encode(), REMOTE_NFT_FILE, deadline=remote.UPLOAD_DEADLINE_SECONDS, mode=0o600
            )
            await session.run_script(
                script_path("firewall_nftables.sh"), ["apply", REMOTE_NFT_FILE], deadline=remote.APPLY_DEADLINE_SECONDS
            )
        if dnat_guard_present(inspection):
            await remove_dnat_guard(session)
            changed = True
        return changed

    async def remove(self, session: SshSession, inspection: FirewallInspection) -> None:
        await session.run_script(
            script_path("firewall_nftables.sh"), ["remove"], deadline=remote.REMOVE_DEADLINE_SECONDS
        )

    def filtering(self, inspection: FirewallInspection) -> bool:
        return _nft_blocks(inspection.nft_ruleset)

    def allows(self, inspection: FirewallInspection, probe: Probe) -> bool:
        """Every input hook must let the packet through: a drop in any is final."""
        ruleset = inspection.nft_ruleset
        for chain in _nft_input_chains(ruleset):
            family = chain["family"]
            if family not in ("inet", "ip" if probe.source.version == 4 else "ip6"):
                continue
            outcome = _nft_run_chain(inspection, probe, family, chain["table"], chain["name"])
            if outcome == "drop" or (outcome == "return" and chain.get("policy") == "drop"):
                return False
        return True


NFTABLES = NftablesBackend()
