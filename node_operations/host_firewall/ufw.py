"""The UFW backend: rules whose comment starts with `hk3s`; the program adds
and deletes only those. UFW has no transaction, so the window is kept small:
SSH first, new rules before old ones are deleted, `ufw --force enable` last.
The DNAT guard is an nftables table of its own beside UFW's rules.

For a firewall the operator runs, `allows` reads UFW's recorded rules in order
(first match wins) and its default incoming policy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from host_scripts import script_path
from node_operations.firewall_plan import ANY_IPV4, SSH_PORT, PortRule
from node_operations.host_firewall import remote
from node_operations.host_firewall.backend import Backend, Probe, UndeterminedError, ports_cover
from node_operations.host_firewall.dnat_guard import apply_dnat_guard, dnat_guard_drift
from node_operations.host_firewall.drift import ObservedFirewall, merge_rules
from node_operations.host_firewall.inspection import UFW_TAG, FirewallBackend, FirewallInspection, UfwTuple
from node_operations.host_firewall.plan import (
    FABRIC_INTERFACES_EXACT,
    FABRIC_PURPOSE,
    FirewallError,
    IPNetwork,
    NodeFirewallPlan,
    planned_rules,
)
from remote_access.ssh import SshSession

REMOTE_UFW_CHANGES = f"{remote.REMOTE_DIR}/ufw-changes.tsv"
# UFW with IPV6=no loads no IPv6 rules (ufw(8), /etc/default/ufw): the plan would hold for IPv4
# alone while every port stays open over IPv6 (link-local from the same segment at least).
UFW_IPV6_REFUSAL = (
    "UFW filters no IPv6 on this host (IPV6=no in /etc/default/ufw) while IPv6 is on in its kernel, so every "
    "port is open over IPv6: set IPV6=yes there and run `ufw reload` (or turn IPv6 off: sysctl "
    "net.ipv6.conf.all.disable_ipv6=1), then run again; nothing was changed"
)


UfwKind = Literal["port", "in", "route_in"]


@dataclass(frozen=True)
class UfwRule:
    """One UFW rule of the program's (comment `hk3s: <purpose>`)."""

    kind: UfwKind
    protocol: str = "any"  # tcp, udp or any
    port: str = "-"  # UFW's spelling: "22", "30000:32767"
    source: str = "any"  # "any" or a network
    interface: str = "-"
    comment: str = UFW_TAG

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What UFW tells rules apart by: the comment is not part of it."""
        return (self.kind, self.protocol, self.port, self.source, self.interface)

    def change_line(self, operation: Literal["add", "delete"]) -> str:
        """A line of firewall_ufw.sh's change file."""
        fields = (operation, self.kind, self.protocol, self.port, self.source, self.interface, self.comment)
        if any("\t" in value or "\n" in value for value in fields):
            raise ValueError(f"UFW rule field with a tab or newline: {fields!r}")
        return "\t".join(fields)

    @property
    def opens_ssh_like(self) -> bool:
        return self.kind == "port" and self.source == "any" and self.protocol == "tcp"


def _ufw_comment(purpose: str) -> str:
    return f"{UFW_TAG}: {purpose}"


def _ufw_source(network: IPNetwork) -> str:
    # UFW writes a single address without its prefix length; so do we, to compare.
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return str(network)


@dataclass(frozen=True)
class UfwChanges:
    """What to add and delete, in the order to do it."""

    add: tuple[UfwRule, ...]
    delete: tuple[UfwRule, ...]

    @property
    def empty(self) -> bool:
        return not self.add and not self.delete

    def file_text(self) -> str:
        lines = [rule.change_line("add") for rule in self.add] + [rule.change_line("delete") for rule in self.delete]
        return "".join(line + "\n" for line in lines)


def ufw_changes(existing: Sequence[UfwRule], wanted: Sequence[UfwRule]) -> UfwChanges:
    """Adds and deletes that turn the program's existing UFW rules into the wanted
    ones. Rules open to every source go first (SSH before anything can close),
    additions before deletions (a peer moving address is never shut out)."""
    have = {rule.key: rule for rule in existing}
    want = {rule.key: rule for rule in wanted}
    add = [rule for key, rule in want.items() if key not in have or have[key].comment != rule.comment]
    add.sort(key=lambda rule: 0 if rule.opens_ssh_like else 1)
    delete = [rule for key, rule in have.items() if key not in want]
    return UfwChanges(tuple(add), tuple(delete))


