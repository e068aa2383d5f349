"""The plan a node's host firewall enforces: its rules, the checks that refuse
an unsafe plan, and the rules' sources gathered into named peer sets (one per
distinct source list, so the rule count does not grow with the peers)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from node_operations.firewall_plan import ANY_IPV4, NODEPORT_RANGE, SSH_PORT, PortRule, Role
from remote_access.ssh import SshError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# k3s's flannel interfaces (vxlan, wireguard-native, the bridge), plus Cilium's
# and its per-pod veths, harmless where they do not exist. Traffic on them has
# passed WireGuard or VXLAN already, so every backend lets it in.
FABRIC_INTERFACES = ("cni0", "flannel.1", "flannel-v6.1", "flannel-wg", "flannel-wg-v6")
FABRIC_INTERFACE_PATTERNS = ("cilium_*", "lxc*")
# UFW and firewalld take no wildcards: the names k3s uses.
FABRIC_INTERFACES_EXACT = ("cni0", "flannel.1", "flannel-wg")
FABRIC_PURPOSE = "cluster fabric"
SESSION_SSH_PURPOSE = "SSH (the port hk3s logs in on)"
# 8888/tcp stays closed to traffic from outside the node whatever the stack says:
# the port table docs/network-and-firewalls.md promises never opens it, and an operator running
# their own firewall is told the same.
OPERATOR_CLOSED_PORT = 8888
FIREWALLD_IPSET_PREFIX = "hk3s-"


class FirewallError(SshError):
    """A host firewall operation failed on a named host; the message says what to do."""


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
    block_metadata: bool = False
    """Drop forwarded traffic (pods') to the cloud's metadata service (firewall_plan.METADATA_ADDRESS):
    set for a server the program created at Hetzner, whose metadata service serves its SSH host keys."""
    cluster_networks: tuple[str, ...] = ()
    """The pod and Service networks (hk3s:cluster.pod_cidr and service_cidr): traffic to them that
    arrives outside the cluster fabric from an address not in `node_addresses` is dropped, so a
    host on the nodes' segment that routes them through a node reaches no pod and no Service."""
    node_addresses: tuple[str, ...] = ()
    """Every node's cluster address: the sources that may send to `cluster_networks` from
    outside the fabric."""

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
                and not is_ssh_rule(rule)
                and not (is_nodeport and self.nodeports_open)
            ):
                problems.append(f"{where}: on a worker only SSH may be open to every source")
        return problems + self.network_problems()

    def network_problems(self) -> list[str]:
        """`cluster_networks` and `node_addresses` that are not IPv4 networks, one line each."""
        problems: list[str] = []
        fields = (("cluster_networks", self.cluster_networks), ("node_addresses", self.node_addresses))
        for field_name, values in fields:
            for value in values:
                try:
                    network = ipaddress.ip_network(value, strict=False)
                except ValueError:
                    problems.append(f"{field_name}: {value!r} is not an IP network")
                    continue
                if network.version != 4:
                    problems.append(f"{field_name}: {value!r} is not an IPv4 network")
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


def is_ssh_rule(rule: PortRule) -> bool:
    return rule.protocol == "tcp" and (rule.port == SSH_PORT or rule.purpose.startswith("SSH"))


def is_nodeport_rule(rule: PortRule) -> bool:
    first, last = port_range(rule.port)
    low, high = port_range(NODEPORT_RANGE)
    return first <= high and last >= low


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
