"""The firewalld backend: two zones of the program's own written as permanent
config (`hk3s`, made the default zone: the ports, and rich rules over ipsets of
peers; `hk3s-fabric`, target ACCEPT: the cluster's interfaces), checked, then
one `--reload`, which is firewalld's one atomic step. The DNAT guard is an
nftables table of its own beside firewalld's.

For a firewall the operator runs, `allows` finds the zone a probe's source
lands in (by source, else by arrival interface, else the default zone) and
reads its rich rules, ports and services, and the policies to the host.
"""

from __future__ import annotations

import ipaddress
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass

from host_scripts import script_path
from node_operations.firewall_plan import ANY_IPV4, PortRule
from node_operations.host_firewall import remote
from node_operations.host_firewall.backend import Backend, Probe, UndeterminedError, ports_cover
from node_operations.host_firewall.dnat_guard import apply_dnat_guard, dnat_guard_drift
from node_operations.host_firewall.drift import ObservedFirewall, align_rules, merge_rules, rule_count_drift
from node_operations.host_firewall.inspection import (
    FirewallBackend,
    FirewalldState,
    FirewalldZone,
    FirewallInspection,
)
from node_operations.host_firewall.plan import (
    FABRIC_INTERFACES_EXACT,
    NodeFirewallPlan,
    planned_rules,
    port_text,
    source_sets,
)
from remote_access.ssh import SshSession

FIREWALLD_ZONE = "hk3s"
FIREWALLD_FABRIC_ZONE = "hk3s-fabric"
REMOTE_FIREWALLD_STAGING = f"{remote.REMOTE_DIR}/firewalld-staging"


