"""Addressing: the lab's address ranges, picked at set-up time so they clash with no route or
address of this machine, no resolver, and no address the machine's resolver gives for the
package registries (:func:`reserved_networks`)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.hosts.errors import LabError
from lab.hosts.processes import _ip_json

IPv4Network = ipaddress.IPv4Network
IPv4Address = ipaddress.IPv4Address

REGISTRY_HOSTS: tuple[str, ...] = (
    "deb.debian.org",
    "pypi.org",
    "files.pythonhosted.org",
    "proxy.golang.org",
)
#: k3s's default pod and service networks: lab-picked ranges avoid them.
K3S_DEFAULT_NETS: tuple[IPv4Network, ...] = (IPv4Network("10.42.0.0/16"), IPv4Network("10.43.0.0/16"))

PUBLIC_CANDIDATES: tuple[IPv4Network, ...] = (
    IPv4Network("198.51.100.0/24"),
    IPv4Network("203.0.113.0/24"),
    IPv4Network("192.0.2.0/24"),
    *(IPv4Network(f"198.{18 + n // 256}.{n % 256}.0/24") for n in range(512)),
)
PRIVATE_CANDIDATES: tuple[IPv4Network, ...] = (
    *(IPv4Network(f"10.{n}.0.0/16") for n in range(0, 40)),
    *(IPv4Network(f"172.{n}.0.0/16") for n in range(16, 32)),
)
NAT_CANDIDATES: tuple[IPv4Network, ...] = (
    *(IPv4Network(f"100.{n}.0.0/16") for n in range(64, 128)),
    IPv4Network("192.168.0.0/16"),
)

#: Where lab hosts' traffic must never go through the uplink (resolvers and registries excepted).
SPECIAL_NETS: tuple[IPv4Network, ...] = tuple(
    IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "240.0.0.0/4",
    )
)


def _resolve_ipv4(names: Iterable[str], timeout: float = 5.0) -> dict[str, list[str]]:
    results: dict[str, list[str]] = {}

    def resolve(name: str) -> None:
        try:
            infos = socket.getaddrinfo(name, 443, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            return
        results[name] = sorted({str(info[4][0]) for info in infos})

    threads = [threading.Thread(target=resolve, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(results)


def machine_nameservers() -> list[str]:
    """IPv4 nameservers the hosts can use (the machine's, skipping loopback stubs)."""
    found: list[str] = []
    for candidate in (Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf")):
        try:
            lines = candidate.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                try:
                    addr = IPv4Address(parts[1])
                except ValueError:
                    continue
                if not addr.is_loopback and str(addr) not in found:
                    found.append(str(addr))
        if found:
            break
    return found


@dataclass(frozen=True)
class Reserved:
    """A network the lab must not use, and why."""

    network: IPv4Network
    reason: str


def reserved_networks(registry_hosts: Sequence[str] = REGISTRY_HOSTS) -> list[Reserved]:
    """Everything lab ranges must not overlap: this machine's IPv4 routes (all
    tables, default routes aside) and addresses, its resolvers, and the
    addresses its resolver gives for the package registries."""
    reserved: list[Reserved] = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = str(route.get("dst", ""))
        if not dst or dst == "default" or dst.startswith("0.0.0.0/0"):
            continue
        if route.get("type") in ("multicast",):
            continue
        try:
            network = IPv4Network(dst, strict=False)
        except ValueError:
            continue
        reserved.append(Reserved(network, f"route to {dst} dev {route.get('dev', '?')}"))
    for link in _ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            try:
                network = IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            except (KeyError, ValueError):
                continue
            reserved.append(Reserved(network, f"address {info['local']} on {link.get('ifname', '?')}"))
    for server in machine_nameservers():
        reserved.append(Reserved(IPv4Network(f"{server}/32"), f"resolver {server}"))
    for name, addresses in _resolve_ipv4(registry_hosts).items():
        for addr in addresses:
            reserved.append(Reserved(IPv4Network(f"{addr}/32"), f"{name} resolves to {addr}"))
    return reserved


def pick_network(candidates: Iterable[IPv4Network], reserved: Sequence[Reserved]) -> IPv4Network:
    """The first candidate overlapping nothing reserved."""
    for candidate in candidates:
        if not any(candidate.overlaps(r.network) for r in reserved):
            return candidate
    raise LabError("no free address range among the candidates; reserved: " + "; ".join(r.reason for r in reserved))


@dataclass(frozen=True)
class AddressPlan:
    """The lab's ranges, picked at set-up time."""

    public_net: IPv4Network
    private_net: IPv4Network
    nat_net: IPv4Network
    excluded: tuple[str, ...] = ()

    @property
    def public_gateway(self) -> str:
        return str(self.public_net.network_address + 1)

    @property
    def gateway_public_ip(self) -> str:
        return str(self.public_net.network_address + 2)

    @property
    def private_gateway(self) -> str:
        return str(self.private_net.network_address + 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "public_net": str(self.public_net),
            "private_net": str(self.private_net),
            "nat_net": str(self.nat_net),
            "excluded": list(self.excluded),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AddressPlan:
        return cls(
            IPv4Network(data["public_net"]),
            IPv4Network(data["private_net"]),
            IPv4Network(data["nat_net"]),
            tuple(data.get("excluded", ())),
        )


def plan_addresses(registry_hosts: Sequence[str], requested_private_cidr: str | None = None) -> AddressPlan:
    """The lab's public, private and behind-NAT ranges: the first candidates that overlap nothing
    this machine uses (:func:`reserved_networks`) nor k3s's default networks; the private one is
    `requested_private_cidr` when given (refused when it clashes)."""
    reserved = reserved_networks(registry_hosts)
    avoid = reserved + [Reserved(n, "k3s default network") for n in K3S_DEFAULT_NETS]
    public = pick_network(PUBLIC_CANDIDATES, avoid)
    avoid.append(Reserved(public, "lab public network"))
    if requested_private_cidr is not None:
        private = IPv4Network(requested_private_cidr, strict=False)
        clash = [r.reason for r in avoid if private.overlaps(r.network)]
        if clash:
            raise LabError(f"private network {private} clashes with: {'; '.join(clash)}")
    else:
        private = pick_network(PRIVATE_CANDIDATES, avoid)
    avoid.append(Reserved(private, "lab private network"))
    nat = pick_network(NAT_CANDIDATES, avoid)
    return AddressPlan(public, private, nat, tuple(sorted({f"{r.network} ({r.reason})" for r in reserved})))
