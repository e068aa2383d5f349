"""Host firewalls: put a node's port plan (node_operations.firewall_plan) into
the firewall the node has, read it back, take it away, and check a firewall
the operator runs.

Backends, picked per node from what is on it (`FirewallInspection.backend`):
UFW when it is active, else firewalld when it runs, else UFW or firewalld when
installed (UFW first: on Ubuntu it ships inactive), else nftables. Where none
of the three is installed the program installs the `nftables` package: it
manages the node, and a table of its own is the least intrusive firewall.

- nftables: a table of its own, `table inet hk3s_node`, shaped like seed 003's
  recipe (input policy drop; established first; loopback, cluster fabric
  interfaces and path-MTU ICMP accepted; then the plan's ports). Peers are
  named sets, one per distinct source list, so the rule count does not grow
  with the peers. The file deletes and redefines the table in one `nft -f`
  transaction: atomic, idempotent, safe over SSH. (`flush table` alone is not
  enough: it keeps set elements, so a removed peer would stay allowed.) A
  oneshot unit reloads the kept copy at boot.
- Every backend: DNAT'd traffic (kube-proxy's NodePorts and LoadBalancer
  addresses, the hostPorts ServiceLB publishes) is forwarded to a pod and
  never meets an input chain, so a forward chain (`dnat_guard`) lets a DNAT'd
  connection through only when the port it was sent to is open to its source
  in the plan. It is part of `hk3s_node` with nftables, and a table of its own
  (`inet hk3s_dnat_guard`, kept for boot by its own unit) beside UFW or
  firewalld.
- UFW: rules whose comment starts with `hk3s`; the program adds and deletes
  only those. UFW has no transaction, so the window is kept small: SSH first,
  new rules before old ones are deleted, `ufw --force enable` last.
- firewalld: two zones of its own written as permanent config (`hk3s`, made
  the default zone: the ports and rich rules over ipsets of peers;
  `hk3s-fabric`, target ACCEPT: the cluster's interfaces), checked, then one
  `--reload`, which is firewalld's one atomic step.

After every change the firewall is read back and compared with the plan.

For the join (a node whose firewall the operator runs)::

    async def check_operator_firewall(
        target: SshTarget,
        required: Sequence[PortRule],
        *,
        deadline: float = INSPECT_DEADLINE_SECONDS,
    ) -> OperatorFirewallReport

`required` is the node's `inbound_rules(...)`. SSH rules and NodePort rules
are not checked (the join reached SSH already; NodePorts are the operator's
call). The report's `stops_join` is true when an active firewall (UFW active,
firewalld running, or an nftables input hook with a drop policy or drop rules)
misses rules; `missing` lists them (all required rules when it cannot tell,
`determined` false and `reason` saying why); `message()` is the text to show.
`evaluate_operator_firewall(inspection, required)` does the same on an
inspection already read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import shlex
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from host_scripts import script_path
from node_operations.firewall_plan import ANY_IPV4, NODEPORT_RANGE, SSH_PORT, PortRule, Role
from remote_access.ssh import SshError, SshSession, SshTarget, open_session

FirewallBackend = Literal["ufw", "firewalld", "nftables"]
BACKENDS: tuple[FirewallBackend, ...] = ("nftables", "ufw", "firewalld")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Progress = Callable[[str], None]

NFT_TABLE = "hk3s_node"
# Beside UFW or firewalld: the DNAT guard alone, in a table of its own.
NFT_GUARD_TABLE = "hk3s_dnat_guard"
NFT_GUARD_CHAIN = "dnat_guard"
DNAT_GUARD_PURPOSE = "DNAT to a port the plan keeps closed (NodePort, hostPort, LoadBalancer)"
UFW_TAG = "hk3s"
FIREWALLD_ZONE = "hk3s"
FIREWALLD_FABRIC_ZONE = "hk3s-fabric"
FIREWALLD_IPSET_PREFIX = "hk3s-"
# k3s's flannel interfaces (vxlan, wireguard-native, the bridge), plus Cilium's
# and its per-pod veths, harmless where they do not exist (seed 003).
FABRIC_INTERFACES = ("cni0", "flannel.1", "flannel-v6.1", "flannel-wg", "flannel-wg-v6")
FABRIC_INTERFACE_PATTERNS = ("cilium_*", "lxc*")
# UFW and firewalld take no wildcards: the names k3s uses.
FABRIC_INTERFACES_EXACT = ("cni0", "flannel.1", "flannel-wg")
FABRIC_PURPOSE = "cluster fabric"
SESSION_SSH_PURPOSE = "SSH (the port hk3s logs in on)"
OPERATOR_CLOSED_PORT = 8888  # seed 000: keep 8888/tcp closed to outside traffic

REMOTE_DIR = "/run/hk3s"
REMOTE_NFT_FILE = f"{REMOTE_DIR}/host-firewall.nft"
REMOTE_GUARD_FILE = f"{REMOTE_DIR}/dnat-guard.nft"
REMOTE_UFW_CHANGES = f"{REMOTE_DIR}/ufw-changes.tsv"
REMOTE_FIREWALLD_STAGING = f"{REMOTE_DIR}/firewalld-staging"

INSPECT_DEADLINE_SECONDS = 60.0
UPLOAD_DEADLINE_SECONDS = 30.0
# UFW runs one command per rule (~0.3 s each), installing nftables may download.
APPLY_DEADLINE_SECONDS = 300.0
REMOVE_DEADLINE_SECONDS = 120.0

_ICMP_TYPES = "echo-request, echo-reply, destination-unreachable, time-exceeded, parameter-problem"
_ICMPV6_TYPES = (
    "echo-request, echo-reply, destination-unreachable, time-exceeded, parameter-problem, packet-too-big, "
    "nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert"
)


class FirewallError(SshError):
    """A host firewall operation failed on a named host; the message says what to do."""


# --------------------------------------------------------------------------- plan


def port_range(port: str) -> tuple[int, int]:
    """`"22"` -> (22, 22); `"30000-32767"` (or UFW's `"30000:32767"`) -> (30000, 32767)."""
    text = port.replace(":", "-")
    low, _, high = text.partition("-")
    first, last = int(low), int(high or low)
    if not 0 < first <= last < 65536:
        raise ValueError(f"{port!r} is not a port or port range")
    return first, last


def port_text(first: int, last: int) -> str:
    """The plan's spelling of a port range."""
    return str(first) if first == last else f"{first}-{last}"


def source_networks(sources: Iterable[str], *, merge: bool = False) -> tuple[IPNetwork, ...]:
    """Sources as networks, IPv4 first, sorted, without one inside another (an
    interval set refuses overlapping elements). `merge` also joins neighbours
    (10.0.0.2/32 + 10.0.0.3/32 = 10.0.0.2/31): one spelling per address set,
    for comparing; rendering keeps the addresses as the plan gives them."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for source in sources:
        network = ipaddress.ip_network(source.strip(), strict=False)
        if isinstance(network, ipaddress.IPv4Network):
            v4.append(network)
        else:
            v6.append(network)
    if merge:
        return (*ipaddress.collapse_addresses(v4), *ipaddress.collapse_addresses(v6))
    return (*_outermost(v4), *_outermost(v6))


def _outermost(networks: Sequence[Any]) -> list[Any]:
    """Sorted, duplicates and networks inside another dropped."""
    kept: list[Any] = []
    for network in sorted(set(networks), key=lambda net: (net.network_address, net.prefixlen)):
        if not kept or not network.subnet_of(kept[-1]):
            kept.append(network)
    return kept


def every_source(networks: Iterable[IPNetwork]) -> bool:
    """True when the sources are every address. The plan spells that 0.0.0.0/0;
    it opens the port to IPv6 too, so SSH over IPv6 is not locked out."""
    return any(network.prefixlen == 0 for network in networks)


def normalized_rule(rule: PortRule) -> tuple[str, str, tuple[str, ...]]:
    """What a rule enforces, spelt one way: (port, protocol, sources)."""
    networks = source_networks(rule.sources, merge=True)
    sources = (ANY_IPV4,) if every_source(networks) else tuple(str(network) for network in networks)
    return port_text(*port_range(rule.port)), rule.protocol, sources


@dataclass(frozen=True)
class NodeFirewallPlan:
    """The inbound rules one node's host firewall enforces."""

    node: str
    role: Role
    rules: tuple[PortRule, ...]
    nodeports_open: bool = False

    def problems(self) -> list[str]:
        """What makes this plan unsafe or unrenderable, one line each."""
        problems: list[str] = []
        nodeports = port_range(NODEPORT_RANGE)
        for index, rule in enumerate(self.rules):
            where = f"rules[{index}] ({rule.port}/{rule.protocol})"
            if rule.protocol not in ("tcp", "udp"):
                problems.append(f"{where}: protocol {rule.protocol!r} is not tcp or udp")
                continue
            try:
                first, last = port_range(rule.port)
            except ValueError as error:
                problems.append(f"{where}: {error}")
                continue
            try:
                networks = source_networks(rule.sources)
            except ValueError as error:
                problems.append(f"{where}: a source is not an IP network ({error})")
                continue
            if not networks:
                problems.append(f"{where}: no sources; drop the rule instead of opening it to nobody")
            if any(char in rule.purpose for char in '"\n\\'):
                problems.append(f"{where}: the purpose may not contain quotes, backslashes or newlines")
            if rule.protocol == "tcp" and first <= OPERATOR_CLOSED_PORT <= last:
                problems.append(f"{where}: 8888/tcp must stay closed to traffic from outside the node")
            is_nodeport = first <= nodeports[1] and last >= nodeports[0]
            if is_nodeport and not self.nodeports_open:
                problems.append(f"{where}: opens NodePorts while nodeports_open is false")
            if (
                self.role == "worker"
                and every_source(networks)
                and not _is_ssh_rule(rule)
                and not (is_nodeport and self.nodeports_open)
            ):
                problems.append(f"{where}: on a worker only SSH may be open to every source")
        return problems

    def check(self) -> None:
        """Raise a FirewallError naming every problem of the plan."""
        problems = self.problems()
        if problems:
            raise FirewallError(self.node, "the firewall plan is refused: " + "; ".join(problems))

    def with_session_port(self, port: int | None) -> NodeFirewallPlan:
        """The plan plus the port this program's SSH session came in on (see
        `with_session_rule`)."""
        return replace(self, rules=with_session_rule(self.rules, port))


def with_session_rule(rules: Sequence[PortRule], port: int | None) -> tuple[PortRule, ...]:
    """`rules` plus the port this program's SSH session came in on, open to
    every source, if no rule opens it yet: a firewall that locks out the
    program that manages it cannot be fixed by the next `pulumi up`."""
    if port is None:
        return tuple(rules)
    for rule in rules:
        first, last = port_range(rule.port)
        if rule.protocol == "tcp" and first <= port <= last and every_source(source_networks(rule.sources)):
            return tuple(rules)
    return (PortRule(str(port), "tcp", (ANY_IPV4,), SESSION_SSH_PURPOSE), *rules)


def _is_ssh_rule(rule: PortRule) -> bool:
    return rule.protocol == "tcp" and (rule.port == SSH_PORT or rule.purpose.startswith("SSH"))


def _is_nodeport_rule(rule: PortRule) -> bool:
    first, last = port_range(rule.port)
    low, high = port_range(NODEPORT_RANGE)
    return first <= high and last >= low


# --------------------------------------------------------------------------- peer sets


@dataclass(frozen=True)
class SourceSet:
    """A named set of source networks, shared by every rule with that source list."""

    index: int
    family: Literal[4, 6]
    networks: tuple[IPNetwork, ...]

    @property
    def nft_name(self) -> str:
        return f"peers_v{self.family}_{self.index}"

    @property
    def ipset_name(self) -> str:
        return f"{FIREWALLD_IPSET_PREFIX}peers-v{self.family}-{self.index}"


@dataclass(frozen=True)
class PlannedRule:
    """One plan rule, its sources resolved to named sets (none: every source)."""

    rule: PortRule
    first_port: int
    last_port: int
    sets: tuple[SourceSet, ...]
    every_source: bool


def planned_rules(plan: NodeFirewallPlan) -> list[PlannedRule]:
    """The plan's rules with one named set per distinct source list and family,
    numbered in order of first use."""
    known: dict[tuple[int, tuple[IPNetwork, ...]], SourceSet] = {}
    counters = {4: 0, 6: 0}
    planned: list[PlannedRule] = []
    for rule in plan.rules:
        first, last = port_range(rule.port)
        networks = source_networks(rule.sources)
        if every_source(networks):
            planned.append(PlannedRule(rule, first, last, (), True))
            continue
        sets: list[SourceSet] = []
        for family in (4, 6):
            members = tuple(network for network in networks if network.version == family)
            if not members:
                continue
            key = (family, members)
            if key not in known:
                counters[family] += 1
                known[key] = SourceSet(counters[family], 4 if family == 4 else 6, members)
            sets.append(known[key])
        planned.append(PlannedRule(rule, first, last, tuple(sets), False))
    return planned


def source_sets(planned: Sequence[PlannedRule]) -> list[SourceSet]:
    """The distinct sets the planned rules use, in order."""
    seen: dict[str, SourceSet] = {}
    for item in planned:
        for source_set in item.sets:
            seen.setdefault(source_set.nft_name, source_set)
    return list(seen.values())


# --------------------------------------------------------------------------- nftables


@dataclass(frozen=True)
class NftRuleset:
    """The rendered file and how many rules it puts in the table."""

    text: str
    rule_count: int


def _nft_port(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _nft_comment(text: str) -> str:
    # nft keeps at most 128 bytes of comment; quotes were refused by the plan check.
    return '"' + text.encode()[:120].decode(errors="ignore") + '"'


def _nft_fabric() -> str:
    return ", ".join(f'"{name}"' for name in (*FABRIC_INTERFACES, *FABRIC_INTERFACE_PATTERNS))


def _nft_set_lines(planned: Sequence[PlannedRule]) -> list[str]:
    lines: list[str] = []
    for source_set in source_sets(planned):
        elements = ", ".join(str(network) for network in source_set.networks)
        lines += [
            f"\tset {source_set.nft_name} {{",
            f"\t\ttype ipv{source_set.family}_addr",
            "\t\tflags interval",
            f"\t\telements = {{ {elements} }}",
            "\t}",
        ]
    return lines


def _nft_dnat_guard_lines(planned: Sequence[PlannedRule]) -> list[str]:
    """The chain that holds DNAT'd traffic to the plan.

    kube-proxy (NodePorts, LoadBalancer addresses) and the hostPorts ServiceLB
    publishes DNAT in prerouting, so their packets are forwarded to a pod and
    never reach an input chain, UFW's or firewalld's included (firewalld even
    accepts every DNAT'd flow in its forward chain, flannel every flow to the
    pod network). Here a DNAT'd connection from outside the cluster fabric
    passes only when the port it was sent to (`ct original proto-dst`) is one
    the plan opens to its source; traffic that was not DNAT'd is left alone."""
    rules = [
        "ct state established,related accept",
        # Pods reaching a Service's ClusterIP are DNAT'd too, on the fabric.
        f"iifname {{ {_nft_fabric()} }} accept",
    ]
    for item in planned:
        match = f"meta l4proto {item.rule.protocol} ct original proto-dst {_nft_port(item.first_port, item.last_port)}"
        comment = _nft_comment(item.rule.purpose)
        if item.every_source:
            rules.append(f"ct status dnat {match} accept comment {comment}")
            continue
        for source_set in item.sets:
            family = "ip" if source_set.family == 4 else "ip6"
            rules.append(f"ct status dnat {family} saddr @{source_set.nft_name} {match} accept comment {comment}")
    rules.append(f"ct status dnat drop comment {_nft_comment(DNAT_GUARD_PURPOSE)}")
    lines = [f"\tchain {NFT_GUARD_CHAIN} {{", "\t\ttype filter hook forward priority filter - 5; policy accept;"]
    lines += [f"\t\t{rule}" for rule in rules]
    lines.append("\t}")
    return lines


def _guard_rule_count(lines: Sequence[str]) -> int:
    return sum(1 for line in lines if line.startswith("\t\t") and not line.startswith("\t\ttype "))


def render_nftables(plan: NodeFirewallPlan) -> NftRuleset:
    """The node's `table inet hk3s_node`, as one file for `nft -f`."""
    plan.check()
    planned = planned_rules(plan)
    lines = [
        f"# Host firewall of {plan.node} ({plan.role}), written by hk3s: `pulumi up` rewrites it.",
        "# Loading it replaces the table in one transaction (safe to repeat, safe over SSH).",
        f"table inet {NFT_TABLE} {{}}",
        f"delete table inet {NFT_TABLE}",
        f"table inet {NFT_TABLE} {{",
        *_nft_set_lines(planned),
    ]
    input_rules = [
        "ct state established,related accept",
        "ct state invalid drop",
        'iif "lo" accept',
        # Traffic on the fabric has proved itself to WireGuard/VXLAN; dropping it
        # breaks kubectl logs/exec without a trace (seed 003).
        f"iifname {{ {_nft_fabric()} }} accept comment {_nft_comment(FABRIC_PURPOSE)}",
        # Path-MTU discovery rides on ICMP: pod traffic is encapsulated twice.
        f"icmp type {{ {_ICMP_TYPES} }} accept",
        f"icmpv6 type {{ {_ICMPV6_TYPES} }} accept",
    ]
    for item in planned:
        match = f"{item.rule.protocol} dport {_nft_port(item.first_port, item.last_port)}"
        comment = _nft_comment(item.rule.purpose)
        if item.every_source:
            input_rules.append(f"{match} accept comment {comment}")
            continue
        for source_set in item.sets:
            family = "ip" if source_set.family == 4 else "ip6"
            input_rules.append(f"{family} saddr @{source_set.nft_name} {match} accept comment {comment}")
    lines += ["\tchain input {", "\t\ttype filter hook input priority filter; policy drop;"]
    lines += [f"\t\t{rule}" for rule in input_rules]
    lines.append("\t}")
    guard = _nft_dnat_guard_lines(planned)
    lines += guard
    lines.append("}")
    return NftRuleset("\n".join(lines) + "\n", len(input_rules) + _guard_rule_count(guard))


def render_dnat_guard(plan: NodeFirewallPlan) -> NftRuleset:
    """`table inet hk3s_dnat_guard`: the DNAT guard alone, for a node whose
    firewall is UFW or firewalld (neither filters DNAT'd traffic by port)."""
    plan.check()
    planned = planned_rules(plan)
    guard = _nft_dnat_guard_lines(planned)
    lines = [
        f"# DNAT guard of {plan.node} ({plan.role}), written by hk3s beside its UFW or firewalld rules.",
        f"table inet {NFT_GUARD_TABLE} {{}}",
        f"delete table inet {NFT_GUARD_TABLE}",
        f"table inet {NFT_GUARD_TABLE} {{",
        *_nft_set_lines(planned),
        *guard,
        "}",
    ]
    return NftRuleset("\n".join(lines) + "\n", _guard_rule_count(guard))


# --------------------------------------------------------------------------- UFW

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


def render_ufw(plan: NodeFirewallPlan) -> list[UfwRule]:
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


# --------------------------------------------------------------------------- firewalld


def _xml_text(element: ET.Element) -> str:
    ET.indent(element, space="  ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(element, encoding="unicode") + "\n"


def render_firewalld(plan: NodeFirewallPlan) -> dict[str, str]:
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


# --------------------------------------------------------------------------- inspection


@dataclass(frozen=True)
class UfwTuple:
    """One UFW rule as /etc/ufw/user*.rules records it."""

    family: Literal[4, 6]
    action: str  # allow, deny, reject, limit; "route:" prefix for routed rules
    protocol: str
    dport: str
    dst: str
    sport: str
    src: str
    direction: str  # in or out
    interface: str | None
    comment: str

    @property
    def tagged(self) -> bool:
        return self.comment == UFW_TAG or self.comment.startswith(f"{UFW_TAG}:")

    def as_rule(self) -> UfwRule | None:
        """The program's rule this tuple records, if it is of a shape it writes."""
        any_source = self.src in ("0.0.0.0/0", "::/0")
        if self.action == "allow" and self.direction == "in" and self.interface is None and self.dport != "any":
            source = "any" if any_source else _ufw_source(ipaddress.ip_network(self.src, strict=False))
            return UfwRule("port", self.protocol, self.dport, source, "-", self.comment)
        if self.dport == "any" and any_source and self.interface and self.direction == "in":
            if self.action == "allow":
                return UfwRule("in", interface=self.interface, comment=self.comment)
            if self.action == "route:allow":
                return UfwRule("route_in", interface=self.interface, comment=self.comment)
        return None


def parse_ufw_tuple(family: Literal[4, 6], text: str) -> UfwTuple | None:
    """Parse `action proto dport dst sport src [dapp sapp] direction[_iface] [comment=hex]`."""
    words = text.split()
    comment = ""
    if words and words[-1].startswith("comment="):
        try:
            comment = bytes.fromhex(words.pop()[len("comment=") :]).decode(errors="replace")
        except ValueError:
            comment = ""
    if len(words) not in (7, 9):
        return None
    direction, _, interface = words[-1].partition("_")
    return UfwTuple(
        family=family,
        action=words[0],
        protocol=words[1],
        dport=words[2],
        dst=words[3],
        sport=words[4],
        src=words[5],
        direction=direction,
        interface=interface or None,
        comment=comment,
    )


@dataclass(frozen=True)
class FirewalldZone:
    """A firewalld zone as `firewall-cmd --list-all-zones` shows it (runtime)."""

    name: str
    target: str = "default"
    interfaces: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    ports: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ()
    rich_rules: tuple[str, ...] = ()
    ingress_zones: tuple[str, ...] = ()  # policies only
    egress_zones: tuple[str, ...] = ()  # policies only
    priority: str = ""  # policies only


@dataclass(frozen=True)
class FirewalldState:
    """firewalld's runtime state, as far as the firewall checks need it."""

    default_zone: str
    zones: dict[str, FirewalldZone]
    policies: dict[str, FirewalldZone]
    ipsets: dict[str, tuple[str, ...]]
    service_ports: dict[str, tuple[str, ...]]


def parse_firewalld_listing(lines: Sequence[str]) -> dict[str, FirewalldZone]:
    """Parse `firewall-cmd --list-all-zones` (or `--list-all-policies`) output."""
    zones: dict[str, FirewalldZone] = {}
    name: str | None = None
    values: dict[str, list[str]] = {}
    last_key = ""

    def flush() -> None:
        if name is None:
            return

        def words(key: str) -> tuple[str, ...]:
            return tuple(" ".join(values.get(key, [])).split())

        zones[name] = FirewalldZone(
            name=name,
            target=" ".join(values.get("target", ["default"])).strip() or "default",
            interfaces=words("interfaces"),
            sources=words("sources"),
            services=words("services"),
            ports=words("ports"),
            protocols=words("protocols"),
            rich_rules=tuple(rule.strip() for rule in values.get("rich rules", []) if rule.strip()),
            ingress_zones=words("ingress-zones"),
            egress_zones=words("egress-zones"),
            priority=" ".join(values.get("priority", [])).strip(),
        )

    for line in lines:
        if not line.strip():
            continue
        if not line[0].isspace():
            flush()
            name = line.split()[0]
            values = {}
            last_key = ""
            continue
        if line.startswith("\t") or line.startswith("        "):
            values.setdefault(last_key, []).append(line.strip())  # continuation (rich rules)
            continue
        key, _, value = line.strip().partition(":")
        last_key = key.strip()
        values.setdefault(last_key, [])
        if value.strip():
            values[last_key].append(value.strip())
    flush()
    return zones


def _parse_property_block(lines: Sequence[str]) -> dict[str, str]:
    properties: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.strip().partition(":")
        properties[key.strip()] = value.strip()
    return properties


@dataclass(frozen=True)
class InterfaceAddress:
    """An address on one of the host's interfaces."""

    interface: str
    network: IPNetwork  # the connected network (strict=False)
    address: ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class FirewallInspection:
    """What firewall_inspect.sh found on a host."""

    node: str
    ssh_port: int | None
    addresses: tuple[InterfaceAddress, ...]
    default_route_interface: str | None
    ufw_installed: bool
    ufw_active: bool
    ufw_default_input: str
    ufw_tuples: tuple[UfwTuple, ...]
    ufw_enabled_by_hk3s: bool
    firewalld_installed: bool
    firewalld_running: bool
    firewalld: FirewalldState | None
    nft_installed: bool
    nft_ruleset: tuple[dict[str, Any], ...]
    nft_persisted: bool
    nft_guard_persisted: bool = False

    def backend(self) -> FirewallBackend:
        """The firewall the program uses on this node (module docstring)."""
        if self.ufw_active:
            return "ufw"
        if self.firewalld_running:
            return "firewalld"
        if self.ufw_installed:
            return "ufw"
        if self.firewalld_installed:
            return "firewalld"
        return "nftables"

    def arrival_interface(self, source: IPNetwork) -> str | None:
        """The interface traffic from `source` arrives on: the one whose network
        holds it, else the default route's."""
        for entry in self.addresses:
            if entry.network.version == source.version and source.subnet_of(entry.network):  # type: ignore[arg-type]
                return entry.interface
        return self.default_route_interface

    def local_addresses(self) -> set[str]:
        return {str(entry.address) for entry in self.addresses}


def parse_inspection(node: str, output: str) -> FirewallInspection:
    """Parse firewall_inspect.sh's `fact` and `data` lines."""
    facts: dict[str, str] = {}
    addresses: list[InterfaceAddress] = []
    sections: dict[str, list[str]] = {}
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "fact":
            name, _, value = rest.partition(" ")
            if name == "address":
                interface, _, cidr = value.partition(" ")
                try:
                    interface_net = ipaddress.ip_interface(cidr)
                except ValueError:
                    continue
                addresses.append(InterfaceAddress(interface, interface_net.network, interface_net.ip))
            else:
                facts[name] = value
        elif kind == "data":
            section, _, value = rest.partition(" ")
            sections.setdefault(section, []).append(value)
    if facts.get("complete") != "yes":
        raise FirewallError(node, "firewall_inspect.sh stopped before it finished; run it by hand to see why")

    tuples: list[UfwTuple] = []
    for family, section in ((4, "ufw_v4"), (6, "ufw_v6")):
        for text in sections.get(section, []):
            parsed = parse_ufw_tuple(4 if family == 4 else 6, text)
            if parsed is not None:
                tuples.append(parsed)

    firewalld: FirewalldState | None = None
    if facts.get("firewalld_running") == "yes":
        ipsets: dict[str, tuple[str, ...]] = {}
        services: dict[str, tuple[str, ...]] = {}
        for section, lines in sections.items():
            if section.startswith("firewalld_ipset:"):
                ipsets[section.partition(":")[2]] = tuple(_parse_property_block(lines).get("entries", "").split())
            elif section.startswith("firewalld_service:"):
                services[section.partition(":")[2]] = tuple(_parse_property_block(lines).get("ports", "").split())
        firewalld = FirewalldState(
            default_zone=facts.get("firewalld_default_zone", ""),
            zones=parse_firewalld_listing(sections.get("firewalld_zones", [])),
            policies=parse_firewalld_listing(sections.get("firewalld_policies", [])),
            ipsets=ipsets,
            service_ports=services,
        )

    ruleset: tuple[dict[str, Any], ...] = ()
    if sections.get("nft_json"):
        try:
            ruleset = tuple(json.loads("\n".join(sections["nft_json"])).get("nftables", []))
        except json.JSONDecodeError as error:
            raise FirewallError(node, f"`nft -j list ruleset` printed unreadable JSON ({error})") from None

    ssh_port_text = facts.get("ssh_port", "-")
    default_route = facts.get("default_route_interface", "-")
    return FirewallInspection(
        node=node,
        ssh_port=int(ssh_port_text) if ssh_port_text.isdigit() else None,
        addresses=tuple(addresses),
        default_route_interface=None if default_route == "-" else default_route,
        ufw_installed=facts.get("ufw") == "installed",
        ufw_active=facts.get("ufw_active") == "yes",
        ufw_default_input=facts.get("ufw_default_input", "unknown"),
        ufw_tuples=tuple(tuples),
        ufw_enabled_by_hk3s=facts.get("ufw_enabled_by_hk3s") == "yes",
        firewalld_installed=facts.get("firewalld") == "installed",
        firewalld_running=facts.get("firewalld_running") == "yes",
        firewalld=firewalld,
        nft_installed=facts.get("nft") == "installed",
        nft_ruleset=ruleset,
        nft_persisted=facts.get("nft_persisted") == "yes",
        nft_guard_persisted=facts.get("nft_guard_persisted") == "yes",
    )


# --------------------------------------------------------------------------- nft JSON helpers


def _nft_objects(ruleset: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item[kind] for item in ruleset if kind in item]


def _nft_element_networks(elements: Iterable[Any]) -> list[IPNetwork]:
    """Set elements ("10.0.0.2", {"prefix": ...}, {"range": [...]}, {"elem": {"val": ...}}) as networks."""
    networks: list[IPNetwork] = []
    for element in elements:
        value = element["elem"]["val"] if isinstance(element, dict) and "elem" in element else element
        networks.extend(_nft_value_networks(value))
    return networks


def _nft_value_networks(value: Any) -> list[IPNetwork]:
    if isinstance(value, str):
        return [ipaddress.ip_network(value, strict=False)]
    if isinstance(value, dict) and "prefix" in value:
        return [ipaddress.ip_network(f"{value['prefix']['addr']}/{value['prefix']['len']}", strict=False)]
    if isinstance(value, dict) and "range" in value:
        first, last = (ipaddress.ip_address(part) for part in value["range"])
        return list(ipaddress.summarize_address_range(first, last))
    if isinstance(value, dict) and "set" in value:
        return _nft_element_networks(value["set"])
    raise ValueError(f"unexpected address value {value!r}")


def _nft_ports(value: Any) -> list[tuple[int, int]]:
    if isinstance(value, int):
        return [(value, value)]
    if isinstance(value, dict) and "range" in value:
        return [(int(value["range"][0]), int(value["range"][1]))]
    if isinstance(value, dict) and "set" in value:
        ports: list[tuple[int, int]] = []
        for element in value["set"]:
            ports.extend(_nft_ports(element))
        return ports
    raise ValueError(f"unexpected port value {value!r}")


def _nft_sets(ruleset: Iterable[dict[str, Any]], family: str, table: str) -> dict[str, list[IPNetwork]]:
    sets: dict[str, list[IPNetwork]] = {}
    for item in _nft_objects(ruleset, "set"):
        if item.get("family") == family and item.get("table") == table:
            try:
                sets[item["name"]] = _nft_element_networks(item.get("elem", []))
            except (ValueError, KeyError, TypeError):
                sets[item["name"]] = []
    return sets


# --------------------------------------------------------------------------- observed state


@dataclass(frozen=True)
class ObservedFirewall:
    """The program's rules as found on a node."""

    node: str
    backend: FirewallBackend
    present: bool
    rules: tuple[PortRule, ...]
    rule_count: int
    # Differences that are not port rules (a hand-made rule in the table, UFW
    # switched off, ...); filled in by `read_node_firewall`.
    notes: tuple[str, ...] = ()


def _merge_rules(rules: Iterable[PortRule]) -> tuple[PortRule, ...]:
    """One rule per (port, protocol, purpose), sources joined, in first-seen order."""
    merged: dict[tuple[str, str, str], list[str]] = {}
    for rule in rules:
        merged.setdefault((rule.port, rule.protocol, rule.purpose), []).extend(rule.sources)
    result = []
    for (port, protocol, purpose), sources in merged.items():
        networks = source_networks(sources)
        spelt = (ANY_IPV4,) if every_source(networks) else tuple(str(network) for network in networks)
        result.append(PortRule(port, protocol, spelt, purpose))  # type: ignore[arg-type]
    return tuple(result)


def observe_nftables(inspection: FirewallInspection) -> ObservedFirewall:
    """The program's table as the ruleset shows it."""
    ruleset = inspection.nft_ruleset
    present = any(
        item.get("family") == "inet" and item.get("name") == NFT_TABLE for item in _nft_objects(ruleset, "table")
    )
    sets = _nft_sets(ruleset, "inet", NFT_TABLE)
    rules: list[PortRule] = []
    count = 0
    for rule in _nft_objects(ruleset, "rule"):
        if rule.get("family") != "inet" or rule.get("table") != NFT_TABLE:
            continue
        count += 1
        if rule.get("chain") != "input":
            continue
        parsed = _nft_port_rule(rule, sets)
        if parsed is not None:
            rules.append(parsed)
    return ObservedFirewall(inspection.node, "nftables", present, _merge_rules(rules), count)


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
                ports = _nft_ports(match["right"])
            elif payload.get("field") == "saddr" and payload.get("protocol") in ("ip", "ip6"):
                right = match["right"]
                if isinstance(right, str) and right.startswith("@"):
                    sources = list(sets.get(right[1:], []))
                else:
                    sources = _nft_value_networks(right)
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


def dnat_guard_rule_count(inspection: FirewallInspection) -> int | None:
    """Rules in the separate DNAT guard table (`inet hk3s_dnat_guard`); None when it is not loaded."""
    ruleset = inspection.nft_ruleset
    present = any(
        item.get("family") == "inet" and item.get("name") == NFT_GUARD_TABLE for item in _nft_objects(ruleset, "table")
    )
    if not present:
        return None
    return sum(
        1
        for rule in _nft_objects(ruleset, "rule")
        if rule.get("family") == "inet" and rule.get("table") == NFT_GUARD_TABLE
    )


def observe_ufw(inspection: FirewallInspection) -> ObservedFirewall:
    """The program's (tagged) UFW rules."""
    tagged = [entry for entry in inspection.ufw_tuples if entry.tagged]
    rules: list[PortRule] = []
    for entry in tagged:
        rule = entry.as_rule()
        if rule is None or rule.kind != "port":
            continue
        source = ANY_IPV4 if rule.source == "any" else rule.source
        purpose = entry.comment.partition(":")[2].strip() or entry.comment
        rules.append(PortRule(rule.port.replace(":", "-"), rule.protocol, (source,), purpose))  # type: ignore[arg-type]
    return ObservedFirewall(inspection.node, "ufw", bool(tagged), _merge_rules(rules), len(tagged))


def existing_ufw_rules(inspection: FirewallInspection) -> list[UfwRule]:
    """The program's UFW rules, v4 and v6 copies folded into one."""
    rules: dict[tuple[str, str, str, str, str], UfwRule] = {}
    for entry in inspection.ufw_tuples:
        if not entry.tagged:
            continue
        rule = entry.as_rule()
        if rule is not None:
            rules.setdefault(rule.key, rule)
    return list(rules.values())


_RICH_RULE = re.compile(
    r'^rule family="(?P<family>ipv[46])" source (?P<kind>ipset|address)="(?P<source>[^"]+)" '
    r'port port="(?P<port>[0-9-]+)" protocol="(?P<protocol>tcp|udp)" accept$'
)


def observe_firewalld(inspection: FirewallInspection) -> ObservedFirewall:
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
    return ObservedFirewall(inspection.node, "firewalld", True, _merge_rules(folded), count)


def observe(inspection: FirewallInspection, backend: FirewallBackend) -> ObservedFirewall:
    """The program's rules in `backend` on the inspected node."""
    if backend == "nftables":
        return observe_nftables(inspection)
    if backend == "ufw":
        return observe_ufw(inspection)
    return observe_firewalld(inspection)


def managed_backends(inspection: FirewallInspection) -> list[FirewallBackend]:
    """Backends that hold something of the program's on this node."""
    return [backend for backend in BACKENDS if observe(inspection, backend).present]


def align_rules(observed: Sequence[PortRule], wanted: Sequence[PortRule]) -> list[PortRule]:
    """Observed rules, each spelt as the wanted rule enforcing the same thing
    (purposes are labels, not enforcement), in the wanted order; rules the plan
    does not have follow. Equal to `wanted` exactly when nothing drifted."""
    remaining = list(observed)
    aligned: list[PortRule] = []
    for rule in wanted:
        key = normalized_rule(rule)
        for index, candidate in enumerate(remaining):
            if normalized_rule(candidate) == key:
                aligned.append(rule)
                del remaining[index]
                break
    for rule in remaining:
        port, protocol, sources = normalized_rule(rule)
        aligned.append(PortRule(port, protocol, sources, rule.purpose or "found on the host"))  # type: ignore[arg-type]
    return aligned


def expected_rule_count(plan: NodeFirewallPlan, backend: FirewallBackend) -> int | None:
    """How many rules the plan puts in the backend (None for UFW, whose IPv6
    copies depend on its own IPV6 setting: its rules are compared one by one)."""
    if backend == "nftables":
        return render_nftables(plan).rule_count
    if backend == "firewalld":
        planned = planned_rules(plan)
        return sum(1 if item.every_source else len(item.sets) for item in planned) + len(FABRIC_INTERFACES_EXACT)
    return None


def structural_drift(inspection: FirewallInspection, backend: FirewallBackend, plan: NodeFirewallPlan) -> list[str]:
    """What differs from the plan besides the port rules, one line each."""
    notes: list[str] = []
    observed = observe(inspection, backend)
    expected = expected_rule_count(plan, backend)
    if expected is not None and observed.present and observed.rule_count != expected:
        notes.append(f"the program's {backend} rules number {observed.rule_count}, the plan's {expected}")
    if backend in ("ufw", "firewalld"):
        guard_count = dnat_guard_rule_count(inspection)
        wanted_count = render_dnat_guard(plan).rule_count
        if guard_count is None or not inspection.nft_guard_persisted:
            notes.append(f"the DNAT guard (nftables table inet {NFT_GUARD_TABLE}) is not in place")
        elif guard_count != wanted_count:
            notes.append(f"the DNAT guard's rules number {guard_count}, the plan's {wanted_count}")
    state = inspection.firewalld
    if backend == "firewalld" and state is not None and state.default_zone != FIREWALLD_ZONE:
        notes.append(f"firewalld's default zone is {state.default_zone}, not {FIREWALLD_ZONE}")
    if backend == "ufw":
        if not inspection.ufw_active:
            notes.append("UFW is not active")
        if not _ufw_policy_denies(inspection):
            notes.append(f"UFW's default incoming policy is {inspection.ufw_default_input}, not deny")
        wanted = {rule.key for rule in render_ufw(plan) if rule.kind != "port"}
        have = set()
        for entry in inspection.ufw_tuples:
            rule = entry.as_rule() if entry.tagged else None
            if entry.tagged and (rule is None or (rule.kind != "port" and rule.key not in wanted)):
                notes.append(
                    f"UFW rule not of the plan: {entry.action} {entry.protocol} {entry.dport} from {entry.src}"
                )
            if rule is not None and rule.kind != "port":
                have.add(rule.key)
        notes += [f"UFW rule missing: {kind} on {interface}" for kind, _, _, _, interface in sorted(wanted - have)]
    return notes


def drift(observed: Sequence[PortRule], wanted: Sequence[PortRule]) -> tuple[list[PortRule], list[PortRule]]:
    """(missing, extra): wanted rules not enforced, enforced rules not wanted."""
    have = [normalized_rule(rule) for rule in observed]
    want = [normalized_rule(rule) for rule in wanted]
    missing = [rule for rule, key in zip(wanted, want, strict=True) if key not in have]
    extra = [rule for rule, key in zip(observed, have, strict=True) if key not in want]
    return missing, extra


def _describe_rules(rules: Iterable[PortRule]) -> str:
    return "; ".join(f"{rule.port}/{rule.protocol} from {', '.join(rule.sources)}" for rule in rules)


# --------------------------------------------------------------------------- remote steps


@dataclass(frozen=True)
class AppliedFirewall:
    """The outcome of applying one node's plan."""

    node: str
    backend: FirewallBackend
    rule_count: int
    changed: bool
    rules: tuple[PortRule, ...]
    host_key: str


@dataclass(frozen=True)
class RemovedFirewall:
    """What was taken off a node."""

    node: str
    backends: tuple[FirewallBackend, ...]


async def inspect_firewall(
    session: SshSession, *, operator: bool = False, deadline: float = INSPECT_DEADLINE_SECONDS
) -> FirewallInspection:
    """Run firewall_inspect.sh on an open session; `operator` also reads what
    checking an operator's firewalld needs (policies, services, every ipset)."""
    args = ["operator"] if operator else []
    result = await session.run_script(script_path("firewall_inspect.sh"), args, deadline=deadline)
    return parse_inspection(session.target.node, result.stdout)


async def _prepare_remote_dir(session: SshSession, path: str) -> None:
    await session.run(["mkdir", "-p", "-m", "0700", path], deadline=UPLOAD_DEADLINE_SECONDS)


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


async def _apply_nftables(session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
    ruleset = render_nftables(plan)
    observed = observe_nftables(inspection)
    if (
        observed.present
        and inspection.nft_persisted
        and not structural_drift(inspection, "nftables", plan)
        and align_rules(observed.rules, plan.rules) == list(plan.rules)
    ):
        return False
    await _prepare_remote_dir(session, REMOTE_DIR)
    await session.upload(ruleset.text.encode(), REMOTE_NFT_FILE, deadline=UPLOAD_DEADLINE_SECONDS, mode=0o600)
    await session.run_script(
        script_path("firewall_nftables.sh"), ["apply", REMOTE_NFT_FILE], deadline=APPLY_DEADLINE_SECONDS
    )
    return True


def _ufw_policy_denies(inspection: FirewallInspection) -> bool:
    return inspection.ufw_default_input in ("DROP", "REJECT")


async def _apply_ufw(session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
    changes = ufw_changes(existing_ufw_rules(inspection), render_ufw(plan))
    if changes.empty and inspection.ufw_active and _ufw_policy_denies(inspection):
        return False
    ssh_port = inspection.ssh_port or int(SSH_PORT)
    await _prepare_remote_dir(session, REMOTE_DIR)
    await session.upload(changes.file_text().encode(), REMOTE_UFW_CHANGES, deadline=UPLOAD_DEADLINE_SECONDS)
    await session.run_script(
        script_path("firewall_ufw.sh"),
        ["apply", REMOTE_UFW_CHANGES, str(ssh_port)],
        deadline=APPLY_DEADLINE_SECONDS,
    )
    return True


async def _apply_firewalld(session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
    files = render_firewalld(plan)
    observed = observe_firewalld(inspection)
    # Same files on disk but a runtime that drifted (a runtime-only firewall-cmd): reload anyway.
    in_force = (
        observed.present
        and not structural_drift(inspection, "firewalld", plan)
        and align_rules(observed.rules, plan.rules) == list(plan.rules)
    )
    await session.run(["rm", "-rf", REMOTE_FIREWALLD_STAGING], deadline=UPLOAD_DEADLINE_SECONDS)
    for directory in ("zones", "ipsets"):
        await _prepare_remote_dir(session, f"{REMOTE_FIREWALLD_STAGING}/{directory}")
    for relative, text in files.items():
        await session.upload(text.encode(), f"{REMOTE_FIREWALLD_STAGING}/{relative}", deadline=UPLOAD_DEADLINE_SECONDS)
    result = await session.run_script(
        script_path("firewall_firewalld.sh"),
        ["apply", REMOTE_FIREWALLD_STAGING, "if-changed" if in_force else "reload"],
        deadline=APPLY_DEADLINE_SECONDS,
    )
    return "result unchanged yes" not in result.lines


async def _apply_dnat_guard(session: SshSession, plan: NodeFirewallPlan) -> bool:
    """Load the DNAT guard table beside UFW or firewalld; False when it was in place already."""
    await _prepare_remote_dir(session, REMOTE_DIR)
    await session.upload(
        render_dnat_guard(plan).text.encode(), REMOTE_GUARD_FILE, deadline=UPLOAD_DEADLINE_SECONDS, mode=0o600
    )
    result = await session.run_script(
        script_path("firewall_nftables.sh"), ["apply-guard", REMOTE_GUARD_FILE], deadline=APPLY_DEADLINE_SECONDS
    )
    return "result unchanged yes" not in result.lines


async def _remove_dnat_guard(session: SshSession) -> None:
    await session.run_script(script_path("firewall_nftables.sh"), ["remove-guard"], deadline=REMOVE_DEADLINE_SECONDS)


async def _remove_backend(session: SshSession, inspection: FirewallInspection, backend: FirewallBackend) -> None:
    if backend == "nftables":
        await session.run_script(script_path("firewall_nftables.sh"), ["remove"], deadline=REMOVE_DEADLINE_SECONDS)
    elif backend == "firewalld":
        await session.run_script(script_path("firewall_firewalld.sh"), ["remove"], deadline=REMOVE_DEADLINE_SECONDS)
    else:
        deletes = existing_ufw_rules(inspection)
        if inspection.ufw_active and not inspection.ufw_enabled_by_hk3s:
            # UFW ran before the program did and keeps running: its SSH rule stays,
            # or removing the program's rules could lock everyone out.
            deletes = [rule for rule in deletes if not rule.opens_ssh_like]
        changes = UfwChanges((), tuple(deletes))
        await _prepare_remote_dir(session, REMOTE_DIR)
        await session.upload(changes.file_text().encode(), REMOTE_UFW_CHANGES, deadline=UPLOAD_DEADLINE_SECONDS)
        await session.run_script(
            script_path("firewall_ufw.sh"), ["remove", REMOTE_UFW_CHANGES], deadline=REMOVE_DEADLINE_SECONDS
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


async def apply_node_firewall(
    target: SshTarget,
    plan: NodeFirewallPlan,
    *,
    progress: Progress | None = None,
) -> AppliedFirewall:
    """Make the node's firewall enforce `plan`, in one atomic change where the
    backend has one; adopt what the program left there before; read it back.

    Raises FirewallError (or an SshError) naming the node on any failure.
    """
    plan.check()
    async with open_session(target) as session:
        inspection = await inspect_firewall(session)
        backend = inspection.backend()
        effective = plan.with_session_port(inspection.ssh_port)
        _say(progress, f"host firewall: {backend}, {len(plan.rules)} rules")
        if backend == "nftables":
            changed = await _apply_nftables(session, effective, inspection)
        elif backend == "ufw":
            changed = await _apply_ufw(session, effective, inspection)
        else:
            changed = await _apply_firewalld(session, effective, inspection)
        if backend == "nftables":
            if dnat_guard_rule_count(inspection) is not None or inspection.nft_guard_persisted:
                # The guard is a chain of hk3s_node now: the separate table goes.
                await _remove_dnat_guard(session)
                changed = True
        else:
            changed = await _apply_dnat_guard(session, effective) or changed
        # A node whose firewall changed kind: take the program's old rules away.
        for stale in managed_backends(inspection):
            if stale != backend:
                _say(progress, f"removing the program's earlier {stale} rules")
                await _remove_backend(session, inspection, stale)
                changed = True
        # Unchanged means the first reading already matched the plan.
        after = await inspect_firewall(session) if changed else inspection
        observed = observe(after, backend)
        missing, extra = drift(observed.rules, effective.rules)
        others = structural_drift(after, backend, effective)
        if missing or extra or others:
            raise FirewallError(
                target.node,
                f"after applying, the {backend} firewall differs from the plan "
                f"(missing: {_describe_rules(missing) or 'none'}; unexpected: {_describe_rules(extra) or 'none'}"
                f"{''.join('; ' + note for note in others)}); "
                "something else on the host changes the firewall: find it, then run `pulumi up` again",
            )
        if backend == "firewalld":
            foreign = _unmanaged_interfaces(after)
            if foreign:
                raise FirewallError(
                    target.node,
                    f"firewalld binds {', '.join(foreign)} to a zone of its own, so the hk3s zone does not "
                    "filter it; unbind it (firewall-cmd --permanent --zone=<zone> --remove-interface=<name>, "
                    "or the NetworkManager connection's zone) or set this node's firewall to false",
                )
        _say(progress, f"host firewall {'updated' if changed else 'unchanged'}: {observed.rule_count} rules")
        return AppliedFirewall(
            node=target.node,
            backend=backend,
            rule_count=observed.rule_count,
            changed=changed,
            rules=_reported_rules(observed, plan.rules, inspection.ssh_port),
            host_key=session.host_key,
        )


async def read_node_firewall(target: SshTarget, plan: NodeFirewallPlan | None = None) -> ObservedFirewall:
    """The program's rules on the node as they are now, spelt like the plan's
    where they enforce the same (so only real drift shows), with `notes` on
    what else differs from the plan. `present` is false when nothing of the
    program's is on the node."""
    async with open_session(target) as session:
        inspection = await inspect_firewall(session)
    held = managed_backends(inspection)
    backend = held[0] if held else inspection.backend()
    observed = observe(inspection, backend)
    if plan is None:
        return observed
    notes = structural_drift(inspection, backend, plan.with_session_port(inspection.ssh_port)) if held else []
    return replace(observed, rules=_reported_rules(observed, plan.rules, inspection.ssh_port), notes=tuple(notes))


def _reported_rules(
    observed: ObservedFirewall, wanted: Sequence[PortRule], ssh_port: int | None
) -> tuple[PortRule, ...]:
    # The session's SSH rule is the program's own addition, not drift: leave it out.
    aligned = align_rules(observed.rules, with_session_rule(wanted, ssh_port))
    return tuple(rule for rule in aligned if rule.purpose != SESSION_SSH_PURPOSE)


async def remove_node_firewall(target: SshTarget, *, progress: Progress | None = None) -> RemovedFirewall:
    """Take the program's table, rules or zones off the node, nothing else."""
    async with open_session(target) as session:
        inspection = await inspect_firewall(session)
        held = managed_backends(inspection)
        for backend in held:
            _say(progress, f"removing the program's {backend} rules")
            await _remove_backend(session, inspection, backend)
        if dnat_guard_rule_count(inspection) is not None or inspection.nft_guard_persisted:
            _say(progress, "removing the program's DNAT guard")
            await _remove_dnat_guard(session)
        after = await inspect_firewall(session)
        left: list[str] = [*managed_backends(after)]
        if dnat_guard_rule_count(after) is not None:
            left.append("DNAT guard")
        if left:
            raise FirewallError(
                target.node,
                f"the program's {', '.join(left)} rules are still there after removing them; "
                "see the host's journal, then run the command again",
            )
    return RemovedFirewall(target.node, tuple(held))


# --------------------------------------------------------------------------- many nodes


@dataclass(frozen=True)
class NodeFirewallJob:
    """One node to apply: how to reach it and its plan."""

    target: SshTarget
    plan: NodeFirewallPlan


@dataclass(frozen=True)
class FleetFirewallResult:
    """Per-node outcomes of a parallel apply: every node is tried."""

    applied: dict[str, AppliedFirewall] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def raise_for_failures(self) -> None:
        """One error naming every node that failed, with its reason."""
        if self.failed:
            details = " | ".join(f"{node}: {reason}" for node, reason in sorted(self.failed.items()))
            raise FirewallError(
                ",".join(sorted(self.failed)),
                f"{len(self.failed)} host firewall(s) not applied: {details}; fix them and run again "
                "(the others are in place)",
            )


async def apply_firewalls(
    jobs: Sequence[NodeFirewallJob],
    *,
    progress: Callable[[str, str], None] | None = None,
) -> FleetFirewallResult:
    """Apply every node's plan in parallel, one atomic change per node; a
    failure on one node does not stop the others and is reported with its node."""

    def node_progress(node: str) -> Progress | None:
        if progress is None:
            return None
        return lambda message: progress(node, message)

    outcomes = await asyncio.gather(
        *(apply_node_firewall(job.target, job.plan, progress=node_progress(job.target.node)) for job in jobs),
        return_exceptions=True,
    )
    result = FleetFirewallResult()
    for job, outcome in zip(jobs, outcomes, strict=True):
        if isinstance(outcome, AppliedFirewall):
            result.applied[job.target.node] = outcome
        elif isinstance(outcome, Exception):
            result.failed[job.target.node] = str(outcome)
        else:
            raise outcome
    return result


# --------------------------------------------------------------------------- operator-run firewalls

OperatorFirewallKind = Literal["none", "ufw", "firewalld", "nftables"]


@dataclass(frozen=True)
class OperatorFirewallReport:
    """A firewall the operator runs, checked against what the cluster needs."""

    node: str
    firewall: OperatorFirewallKind
    active: bool
    determined: bool
    missing: tuple[PortRule, ...]
    reason: str = ""

    @property
    def stops_join(self) -> bool:
        """The join must stop: an active firewall lacks (or may lack) rules."""
        return self.active and bool(self.missing)

    def message(self) -> str:
        """What to tell the operator, naming the node, the rules and the way out."""
        if not self.active:
            return f"{self.node}: no active host firewall found"
        if not self.missing:
            return f"{self.node}: the {self.firewall} firewall allows every port the cluster needs"
        listing = "; ".join(
            f"{rule.port}/{rule.protocol} from {', '.join(rule.sources)} ({rule.purpose})" for rule in self.missing
        )
        head = f"{self.node}: the host firewall ({self.firewall}) is not managed by hk3s and " + (
            f"does not allow: {listing}."
            if self.determined
            else f"could not be checked ({self.reason}); make sure it allows: {listing}."
        )
        commands = self.suggested_commands()
        hint = f" For example: {' ; '.join(commands)}." if commands else ""
        return (
            f"{head}{hint} Then run again, or let hk3s run this node's firewall (hk3s:workers[].firewall or "
            "hk3s:firewall.managed true). Keep 8888/tcp closed to outside traffic and NodePorts limited."
        )

    def suggested_commands(self) -> list[str]:
        """Commands that add the missing rules, for UFW and firewalld."""
        commands: list[str] = []
        for rule in self.missing:
            for source in rule.sources:
                if self.firewall == "ufw":
                    port = rule.port.replace("-", ":")
                    commands.append(
                        shlex.join(["ufw", "allow", "proto", rule.protocol, "from", source, "to", "any", "port", port])
                    )
                elif self.firewall == "firewalld":
                    family = "ipv6" if ":" in source else "ipv4"
                    rich = (
                        f'rule family="{family}" source address="{source}" '
                        f'port port="{rule.port}" protocol="{rule.protocol}" accept'
                    )
                    commands.append(shlex.join(["firewall-cmd", "--permanent", f"--add-rich-rule={rich}"]))
        if self.firewall == "firewalld" and commands:
            commands.append("firewall-cmd --reload")
        return commands


@dataclass(frozen=True)
class _Probe:
    """A new connection the cluster needs: from a source network to a port."""

    source: IPNetwork
    protocol: str
    first: int
    last: int


class _UndeterminedError(Exception):
    """The checker cannot tell how the firewall treats a probe."""


def _operator_probes(required: Sequence[PortRule]) -> list[tuple[PortRule, list[_Probe]]]:
    probes: list[tuple[PortRule, list[_Probe]]] = []
    for rule in required:
        if _is_ssh_rule(rule) or _is_nodeport_rule(rule):
            continue
        first, last = port_range(rule.port)
        networks = source_networks(rule.sources)
        probes.append((rule, [_Probe(network, rule.protocol, first, last) for network in networks]))
    return probes


def _nft_input_chains(ruleset: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        chain
        for chain in _nft_objects(ruleset, "chain")
        if chain.get("hook") == "input" and chain.get("family") in ("inet", "ip", "ip6")
    ]


def _nft_blocks(ruleset: Sequence[dict[str, Any]]) -> bool:
    """An input hook with a drop policy, or a drop/reject rule right in one."""
    for chain in _nft_input_chains(ruleset):
        if chain.get("policy") == "drop":
            return True
        for rule in _nft_objects(ruleset, "rule"):
            if (rule.get("family"), rule.get("table"), rule.get("chain")) == (
                chain.get("family"),
                chain.get("table"),
                chain.get("name"),
            ) and any("drop" in expression or "reject" in expression for expression in rule.get("expr", [])):
                return True
    return False


def _operator_firewall_kind(inspection: FirewallInspection) -> OperatorFirewallKind:
    """The active firewall the operator runs: UFW active, firewalld running,
    or nftables input hooks that drop."""
    if inspection.ufw_active:
        return "ufw"
    if inspection.firewalld_running and inspection.firewalld is not None:
        return "firewalld"
    if _nft_blocks(inspection.nft_ruleset):
        return "nftables"
    return "none"


def evaluate_operator_firewall(inspection: FirewallInspection, required: Sequence[PortRule]) -> OperatorFirewallReport:
    """Check an operator-run firewall against `required` (see the module docstring)."""
    node = inspection.node
    probes = _operator_probes(required)
    kind = _operator_firewall_kind(inspection)
    if kind == "none":
        return OperatorFirewallReport(node, "none", False, True, ())

    def checker(probe: _Probe) -> bool:
        if kind == "ufw":
            return _ufw_allows(inspection, probe)
        if kind == "firewalld" and inspection.firewalld is not None:
            return _firewalld_allows(inspection, inspection.firewalld, probe)
        return _nft_allows(inspection, probe)

    missing: list[PortRule] = []
    try:
        for rule, rule_probes in probes:
            blocked = [probe for probe in rule_probes if not checker(probe)]
            if blocked:
                missing.append(PortRule(rule.port, rule.protocol, tuple(str(p.source) for p in blocked), rule.purpose))
    except _UndeterminedError as why:
        return OperatorFirewallReport(
            node, kind, True, False, tuple(rule for rule, _ in probes), f"cannot tell from the {kind} rules: {why}"
        )
    return OperatorFirewallReport(node, kind, True, True, tuple(missing))


async def check_operator_firewall(
    target: SshTarget,
    required: Sequence[PortRule],
    *,
    deadline: float = INSPECT_DEADLINE_SECONDS,
) -> OperatorFirewallReport:
    """Read the node's firewall (changing nothing) and check it against the
    rules the cluster needs from it. For nodes whose firewall the operator
    runs (hk3s:firewall.managed / workers[].firewall false)."""
    async with open_session(target) as session:
        inspection = await inspect_firewall(session, operator=True, deadline=deadline)
    return evaluate_operator_firewall(inspection, required)


# ---- UFW


def _ports_cover(spec: str, first: int, last: int) -> bool | None:
    """Whether a UFW/firewalld port spec ("any", "22", "80,443", "1000:2000")
    covers first..last fully (True), not at all (False), or in part (None)."""
    if spec == "any":
        return True
    covered = 0
    for part in spec.split(","):
        low, high = port_range(part)
        overlap = max(0, min(high, last) - max(low, first) + 1)
        covered += overlap
    if covered >= last - first + 1:
        return True
    return False if covered == 0 else None


def _ufw_allows(inspection: FirewallInspection, probe: _Probe) -> bool:
    if inspection.ufw_default_input == "ACCEPT":
        default_allows = True
    elif inspection.ufw_default_input in ("DROP", "REJECT"):
        default_allows = False
    else:
        raise _UndeterminedError(f"UFW's default incoming policy is {inspection.ufw_default_input!r}")
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
        ports = _ports_cover(entry.dport, probe.first, probe.last)
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


# ---- firewalld


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
    """Read a rich rule; raise _UndeterminedError for the parts the checker does not read."""
    bare = re.sub(r'"[^"]*"', '""', text)  # keywords outside quoted values only
    for unread in ("priority=", "destination", "mac=", "source-port", "tcp-mss-clamp"):
        if unread in bare:
            raise _UndeterminedError(f"the rich rule {text!r} uses {unread.rstrip('=')!r}")
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


def _firewalld_source_in(state: FirewalldState, spec: tuple[str, str], probe: _Probe) -> bool | None:
    kind, value = spec
    entries = state.ipsets.get(value, ()) if kind == "ipset" else (value,)
    if kind == "ipset" and value not in state.ipsets:
        raise _UndeterminedError(f"ipset {value} is not readable")
    contained = False
    overlapped = False
    for entry in entries:
        try:
            network = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise _UndeterminedError(f"source {entry!r} is not an address") from None
        if network.version != probe.source.version:
            continue
        contained |= probe.source.subnet_of(network)  # type: ignore[arg-type]
        overlapped |= probe.source.overlaps(network)
    if contained:
        return True
    return None if overlapped else False


def _firewalld_zone_for(inspection: FirewallInspection, state: FirewalldState, probe: _Probe) -> FirewalldZone:
    by_source: list[FirewalldZone] = []
    for zone in state.zones.values():
        for source in zone.sources:
            spec = ("ipset", source[len("ipset:") :]) if source.startswith("ipset:") else ("address", source)
            if _firewalld_source_in(state, spec, probe):
                by_source.append(zone)
                break
    if len(by_source) > 1:
        raise _UndeterminedError(f"{probe.source} is bound to zones {', '.join(zone.name for zone in by_source)}")
    if by_source:
        return by_source[0]
    arrival = inspection.arrival_interface(probe.source)
    for zone in state.zones.values():
        if arrival is not None and arrival in zone.interfaces:
            return zone
    if state.default_zone not in state.zones:
        raise _UndeterminedError(f"the default zone {state.default_zone!r} is not listed")
    return state.zones[state.default_zone]


def _firewalld_opens(ports: Iterable[str], protocols: Iterable[str], probe: _Probe) -> bool:
    if probe.protocol in protocols:
        return True
    for entry in ports:
        port, _, protocol = entry.partition("/")
        if protocol == probe.protocol and _ports_cover(port.replace("-", ":"), probe.first, probe.last) is True:
            return True
    return False


def _firewalld_allows(inspection: FirewallInspection, state: FirewalldState, probe: _Probe) -> bool:
    for policy in state.policies.values():
        if "HOST" not in policy.egress_zones and "ANY" not in policy.egress_zones:
            continue
        if policy.target.upper() in ("DROP", "REJECT", "%%REJECT%%"):
            raise _UndeterminedError(f"policy {policy.name} has target {policy.target}")
        for text in policy.rich_rules:
            if "drop" in text.split() or "reject" in text.split():
                raise _UndeterminedError(f"policy {policy.name} drops or rejects some traffic")
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
                raise _UndeterminedError(f"service {rich.service} is not readable")
            matches = _firewalld_opens(ports, (), probe)
        elif rich.port is not None:
            port, protocol = rich.port
            matches = (
                protocol == probe.protocol and _ports_cover(port.replace("-", ":"), probe.first, probe.last) is True
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
            raise _UndeterminedError(f"service {service} is not readable")
        service_ports.extend(state.service_ports[service])
    return _firewalld_opens([*zone.ports, *service_ports], zone.protocols, probe)


# ---- nftables


def _nft_chain_rules(ruleset: Sequence[dict[str, Any]], family: str, table: str, chain: str) -> list[dict[str, Any]]:
    return [
        rule
        for rule in _nft_objects(ruleset, "rule")
        if (rule.get("family"), rule.get("table"), rule.get("chain")) == (family, table, chain)
    ]


def _nft_compare(op: str, matched: bool) -> bool:
    return not matched if op == "!=" else matched


def _nft_address_matches(
    right: Any, probe_net: IPNetwork, sets: Mapping[str, list[IPNetwork]], where: str
) -> bool | None:
    if isinstance(right, str) and right.startswith("@"):
        if right[1:] not in sets:
            raise _UndeterminedError(f"{where} uses set {right} which is not an address set")
        networks = sets[right[1:]]
    else:
        try:
            networks = _nft_value_networks(right)
        except (ValueError, KeyError, TypeError):
            raise _UndeterminedError(f"{where} compares an address with {right!r}") from None
    same_family = [network for network in networks if network.version == probe_net.version]
    if any(probe_net.subnet_of(network) for network in same_family):  # type: ignore[arg-type]
        return True
    if any(probe_net.overlaps(network) for network in same_family):
        return None
    return False


def _nft_match(
    match: dict[str, Any],
    probe: _Probe,
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
        raise _UndeterminedError(f"{where} uses the comparison {op!r}")
    if isinstance(left, dict) and "payload" in left:
        payload = left["payload"]
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
                    _nft_address_matches(right, net, sets, where)
                    for net in local
                    if net.version == probe.source.version
                ]
                if results and all(result is True for result in results):
                    return _nft_compare(op, True)
                if results and all(result is False for result in results):
                    return _nft_compare(op, False)
                return None
            if field_name in ("protocol", "nexthdr"):
                return _nft_compare(op, _nft_value_has(right, probe.protocol))
            raise _UndeterminedError(f"{where} matches {protocol} {field_name}")
        if protocol in ("tcp", "udp", "th"):
            if protocol not in ("th", probe.protocol):
                return False  # a tcp header match fails on a udp packet, whatever the op
            if field_name == "dport":
                try:
                    ranges = _nft_ports(right)
                except (ValueError, KeyError, TypeError):
                    raise _UndeterminedError(f"{where} compares a port with {right!r}") from None
                covered = sum(max(0, min(high, probe.last) - max(low, probe.first) + 1) for low, high in ranges)
                if covered >= probe.last - probe.first + 1:
                    return _nft_compare(op, True)
                return _nft_compare(op, False) if covered == 0 else None
            if field_name == "sport":
                return None
            raise _UndeterminedError(f"{where} matches {protocol} {field_name}")
        raise _UndeterminedError(f"{where} matches the {protocol} header")
    if isinstance(left, dict) and "meta" in left:
        key = left["meta"].get("key")
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
        raise _UndeterminedError(f"{where} matches meta {key}")
    if isinstance(left, dict) and "ct" in left:
        key = left["ct"].get("key")
        if key == "state":
            values = right if isinstance(right, list) else [right]
            return _nft_compare(op, "new" in values)
        raise _UndeterminedError(f"{where} matches ct {key}")
    if isinstance(left, dict) and "fib" in left:
        return None
    raise _UndeterminedError(f"{where} has a match the checker does not read ({json.dumps(left)[:80]})")


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
    inspection: FirewallInspection, probe: _Probe, family: str, table: str, chain: str, *, depth: int = 0
) -> str:
    """'accept', 'drop', 'return' (fell off or returned) for the probe in a chain."""
    ruleset = inspection.nft_ruleset
    if depth > 16:
        raise _UndeterminedError(f"chain {table}/{chain} jumps too deep")
    sets = _nft_sets(ruleset, family, table)
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
                raise _UndeterminedError(f"{where} uses the iptables extension {expression['xt'].get('name')!r}")
            elif any(key in expression for key in _NFT_NEUTRAL):
                continue
            else:
                raise _UndeterminedError(f"{where} has the statement {next(iter(expression))!r}")
        if outcome is False or verdict is None:
            continue
        if outcome is None:
            raise _UndeterminedError(f"{where} may or may not apply to traffic from {probe.source}")
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


def _nft_allows(inspection: FirewallInspection, probe: _Probe) -> bool:
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
