"""Which network the nodes use to talk to each other (a private network when every
node shares one, else public addresses), decided from the hosts' own addresses and
routing tables.

Everything here but `check_connection` is pure: it reads the facts `host_facts.sh`
recorded and the stack's settings, and returns a `NetworkDecision` or raises
`NetworkRefusedError` naming the setting that fixes it. The rules:

* A worker has a *private path* to the server when each host holds a private
  IPv4 address and routes the other's through that address's interface by a
  route that is not its default route.
* A path whose interface carries a host's default route (cloud VMs in one VPC)
  needs `hk3s:network.private_network`; without it the first join checks the
  network and stops, printing the setting to add.
* A path through the recorded private addresses (`private_address` of the
  server and the worker) is reused when automatic selection finds none and the
  routing, connectivity and overlap checks pass.
* A private network overlapping the pod or service network is refused.
* `auto` is private when every worker has a private path, else public. The
  first decision with a worker in it fixes the mode for the cluster; a later
  setting that contradicts it is refused.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Any, Literal

from remote_access.ssh import SshSession

PRIVATE_RANGES = tuple(IPv4Network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"))
CONNECT_DEADLINE_SECONDS = 5

PathKind = Literal["route", "explicit", "recorded", "default-route"]


class NetworkRefusedError(ValueError):
    """The network mode cannot be decided as configured; the message names the
    setting or host and the fix. Nothing has been changed."""


def is_private(address: IPv4Address) -> bool:
    return any(address in net for net in PRIVATE_RANGES)


@dataclass(frozen=True)
class Route:
    """One line of `ip -4 route show table main`."""

    destination: IPv4Network  # 0.0.0.0/0 for the default route
    device: str | None
    gateway: IPv4Address | None

    @property
    def is_default(self) -> bool:
        return self.destination.prefixlen == 0


def parse_route(line: str) -> Route | None:
    """A unicast route, or None for lines that carry no path (blackhole, ...)."""
    words = line.split()
    if not words or words[0] in ("blackhole", "unreachable", "prohibit", "throw", "local", "broadcast", "multicast"):
        return None
    if words[0] == "unicast":
        words = words[1:]
    try:
        destination = IPv4Network("0.0.0.0/0" if words[0] == "default" else words[0], strict=False)
    except ValueError:
        return None
    device = words[words.index("dev") + 1] if "dev" in words[:-1] else None
    gateway = None
    if "via" in words[:-1]:
        try:
            gateway = IPv4Address(words[words.index("via") + 1])
        except ValueError:
            gateway = None
    return Route(destination, device, gateway)


@dataclass(frozen=True)
class HostNetwork:
    """One host's addresses and routes, as its probe recorded them."""

    node: str
    addresses: tuple[tuple[str, IPv4Interface], ...]  # (interface, address/prefix)
    routes: tuple[Route, ...]
    recorded_private: IPv4Address | None = None

    @classmethod
    def from_facts(
        cls, node: str, ipv4_addresses: Iterable[str], ipv4_routes: Iterable[str], recorded_private: str | None = None
    ) -> HostNetwork:
        addresses = []
        for entry in ipv4_addresses:
            interface, _, cidr = entry.partition(" ")
            try:
                addresses.append((interface, IPv4Interface(cidr.strip())))
            except ValueError:
                continue
        routes = tuple(route for route in (parse_route(line) for line in ipv4_routes) if route is not None)
        return cls(node, tuple(addresses), routes, IPv4Address(recorded_private) if recorded_private else None)

    def route_to(self, address: IPv4Address) -> Route | None:
        """The route the kernel picks for `address` (longest prefix of table main)."""
        matches = [route for route in self.routes if address in route.destination]
        return max(matches, key=lambda route: route.destination.prefixlen, default=None)

    def interface_of(self, address: IPv4Address) -> str | None:
        return next((iface for iface, cidr in self.addresses if cidr.ip == address), None)

    @property
    def default_interfaces(self) -> set[str]:
        return {route.device for route in self.routes if route.is_default and route.device}

    def private_addresses(self) -> list[tuple[str, IPv4Interface]]:
        return [(iface, cidr) for iface, cidr in self.addresses if is_private(cidr.ip)]

    def describe(self) -> str:
        listed = ", ".join(f"{cidr} on {iface}" for iface, cidr in self.addresses)
        return listed or "no IPv4 address"