def ufw_rule_of(entry: UfwTuple) -> UfwRule | None:
    """The program's rule a recorded UFW rule is, if it is of a shape the program writes."""
    any_source = entry.src in ("0.0.0.0/0", "::/0")
    if entry.action == "allow" and entry.direction == "in" and entry.interface is None and entry.dport != "any":
        source = "any" if any_source else _ufw_source(ipaddress.ip_network(entry.src, strict=False))
        return UfwRule("port", entry.protocol, entry.dport, source, "-", entry.comment)
    if entry.dport == "any" and any_source and entry.interface and entry.direction == "in":
        if entry.action == "allow":
            return UfwRule("in", interface=entry.interface, comment=entry.comment)
        if entry.action == "route:allow":
            return UfwRule("route_in", interface=entry.interface, comment=entry.comment)
    return None


def existing_ufw_rules(inspection: FirewallInspection) -> list[UfwRule]:
    """The program's UFW rules, v4 and v6 copies folded into one."""
    rules: dict[tuple[str, str, str, str, str], UfwRule] = {}
    for entry in inspection.ufw_tuples:
        if not entry.tagged:
            continue
        rule = ufw_rule_of(entry)
        if rule is not None:
            rules.setdefault(rule.key, rule)
    return list(rules.values())


def _ufw_policy_denies(inspection: FirewallInspection) -> bool:
    return inspection.ufw_default_input in ("DROP", "REJECT")


async def _upload_changes(session: SshSession, changes: UfwChanges) -> None:
    await remote.prepare_dir(session, remote.REMOTE_DIR)
    await session.upload(changes.file_text().encode(), REMOTE_UFW_CHANGES, deadline=remote.UPLOAD_DEADLINE_SECONDS)