def _xml_text(element: ET.Element) -> str:
    ET.indent(element, space="  ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(element, encoding="unicode") + "\n"


_RICH_RULE = re.compile(
    r'^rule family="(?P<family>ipv[46])" source (?P<kind>ipset|address)="(?P<source>[^"]+)" '
    r'port port="(?P<port>[0-9-]+)" protocol="(?P<protocol>tcp|udp)" accept$'
)


def _unmanaged_interfaces(inspection: FirewallInspection) -> list[str]:
    """Interfaces with an address that firewalld binds to a zone not the program's:
    the program's rules would not apply to traffic arriving on them."""
    state = inspection.firewalld
    if state is None:
        return []
    ours = {FIREWALLD_ZONE, FIREWALLD_FABRIC_ZONE}
    addressed = {entry.interface for entry in inspection.addresses}
    return sorted(
        f"{interface} (zone {zone.name})"
        for zone in state.zones.values()
        if zone.name not in ours
        for interface in zone.interfaces
        if interface in addressed
    )


# --------------------------------------------------------------------------- a firewall the operator runs


@dataclass(frozen=True)
class _RichRule:
    """The parts of a firewalld rich rule that decide whether it lets a probe in."""

    family: str | None
    source: tuple[str, str] | None  # ("address"|"ipset", value)
    source_not: bool
    service: str | None
    port: tuple[str, str] | None  # (port, protocol)
    protocol: str | None  # `protocol value="udp"`: the whole protocol
    action: str | None  # accept, drop, reject; None: a rule that only logs or marks
    other_element: bool  # icmp-block, forward-port, masquerade: no part of a tcp/udp probe


def _parse_rich_rule(text: str) -> _RichRule:
    """Read a rich rule; raise UndeterminedError for the parts the checker does not read."""
    bare = re.sub(r'"[^"]*"', '""', text)  # keywords outside quoted values only
    for unread in ("priority=", "destination", "mac=", "source-port", "tcp-mss-clamp"):
        if unread in bare:
            raise UndeterminedError(f"the rich rule {text!r} uses {unread.rstrip('=')!r}")
    family = re.search(r'family="(ipv4|ipv6)"', text)
    source = re.search(r'source (NOT )?(address|ipset)="([^"]+)"', text)
    service = re.search(r'service name="([^"]+)"', text)
    port = re.search(r'port port="([0-9:-]+)" protocol="(tcp|udp)"', text)
    protocol = re.search(r'protocol value="([^"]+)"', text)
    actions = re.findall(r"\b(accept|drop|reject)\b", bare)
    return _RichRule(
        family=family.group(1) if family else None,
        source=(source.group(2), source.group(3)) if source else None,
        source_not=bool(source and source.group(1)),
        service=service.group(1) if service else None,
        port=(port.group(1), port.group(2)) if port else None,
        protocol=protocol.group(1) if protocol else None,
        action=actions[-1] if actions else None,
        other_element=any(word in bare for word in ("icmp-block", "icmp-type", "forward-port", "masquerade")),
    )


def _firewalld_source_in(state: FirewalldState, spec: tuple[str, str], probe: Probe) -> bool | None:
    kind, value = spec
    entries = state.ipsets.get(value, ()) if kind == "ipset" else (value,)
    if kind == "ipset" and value not in state.ipsets:
        raise UndeterminedError(f"ipset {value} is not readable")
    contained = False
    overlapped = False
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise UndeterminedError(f"source {entry!r} is not an address") from None
        if network.version != probe.source.version:
            continue
        contained |= probe.source.subnet_of(network)  # type: ignore[arg-type]
        overlapped |= probe.source.overlaps(network)
    if contained:
        return True
    return None if overlapped else False


def _firewalld_zone_for(inspection: FirewallInspection, state: FirewalldState, probe: Probe) -> FirewalldZone:
    by_source: list[FirewalldZone] = []
    for zone in state.zones.values():
        for source in zone.sources:
            spec = ("ipset", source[len("ipset:") :]) if source.startswith("ipset:") else ("address", source)
            if _firewalld_source_in(state, spec, probe):
                by_source.append(zone)
                break
    if len(by_source) > 1:
        raise UndeterminedError(f"{probe.source} is bound to zones {', '.join(zone.name for zone in by_source)}")
    if by_source:
        return by_source[0]
    arrival = inspection.arrival_interface(probe.source)
    for zone in state.zones.values():
        if arrival is not None and arrival in zone.interfaces:
            return zone
    if state.default_zone not in state.zones:
        raise UndeterminedError(f"the default zone {state.default_zone!r} is not listed")
    return state.zones[state.default_zone]


def _firewalld_opens(ports: Iterable[str], protocols: Iterable[str], probe: Probe) -> bool:
    if probe.protocol in protocols:
        return True
    for entry in ports:
        port, _, protocol = entry.partition("/")
        if protocol == probe.protocol and ports_cover(port.replace("-", ":"), probe.first, probe.last) is True:
            return True
    return False


def _firewalld_allows(inspection: FirewallInspection, state: FirewalldState, probe: Probe) -> bool:
    for policy in state.policies.values():
        if "HOST" not in policy.egress_zones and "ANY" not in policy.egress_zones:
            continue
        if policy.target.upper() in ("DROP", "REJECT", "%%REJECT%%"):
            raise UndeterminedError(f"policy {policy.name} has target {policy.target}")
        for text in policy.rich_rules:
            if "drop" in text.split() or "reject" in text.split():
                raise UndeterminedError(f"policy {policy.name} drops or rejects some traffic")
    zone = _firewalld_zone_for(inspection, state, probe)
    if zone.target.upper() == "ACCEPT":
        return True
    family = f"ipv{probe.source.version}"
    verdicts: set[str] = set()
    for text in zone.rich_rules:
        rich = _parse_rich_rule(text)
        if rich.family not in (None, family) or rich.action is None or rich.other_element:
            continue
        if rich.source is not None:
            inside = _firewalld_source_in(state, rich.source, probe)
            if inside is None:  # the rule covers part of the source network
                if rich.action != "accept":
                    return False
                continue
            if inside == rich.source_not:
                continue
        if rich.service is not None:
            ports = state.service_ports.get(rich.service)
            if ports is None:
                raise UndeterminedError(f"service {rich.service} is not readable")
            matches = _firewalld_opens(ports, (), probe)
        elif rich.port is not None:
            port, protocol = rich.port
            matches = (
                protocol == probe.protocol and ports_cover(port.replace("-", ":"), probe.first, probe.last) is True
            )
        elif rich.protocol is not None:
            matches = rich.protocol == probe.protocol
        else:
            matches = True
        if matches:
            verdicts.add(rich.action)
    # firewalld puts deny rich rules before allow rich rules.
    if verdicts & {"drop", "reject"}:
        return False
    if "accept" in verdicts:
        return True
    service_ports: list[str] = []
    for service in zone.services:
        if service not in state.service_ports:
            raise UndeterminedError(f"service {service} is not readable")
        service_ports.extend(state.service_ports[service])
    return _firewalld_opens([*zone.ports, *service_ports], zone.protocols, probe)


class FirewalldBackend(Backend):
    """The program's firewalld zones and ipsets (module docstring)."""

    name: FirewallBackend = "firewalld"

    def render(self, plan: NodeFirewallPlan) -> dict[str, str]:
        """The node's firewalld permanent config: relative path -> file text."""
        plan.check()
        planned = planned_rules(plan)
        files: dict[str, str] = {}

        zone = ET.Element("zone")
        ET.SubElement(zone, "short").text = FIREWALLD_ZONE
        ET.SubElement(
            zone, "description"
        ).text = f"Host firewall of {plan.node} ({plan.role}), written by hk3s: `pulumi up` rewrites this file."
        for item in planned:
            port = port_text(item.first_port, item.last_port)
            zone.append(ET.Comment(f" {item.rule.purpose} "))
            if item.every_source:
                ET.SubElement(zone, "port", port=port, protocol=item.rule.protocol)
                continue
            for source_set in item.sets:
                rich = ET.SubElement(zone, "rule", family=f"ipv{source_set.family}")
                ET.SubElement(rich, "source", ipset=source_set.ipset_name)
                ET.SubElement(rich, "port", port=port, protocol=item.rule.protocol)
                ET.SubElement(rich, "accept")
        files[f"zones/{FIREWALLD_ZONE}.xml"] = _xml_text(zone)

        fabric = ET.Element("zone", target="ACCEPT")
        ET.SubElement(fabric, "short").text = FIREWALLD_FABRIC_ZONE
        ET.SubElement(fabric, "description").text = "The cluster's own interfaces (k3s/flannel), written by hk3s."
        for interface in FABRIC_INTERFACES_EXACT:
            ET.SubElement(fabric, "interface", name=interface)
        files[f"zones/{FIREWALLD_FABRIC_ZONE}.xml"] = _xml_text(fabric)

        for source_set in source_sets(planned):
            ipset = ET.Element("ipset", type="hash:net")
            ET.SubElement(ipset, "short").text = source_set.ipset_name
            ET.SubElement(ipset, "option", name="family", value="inet" if source_set.family == 4 else "inet6")
            for network in source_set.networks:
                ET.SubElement(ipset, "entry").text = str(network)
            files[f"ipsets/{source_set.ipset_name}.xml"] = _xml_text(ipset)
        return files

    def observe(self, inspection: FirewallInspection) -> ObservedFirewall:
        """The program's firewalld zone (runtime): its ports and rich rules."""
        state = inspection.firewalld
        zone = state.zones.get(FIREWALLD_ZONE) if state else None
        if state is None or zone is None:
            return ObservedFirewall(inspection.node, "firewalld", False, (), 0)
        rules: list[PortRule] = []
        for entry in zone.ports:
            port, _, protocol = entry.partition("/")
            rules.append(PortRule(port, protocol, (ANY_IPV4,), ""))  # type: ignore[arg-type]
        for text in zone.rich_rules:
            match = _RICH_RULE.match(text)
            if match is None:
                continue  # not of the program's making: counted, and reported by structural_drift

            sources = state.ipsets.get(match["source"], ()) if match["kind"] == "ipset" else (match["source"],)
            rules.append(PortRule(match["port"], match["protocol"], tuple(sources), ""))  # type: ignore[arg-type]
        fabric = state.zones.get(FIREWALLD_FABRIC_ZONE)
        count = len(zone.ports) + len(zone.rich_rules) + (len(fabric.interfaces) if fabric else 0)
        merged: dict[tuple[str, str], list[str]] = {}
        for rule in rules:
            merged.setdefault((rule.port, rule.protocol), []).extend(rule.sources)
        folded = tuple(
            PortRule(port, protocol, tuple(sources), "")  # type: ignore[arg-type]
            for (port, protocol), sources in merged.items()
        )
        return ObservedFirewall(inspection.node, "firewalld", True, merge_rules(folded), count)

    def structural_drift(self, inspection: FirewallInspection, plan: NodeFirewallPlan) -> list[str]:
        """The zones' rule count, the DNAT guard and the default zone against the plan."""
        expected = sum(1 if item.every_source else len(item.sets) for item in planned_rules(plan))
        notes = rule_count_drift(self.observe(inspection), expected + len(FABRIC_INTERFACES_EXACT))
        notes += dnat_guard_drift(inspection, plan)
        state = inspection.firewalld
        if state is not None and state.default_zone != FIREWALLD_ZONE:
            notes.append(f"firewalld's default zone is {state.default_zone}, not {FIREWALLD_ZONE}")
        return notes

    async def apply(self, session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
        """Stage the zones and ipsets, let firewalld check them, reload when they or
        the runtime differ; then load the DNAT guard beside them."""
        files = self.render(plan)
        observed = self.observe(inspection)
        # Same files on disk but a runtime that drifted (a runtime-only firewall-cmd): reload anyway.
        in_force = (
            observed.present
            and not self.structural_drift(inspection, plan)
            and align_rules(observed.rules, plan.rules) == list(plan.rules)
        )
        await session.run(["rm", "-rf", REMOTE_FIREWALLD_STAGING], deadline=remote.UPLOAD_DEADLINE_SECONDS)
        for directory in ("zones", "ipsets"):
            await remote.prepare_dir(session, f"{REMOTE_FIREWALLD_STAGING}/{directory}")
        for relative, text in files.items():
            await session.upload(
                text.encode(), f"{REMOTE_FIREWALLD_STAGING}/{relative}", deadline=remote.UPLOAD_DEADLINE_SECONDS
            )
        result = await session.run_script(
            script_path("firewall_firewalld.sh"),
            ["apply", REMOTE_FIREWALLD_STAGING, "if-changed" if in_force else "reload"],
            deadline=remote.APPLY_DEADLINE_SECONDS,
        )
        changed = "result unchanged yes" not in result.lines
        return await apply_dnat_guard(session, plan) or changed

    async def remove(self, session: SshSession, inspection: FirewallInspection) -> None:
        await session.run_script(
            script_path("firewall_firewalld.sh"), ["remove"], deadline=remote.REMOVE_DEADLINE_SECONDS
        )

    def coverage_problem(self, inspection: FirewallInspection) -> str | None:
        foreign = _unmanaged_interfaces(inspection)
        if not foreign:
            return None
        return (
            f"firewalld binds {', '.join(foreign)} to a zone of its own, so the hk3s zone does not "
            "filter it; unbind it (firewall-cmd --permanent --zone=<zone> --remove-interface=<name>, "
            "or the NetworkManager connection's zone) or set this node's firewall to false"
        )

    def filtering(self, inspection: FirewallInspection) -> bool:
        return inspection.firewalld_running and inspection.firewalld is not None

    def allows(self, inspection: FirewallInspection, probe: Probe) -> bool:
        if inspection.firewalld is None:
            raise UndeterminedError("firewalld's state was not read")
        return _firewalld_allows(inspection, inspection.firewalld, probe)


FIREWALLD = FirewalldBackend()
