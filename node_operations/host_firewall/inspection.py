"""What a host's firewall is now, as firewall_inspect.sh reports it: which of
UFW, firewalld and nftables are installed and running, UFW's recorded rules,
firewalld's zones, policies and ipsets, nft's ruleset as JSON, the host's
addresses; parsed into one `FirewallInspection`, and the backend the program
uses on the node chosen from it."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from host_scripts import script_path
from node_operations.host_firewall.plan import FirewallError, IPNetwork
from remote_access.ssh import SshSession

FirewallBackend = Literal["ufw", "firewalld", "nftables"]
# The comment every UFW rule of the program's starts with.
UFW_TAG = "hk3s"
# A hang detector, not a speed promise: on firewalld hosts the inspection runs
# several firewall-cmd calls, each a Python start and a D-Bus round trip, which a
# busy small host can take seconds each for; it gets the time a removal gets.
INSPECT_DEADLINE_SECONDS = 120.0


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
    ufw_ipv6_unfiltered: bool = False
    """UFW has IPV6=no while IPv6 is on in the kernel: every port is open over IPv6."""

    def backend(self) -> FirewallBackend:
        """The firewall the program uses on this node: UFW when it is active,
        else firewalld when it runs, else UFW or firewalld when installed (UFW
        first: on Ubuntu it ships inactive), else nftables."""
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
        ufw_ipv6_unfiltered=facts.get("ufw_ipv6_unfiltered") == "yes",
    )


async def inspect_firewall(
    session: SshSession, *, operator: bool = False, deadline: float = INSPECT_DEADLINE_SECONDS
) -> FirewallInspection:
    """Run firewall_inspect.sh on an open session; `operator` also reads what
    checking an operator's firewalld needs (policies, services, every ipset)."""
    args = ["operator"] if operator else []
    result = await session.run_script(script_path("firewall_inspect.sh"), args, deadline=deadline)
    return parse_inspection(session.target.node, result.stdout)