@dataclass(frozen=True)
class PrivatePath:
    """How one worker and the server reach each other privately."""

    worker: str
    worker_address: str
    server_address: str
    network: str
    kind: PathKind

    def as_dict(self) -> dict[str, str]:
        return {
            "worker": self.worker,
            "worker_address": self.worker_address,
            "server_address": self.server_address,
            "network": self.network,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivatePath:
        return cls(
            worker=str(data["worker"]),
            worker_address=str(data["worker_address"]),
            server_address=str(data["server_address"]),
            network=str(data["network"]),
            kind=data["kind"],
        )


@dataclass(frozen=True)
class NetworkSetting:
    """The settings the decision reads (hk3s:network and the cluster's networks)."""

    mode: Literal["auto", "private", "public"]
    private_network: str | None
    pod_cidr: str
    service_cidr: str


@dataclass(frozen=True)
class Recorded:
    """What an earlier run decided (the NetworkPlan resource's outputs)."""

    mode: str | None = None  # private or public once a worker was in the decision
    paths: Mapping[str, PrivatePath] = field(default_factory=dict)


@dataclass(frozen=True)
class NetworkDecision:
    """The mode and every node's cluster address; `to_verify` are the paths whose
    connections must be checked before they are used (candidates and reused
    recorded addresses)."""

    mode: Literal["private", "public", "pending"]
    addresses: dict[str, str]
    paths: dict[str, PrivatePath]
    notes: list[str]
    candidate: PrivatePath | None = None  # a default-route network to check and print
    behind_nat: list[str] = field(default_factory=list)
    """Public mode: workers whose public address is on none of their interfaces (NAT):
    the caller checks that the server can connect to them there."""


def _overlap(network: IPv4Network, setting: NetworkSetting) -> str | None:
    for key, cidr in (("hk3s:cluster.pod_cidr", setting.pod_cidr), ("hk3s:cluster.service_cidr", setting.service_cidr)):
        if network.overlaps(IPv4Network(cidr)):
            return (
                f"the private network {network} overlaps the cluster's {key.rsplit('.', 1)[1].replace('_', ' ')} "
                f"{cidr} ({key}); packets to its hosts would be routed into the cluster. Renumber the private "
                f"network, or set hk3s:network.mode: public to join over public addresses"
            )
    return None


def _pair(
    server: HostNetwork, worker: HostNetwork, explicit: IPv4Network | None
) -> tuple[PrivatePath | None, PrivatePath | None]:
    """(a usable path, a default-route candidate) between worker and server."""
    candidate = None
    for w_iface, w_cidr in worker.private_addresses():
        for s_iface, s_cidr in server.private_addresses():
            if explicit is not None and not (w_cidr.ip in explicit and s_cidr.ip in explicit):
                continue
            to_server, to_worker = worker.route_to(s_cidr.ip), server.route_to(w_cidr.ip)
            if to_server is None or to_worker is None:
                continue
            if to_server.device != w_iface or to_worker.device != s_iface:
                continue  # the traffic would leave through another interface
            if to_server.is_default or to_worker.is_default:
                continue
            carries_default = w_iface in worker.default_interfaces or s_iface in server.default_interfaces
            if explicit is not None:
                return PrivatePath(worker.node, str(w_cidr.ip), str(s_cidr.ip), str(explicit), "explicit"), None
            if carries_default:
                network = w_cidr.network if s_cidr.ip in w_cidr.network else to_server.destination
                candidate = candidate or PrivatePath(
                    worker.node, str(w_cidr.ip), str(s_cidr.ip), str(network), "default-route"
                )
                continue
            return PrivatePath(worker.node, str(w_cidr.ip), str(s_cidr.ip), str(to_server.destination), "route"), None
    return None, candidate


def _recorded_path(server: HostNetwork, worker: HostNetwork, explicit: IPv4Network | None) -> PrivatePath | None:
    """The path between the recorded private addresses, if both hosts route it."""
    s_address, w_address = server.recorded_private, worker.recorded_private
    if s_address is None or w_address is None:
        return None
    if server.interface_of(s_address) is None or worker.interface_of(w_address) is None:
        return None
    to_server, to_worker = worker.route_to(s_address), server.route_to(w_address)
    if to_server is None or to_worker is None:
        return None
    if explicit is not None and s_address in explicit and w_address in explicit:
        return PrivatePath(worker.node, str(w_address), str(s_address), str(explicit), "recorded")
    if to_server.is_default or to_worker.is_default:
        return None
    return PrivatePath(worker.node, str(w_address), str(s_address), str(to_server.destination), "recorded")


def _no_path(server: HostNetwork, worker: HostNetwork) -> str:
    return (
        f"{worker.node} has no private path to the server {server.node}: {worker.node} has {worker.describe()}; "
        f"{server.node} has {server.describe()}"
    )


def fixed_mode_refusal(mode: str, recorded_mode: str | None) -> str | None:
    """Why hk3s:network.mode may not be `mode` in a cluster whose first join fixed
    `recorded_mode`, or None when it may (no mode fixed yet, the same mode, or auto)."""
    fixed = recorded_mode if recorded_mode in ("private", "public") else None
    if fixed is None or mode in ("auto", fixed):
        return None
    return (
        f"hk3s:network.mode is {mode}, but the cluster's first join fixed it to {fixed}: every node "
        f"talks to the others over {fixed} addresses, and moving them all would cut the running cluster "
        f"apart. Set hk3s:network.mode back to {fixed} (or auto)"
    )


def _no_private_path(
    server: HostNetwork, unreached: Sequence[HostNetwork], default_route_networks: Mapping[str, str], *, fixed: bool
) -> NetworkRefusedError:
    """Private mode is required (set, or fixed by the first join) but these workers have no
    private path to the server."""
    reason = "the cluster's first join fixed private mode" if fixed else "hk3s:network.mode is private"
    shared = "".join(
        f"; {name} shares {network} with the server, but it carries the default route: set "
        f"hk3s:network.private_network: {network} to use it"
        for name, network in sorted(default_route_networks.items())
    )
    return NetworkRefusedError(
        f"{reason}, but "
        + "; ".join(_no_path(server, net) for net in unreached)
        + shared
        + ". Attach the host to the server's private network (or record its private_address), "
        + ("or remove it from hk3s:workers" if fixed else "or set hk3s:network.mode: public")
    )


def decide(
    setting: NetworkSetting,
    server: HostNetwork,
    server_public: str,
    workers: Sequence[tuple[HostNetwork, str]],
    recorded: Recorded,
    *,
    candidates_unusable: bool = False,
) -> NetworkDecision:
    """Decide the mode and the cluster address of every node.

    `workers` pairs each worker's network with its public address;
    `candidates_unusable` when the default-route candidate failed its checks.
    Raises `NetworkRefusedError` with the setting to change."""
    explicit = IPv4Network(setting.private_network) if setting.private_network else None
    fixed_mode = recorded.mode if recorded.mode in ("private", "public") else None
    refusal = fixed_mode_refusal(setting.mode, recorded.mode)
    if refusal is not None:
        raise NetworkRefusedError(refusal)
    public_addresses = {server.node: server_public, **{net.node: public for net, public in workers}}
    if not workers:
        return NetworkDecision("pending", public_addresses, {}, ["no worker yet: the first join decides the mode"])
    wanted = fixed_mode or setting.mode
    natted = [net.node for net, public in workers if net.interface_of(IPv4Address(public)) is None]
    if wanted == "public":
        return NetworkDecision("public", public_addresses, {}, [], behind_nat=natted)

    paths: dict[str, PrivatePath] = {}
    missing: list[str] = []
    candidate: PrivatePath | None = None
    default_route_networks: dict[str, str] = {}
    for worker, _public in workers:
        previous = recorded.paths.get(worker.node)
        if previous is not None and worker.interface_of(IPv4Address(previous.worker_address)) is not None:
            # A worker already recorded in private mode keeps its path (no setting needed again).
            paths[worker.node] = previous
            continue
        found, default_route = _pair(server, worker, explicit)
        if found is None:
            found = _recorded_path(server, worker, explicit)
        if found is None:
            if default_route is not None:
                default_route_networks[worker.node] = default_route.network
                candidate = candidate or default_route
            missing.append(worker.node)
            continue
        problem = _overlap(IPv4Network(found.network), setting)
        if problem:
            raise NetworkRefusedError(f"{worker.node}: {problem}")
        paths[worker.node] = found

    if candidate is not None:
        problem = _overlap(IPv4Network(candidate.network), setting)
        if problem:
            raise NetworkRefusedError(f"{candidate.worker}: {problem}")
    if missing:
        if candidate is not None and not fixed_mode and not candidates_unusable:
            # The caller checks its connections, then stops and prints the setting (`candidate_refusal`).
            return NetworkDecision("private", {}, paths, [], candidate=candidate)
        if wanted == "private":
            unreached = [net for net, _ in workers if net.node in missing]
            raise _no_private_path(server, unreached, default_route_networks, fixed=fixed_mode is not None)
        notes = [f"public mode: {_no_path(server, net)}" for net, _ in workers if net.node in missing]
        return NetworkDecision("public", public_addresses, {}, notes, behind_nat=natted)

    addresses = {server.node: next(iter(paths.values())).server_address}
    server_addresses = {path.server_address for path in paths.values()}
    if len(server_addresses) > 1:
        raise NetworkRefusedError(
            f"the workers reach the server {server.node} at different private addresses "
            f"({', '.join(sorted(server_addresses))}); set hk3s:network.private_network to the one network they share"
        )
    addresses.update({name: path.worker_address for name, path in paths.items()})
    return NetworkDecision("private", addresses, paths, [])


def behind_nat_refusal(worker: HostNetwork, public: str, server: str, port: int, why: str) -> NetworkRefusedError:
    """A worker whose public address is not its own and that the server cannot connect to."""
    return NetworkRefusedError(
        f"{worker.node}: its address {public} is on none of its interfaces ({worker.describe()}) and the server "
        f"{server} cannot connect to it at {public}:{port} ({why}): {worker.node} is behind NAT. Nodes connect to "
        f"each other in public mode, so it cannot join that way. Give {worker.node} a private network it shares "
        "with the server (hk3s:network.mode auto or private then uses it), or set its address to one the other "
        "nodes can reach. Nothing was joined"
    )


def local_node_ips(addresses: Mapping[str, str], hosts: Mapping[str, HostNetwork]) -> dict[str, str]:
    """The address each node's k3s binds to (its node IP): its cluster address when the
    host holds it, else (a public address behind a 1:1 NAT) the address of the interface
    its default route leaves by; the cluster address is then its external IP."""
    local: dict[str, str] = {}
    for node, address in addresses.items():
        host = hosts.get(node)
        if host is None or host.interface_of(IPv4Address(address)) is not None:
            local[node] = address
            continue
        outgoing = next((cidr for iface, cidr in host.addresses if iface in host.default_interfaces), None)
        local[node] = str(outgoing.ip) if outgoing is not None else address
    return local


def candidate_refusal(candidate: PrivatePath) -> NetworkRefusedError:
    """The first join found only a network that carries the default route, and it passed
    the checks: stop before the host joins and print the setting to add."""
    return NetworkRefusedError(
        f"{candidate.worker} and the server share the private network {candidate.network}, which carries their "
        f"default route, so it is not used without your say-so. Its connections and overlap checks passed. To use "
        f"it, add to the stack config:\n    hk3s:network:\n      private_network: {candidate.network}\n"
        f"or set hk3s:network.mode: public to join over public addresses. Nothing was joined"
    )


async def check_connection(session: SshSession, address: str, port: int) -> str | None:
    """Open a TCP connection from the session's host; None when it connects, else why not."""
    script = (
        f"timeout {CONNECT_DEADLINE_SECONDS} bash -c {shlex.quote(f'exec 3<>/dev/tcp/{address}/{port}')} 2>&1; "
        'code=$?; [ "$code" = 124 ] && echo "no answer within '
        f'{CONNECT_DEADLINE_SECONDS} s"; exit $code'
    )
    result = await session.run(["bash", "-c", script], deadline=CONNECT_DEADLINE_SECONDS + 20, check=False)
    if result.exit_status == 0:
        return None
    detail = " ".join(result.stdout.split() + result.stderr.split())
    detail = detail.replace("bash: line 1: ", "").replace(f"/dev/tcp/{address}/{port}: ", "")
    return detail or f"exit status {result.exit_status}"