class UfwBackend(Backend):
    """The program's tagged UFW rules (module docstring)."""

    name: FirewallBackend = "ufw"

    def render(self, plan: NodeFirewallPlan) -> list[UfwRule]:
        """The node's UFW rules: one per port and source, plus the fabric interfaces."""
        plan.check()
        rules: list[UfwRule] = []
        for item in planned_rules(plan):
            port = str(item.first_port) if item.first_port == item.last_port else f"{item.first_port}:{item.last_port}"
            comment = _ufw_comment(item.rule.purpose)
            if item.every_source:
                rules.append(UfwRule("port", item.rule.protocol, port, "any", "-", comment))
                continue
            for source_set in item.sets:
                for network in source_set.networks:
                    rules.append(UfwRule("port", item.rule.protocol, port, _ufw_source(network), "-", comment))
        for interface in FABRIC_INTERFACES_EXACT:
            rules.append(UfwRule("in", interface=interface, comment=_ufw_comment(FABRIC_PURPOSE)))
            rules.append(UfwRule("route_in", interface=interface, comment=_ufw_comment(FABRIC_PURPOSE)))
        return rules

    def observe(self, inspection: FirewallInspection) -> ObservedFirewall:
        """The program's (tagged) UFW rules."""
        tagged = [entry for entry in inspection.ufw_tuples if entry.tagged]
        rules: list[PortRule] = []
        for entry in tagged:
            rule = ufw_rule_of(entry)
            if rule is None or rule.kind != "port":
                continue
            source = ANY_IPV4 if rule.source == "any" else rule.source
            purpose = entry.comment.partition(":")[2].strip() or entry.comment
            rules.append(PortRule(rule.port.replace(":", "-"), rule.protocol, (source,), purpose))  # type: ignore[arg-type]
        return ObservedFirewall(inspection.node, "ufw", bool(tagged), merge_rules(rules), len(tagged))

    def structural_drift(self, inspection: FirewallInspection, plan: NodeFirewallPlan) -> list[str]:
        """UFW's state and the program's non-port rules (the fabric interfaces)
        against the plan. No rule count: UFW's IPv6 copies depend on its own IPV6
        setting, so its rules are compared one by one instead."""
        notes = dnat_guard_drift(inspection, plan)
        if inspection.ufw_ipv6_unfiltered:
            notes.append("UFW filters no IPv6 (IPV6=no in /etc/default/ufw) while IPv6 is on")
        if not inspection.ufw_active:
            notes.append("UFW is not active")
        if not _ufw_policy_denies(inspection):
            notes.append(f"UFW's default incoming policy is {inspection.ufw_default_input}, not deny")
        wanted = {rule.key for rule in self.render(plan) if rule.kind != "port"}
        have = set()
        for entry in inspection.ufw_tuples:
            rule = ufw_rule_of(entry) if entry.tagged else None
            if entry.tagged and (rule is None or (rule.kind != "port" and rule.key not in wanted)):
                notes.append(
                    f"UFW rule not of the plan: {entry.action} {entry.protocol} {entry.dport} from {entry.src}"
                )
            if rule is not None and rule.kind != "port":
                have.add(rule.key)
        notes += [f"UFW rule missing: {kind} on {interface}" for kind, _, _, _, interface in sorted(wanted - have)]
        return notes

    async def apply(self, session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
        """Add and delete the program's rules, enable UFW, then load the DNAT guard
        beside them; False when nothing was to change."""
        if inspection.ufw_ipv6_unfiltered:
            raise FirewallError(inspection.node, UFW_IPV6_REFUSAL)
        changes = ufw_changes(existing_ufw_rules(inspection), self.render(plan))
        changed = not (changes.empty and inspection.ufw_active and _ufw_policy_denies(inspection))
        if changed:
            ssh_port = inspection.ssh_port or int(SSH_PORT)
            await _upload_changes(session, changes)
            await session.run_script(
                script_path("firewall_ufw.sh"),
                ["apply", REMOTE_UFW_CHANGES, str(ssh_port)],
                deadline=remote.APPLY_DEADLINE_SECONDS,
            )
        return await apply_dnat_guard(session, plan) or changed

    async def remove(self, session: SshSession, inspection: FirewallInspection) -> None:
        deletes = existing_ufw_rules(inspection)
        if inspection.ufw_active and not inspection.ufw_enabled_by_hk3s:
            # UFW ran before the program did and keeps running: its SSH rule stays,
            # or removing the program's rules could lock everyone out.
            deletes = [rule for rule in deletes if not rule.opens_ssh_like]
        await _upload_changes(session, UfwChanges((), tuple(deletes)))
        await session.run_script(
            script_path("firewall_ufw.sh"), ["remove", REMOTE_UFW_CHANGES], deadline=remote.REMOVE_DEADLINE_SECONDS
        )

    def foreign_allows(self, inspection: FirewallInspection) -> list[str]:
        """UFW's allow (and limit) rules without the program's comment, as `ufw status` would
        name them: rules that predate the program, or that someone added beside it."""
        found: list[str] = []
        for entry in inspection.ufw_tuples:
            if entry.tagged or entry.action.removeprefix("route:") not in ("allow", "limit"):
                continue
            where = f" on {entry.interface}" if entry.interface else ""
            family = " (v6)" if entry.family == 6 else ""
            found.append(f"{entry.action} {entry.protocol} {entry.dport} from {entry.src}{where}{family}")
        return found

    def filtering(self, inspection: FirewallInspection) -> bool:
        return inspection.ufw_active

    def allows(self, inspection: FirewallInspection, probe: Probe) -> bool:
        if inspection.ufw_default_input == "ACCEPT":
            default_allows = True
        elif inspection.ufw_default_input in ("DROP", "REJECT"):
            default_allows = False
        else:
            raise UndeterminedError(f"UFW's default incoming policy is {inspection.ufw_default_input!r}")
        arrival = inspection.arrival_interface(probe.source)
        local = inspection.local_addresses()
        for entry in inspection.ufw_tuples:
            if entry.family != probe.source.version or entry.action.startswith("route:") or entry.direction != "in":
                continue
            if entry.protocol not in ("any", probe.protocol) or entry.sport != "any":
                continue
            if entry.interface is not None and entry.interface != arrival:
                continue
            if entry.dst not in ("0.0.0.0/0", "::/0") and entry.dst not in local:
                try:
                    if not any(ipaddress.ip_address(address) in ipaddress.ip_network(entry.dst) for address in local):
                        continue
                except ValueError:
                    continue
            ports = ports_cover(entry.dport, probe.first, probe.last)
            source = ipaddress.ip_network(entry.src, strict=False)
            contains = probe.source.subnet_of(source)  # type: ignore[arg-type]
            overlaps = probe.source.overlaps(source)
            if entry.action in ("allow", "limit"):
                if ports is True and contains:
                    return True
                continue
            if overlaps and ports is not False:
                return False  # deny or reject shadows (part of) the probe
        return default_allows


UFW = UfwBackend()
