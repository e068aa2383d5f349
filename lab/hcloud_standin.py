"""A stand-in of the Hetzner Cloud API for the lab: an HTTP server on this machine that serves
the calls Hetzner's clients make for the program's stacks (the program's own client,
remote_access/hetzner_api.py through Hetzner's `hcloud` library, and Hetzner's Terraform
provider through hcloud-go), for lab hosts registered as Hetzner servers (`add_server`) and for
servers created through it (their machines made by `boot`: lab/hcloud_servers.py boots a lab
host running real cloud-init; `switched_boot` makes a power switch alone). LAB ONLY: the
product never imports it; it reaches it through hcloud:endpoint as it would reach Hetzner.

What it serves, each as Hetzner's API reference (docs.hetzner.cloud) describes it, never kinder:
- Authentication ("Authentication"): every request needs `Authorization: Bearer <token>`; a
  missing or wrong token is answered 401 `{"error": {"code": "unauthorized", "message":
  "unable to authenticate", "details": {}}}`.
- Errors ("Errors"): `{"error": {"code", "message", "details"}}` with the HTTP status of the
  code: `invalid_input` 400 (details.fields names the field), `json_error` 400, `unauthorized`
  401, `protected` 403, `resource_limit_exceeded` 403, `not_found` 404 (an unknown id or path),
  `uniqueness_error` 409, `locked` 423 (an action while the server's previous one still runs),
  `rate_limit_exceeded` 429, and the calls' own codes below.
- Rate limit ("Rate Limiting"): every authenticated answer carries RateLimit-Limit,
  RateLimit-Remaining and RateLimit-Reset (the UNIX time the budget is full again); the budget
  is 3600 requests (`rate_limit`), one more each second (limit/3600 per second); an empty one is
  answered 429 `rate_limit_exceeded`.
- Pagination ("Pagination"): every list takes `page` (from 1) and `per_page` (default 25, at
  most 50) and answers `meta.pagination` {page, per_page, previous_page, next_page, last_page,
  total_entries}; lists take `label_selector` (`k=v`, `k!=v`, `k`, `!k`, `k in (..)`, `k notin
  (..)`) and their `name` filter (exact match).
- Project limits: creating a server, network, firewall, placement group or SSH key beyond
  `limits` (Hetzner sets them per account) is answered 403 `resource_limit_exceeded`. Names are
  unique per project for each kind: a second is 409 `uniqueness_error`.
- Catalogue ("Server Types", "Locations", "Data Centers", "Images"; lab/hcloud_catalog.py):
  GET /server_types, /locations, /datacenters, /images and each by id. Server types carry
  per-location `deprecation`, `available` and `recommended` (changelog 2025-09-24: per-location
  server types; hcloud 2.27 needs both). Images: `include_deprecated` (default false, "List
  Images") hides a deprecated image (`deprecate_image`), which has `deprecated` (the timestamp)
  and `deprecation` {announced, unavailable_after}; a server is still created from it, as
  Hetzner creates one until the image is unavailable. hcloud 2.27 marks the datacenters
  endpoint deprecated (changelog 2026-06-02); the stand-in still serves it.
- Servers ("Servers"): GET /servers (`name`, `status`, `label_selector`), GET /servers/{id}:
  id, name, status, created, labels, locked, `public_net` (`ipv4`: id, ip, blocked, dns_ptr;
  `ipv6`; `firewalls` [{id, status "applied"}]), `private_net` (per network: `network`, the
  network's id, `ip`, `alias_ips`, `mac_address`), server_type, datacenter, location, image,
  protection {delete, rebuild}, placement_group and the other documented fields. A private
  address is unique only within its network: the reference says `private_net[].network` is
  "The Network ID the server is attached to" and `ip` "The server IP address on the network";
  every project's networks may use the same range (10.0.0.0/16 is the Console's default), so
  servers in two networks may report the same `ip`. A registered server reports its own
  network id (`add_server`'s `network`; default `DEFAULT_NETWORK`) and no IPv6. The status is
  the machine's power, read when asked: `running` while it runs, `off` once it is powered off
  (never `off` before it really is); `initializing`, `rebuilding` or `deleting` while that
  action runs.
- POST /servers ("Create a Server"): name (a hostname), server_type, image and location or
  datacenter (each by id or name; an unknown one is 400 `invalid_input`), user_data (at most
  32 KiB, else 400 `invalid_input`), ssh_keys
  (ids or names), networks, firewalls [{firewall}], placement_group, labels, public_net
  {enable_ipv4, enable_ipv6}, start_after_create. Answered 201 {server (status
  `initializing`), action `create_server` (running), next_actions [`start_server`],
  root_password (only without ssh_keys)}. After ACTION_SECONDS the machine is booted (`boot`
  gets the image, user data and the keys' public halves), its networks attached and firewalls
  applied, then both actions end `success`; a boot that fails ends them in `error`. Its public
  IPv4 is the machine's (`public_ip`), its IPv6 a /64 of the documentation range 2001:db8::/32
  (the lab has no IPv6: reported, not routed). A spread placement group already holding 10
  servers is answered 422 `placement_error` ("An error during the placement occurred", the
  call's error table; 10 is the Placement Groups limit), nothing created.
- PUT /servers/{id} (name, labels). DELETE /servers/{id} ("Delete a Server"): 403 `protected`
  while its delete protection is on; else action `delete_server`: the machine removed (a lab
  host goes: Lab.remove_host), the server leaves its firewalls, networks and placement group
  and is gone (404) once the action ends.
- Server actions ("Server Actions"): `poweroff` / `poweron` (201 `stop_server` /
  `start_server`, running, progress 0; after ACTION_SECONDS the machine is powered off — a lab
  host's init killed, like pulling the cord — or on, then `success`); `change_protection`
  {delete, rebuild} (the two must stay equal, the reference: "currently delete and rebuild
  attribute needs to have the same value"; else 400 `invalid_input`); `rebuild` {image} (403
  `protected` while its rebuild protection is on; else the machine removed and booted again
  with the user data it was created with); `attach_to_network` {network, ip, ip_range} (404 `not_found`
  for an unknown network, 422 `server_already_attached`, 422 `no_subnet_available` without a
  cloud/server subnet in the server's network zone, 422 `ip_not_available` for a taken or
  outside `ip`; else the first free address of the subnet `ip_range` or of the last subnet
  created, the network's own first address — its gateway — excepted, on the host's private
  NIC when the action ends); `detach_from_network`
  {network} (422 `server_not_attached_to_network`: the reference names no code; the stand-in's
  pick refuses, where terraform-provider-hcloud's hcloud_server_network Delete tolerates only
  `not_found`); `add_to_placement_group` (422
  `already_in_placement_group`: a server is in one group at most; 422 `server_not_stopped`
  while it runs) and `remove_from_placement_group`.
- Actions ("Actions"): GET /actions/{id} and GET /actions?id=... (what hcloud-go's waiter
  polls): status `running`, then `success` or `error` with `error: {"code", "message"}`;
  `resources` lists what an action is about.
- Networks ("Networks", "Network Actions"): GET (`name`), POST {name, ip_range (RFC 1918, /8 to
  /24), labels, subnets}, PUT, DELETE (403 `protected` while protected; attached servers are
  detached, "Delete a Network"); actions `add_subnet` {type cloud/server/vswitch, network_zone,
  ip_range inside the network's, overlapping no other subnet: else 400 `invalid_input`},
  `delete_subnet` {ip_range} (refused while servers are attached in it — "Subnets containing
  attached resources can not be deleted" — with 422 `resource_in_use`: the reference names no
  code) and `change_protection` {delete}. A subnet's `gateway` is the network's first address.
- Firewalls ("Firewalls", "Firewall Actions"): GET (`name`), POST {name, labels, rules,
  apply_to}, PUT, DELETE (422 `resource_in_use` while applied: "Firewall must not be in use to
  be deleted", hcloud-go hcloud/error.go). Rules as "Create a Firewall" takes them: direction
  in/out, protocol tcp/udp/icmp/esp/gre, a port or range for tcp and udp only, source_ips for
  `in` and destination_ips for `out` (CIDRs), else 400 `invalid_input`. `set_rules` (actions
  `set_firewall_rules` and `apply_firewall` per server it is applied to). `apply_to_resources`
  {apply_to: [{type server, server {id}}]}: 404 `firewall_resource_not_found` for an unknown
  server, 422 `firewall_already_applied`, 422 `private_net_only_server` for a server without a
  public address; nothing applied unless all can be. `remove_from_resources` {remove_from}: 201
  `{"actions": [...]}`, one `remove_firewall` action per server, finished `success` at once. A
  server the firewall is not applied to (or no server at all) is answered 404
  `firewall_resource_not_found` ("The resource the Firewall should be removed from was not
  found", the call's error table), and nothing is removed. `firewall_already_removed` is never
  answered: hcloud-go (hcloud/error.go) marks it "not used by the API anymore" since Hetzner's
  changelog of 2025-08-04 ("multiple API behavior changes for firewalls"), and
  terraform-provider-hcloud (internal/firewall/resource.go, removeFromResources) takes
  `firewall_resource_not_found` as "nothing left to remove".
- Placement groups ("Placement Groups"): GET (`name`, `type`), POST {name, type "spread" (the
  only type), labels} answered 201 {placement_group, action: null}, PUT, DELETE; `servers`
  lists its members.
- SSH keys ("SSH Keys": List, Get, Create, Update, Delete): GET /ssh_keys (filters `fingerprint`
  and `name`, exact match), GET /ssh_keys/{id}, POST /ssh_keys `{name, public_key, labels}`
  answered 201 `{"ssh_key": {id, name, fingerprint, public_key, labels, created}}` with the
  fingerprint Hetzner computes (MD5 of the key blob, colon-separated hex), PUT /ssh_keys/{id}
  `{name, labels}` (in place), DELETE /ssh_keys/{id} 204. One key per fingerprint and per name in
  the project: a second is answered 409 `uniqueness_error` ("SSH key with the same fingerprint
  already exists", "SSH key name is already used"), checked and stored under one lock, so of two
  uploads at once exactly one wins. `add_ssh_key` may give a key a fingerprint of its own (an MD5
  collision cannot be made on demand).
- An injectable failure (`fail_actions`): every later power action of that server ends in
  `error` with the given code and message and leaves the host as it was, until
  `clear_failures`.

What it does not model: volumes, floating and primary IPs, load balancers, certificates, ISOs,
images of one's own (snapshots, backups), routes, `shutdown`, `reset`, `reboot`, rescue, a
server type change, the resources' own action lists (GET /servers/{id}/actions), a label
selector applying a firewall, label syntax checks, `conflict` answers, the `deprecation` of API
calls (a removed endpoint's `deprecated_api_endpoint`), and TLS (it serves plain HTTP on
127.0.0.1). A created server's image must be Debian 12 for a lab host (lab/hcloud_servers.py).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import itertools
import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from lab import hcloud_catalog as catalog

# How long an action stays `running` before it acts (Hetzner's power actions take seconds).
ACTION_SECONDS = 1.0
# The id of the network a registered server's private addresses are in, unless `add_server` names another.
DEFAULT_NETWORK = 1
# Hetzner's default rate limit: 3600 requests an hour per project, one more every second.
RATE_LIMIT = 3600
# A spread placement group holds at most 10 servers (Hetzner's "Placement Groups" limit).
PLACEMENT_GROUP_SERVERS = 10
# Projects' resource limits (Hetzner sets them per account; these are the stand-in's, changeable).
DEFAULT_LIMITS = {"servers": 25, "networks": 50, "firewalls": 50, "placement_groups": 50, "ssh_keys": 200}
PER_PAGE, MAX_PER_PAGE = 25, 50
# "Create a Server": user_data "is limited to 32KiB".
USER_DATA_BYTES = 32 * 1024
_HOSTNAME = re.compile(
    r"^(?=.{1,63}$)[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$"
)
_PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


class Machine(Protocol):
    """What the stand-in powers: a lab host (lab.hosts.Host) or anything with the same calls.
    A machine the stand-in booted itself (a created server) may also have `remove()` (the
    server deleted), `attach_network(ip, ip_range)` and `detach_network(ip)`."""

    @property
    def is_running(self) -> bool: ...

    def power_off(self) -> None: ...

    def power_on(self) -> None: ...


@dataclass
class SwitchedMachine:
    """A machine that is only its power switch, for tests of the stand-in and its callers:
    on or off (`stuck` ignores a power off, as a server whose host hangs)."""

    is_running: bool = True
    stuck: bool = False
    public_ip: str | None = None
    removed: bool = False
    networks: dict[str, str] = field(default_factory=dict)  # ip -> the network's range

    def power_off(self) -> None:
        if not self.stuck:
            self.is_running = False

    def power_on(self) -> None:
        self.is_running = True

    def remove(self) -> None:
        self.is_running, self.removed = False, True

    def attach_network(self, ip: str, ip_range: str) -> None:
        self.networks[ip] = ip_range

    def detach_network(self, ip: str) -> None:
        self.networks.pop(ip, None)


@dataclass(frozen=True)
class ServerRequest:
    """What a created server is made of, for the boot function (`HcloudStandin(boot=...)`)."""

    id: int
    name: str
    image: dict[str, Any]  # the image's API object (os_flavor, os_version)
    user_data: str | None
    public_keys: tuple[str, ...]  # the `ssh_keys` the server was given, as the metadata serves them
    ipv4: bool


Boot = Callable[[ServerRequest], Machine]


class _Unbooted:
    """A created server's machine before its boot has made one."""

    is_running = False

    def power_off(self) -> None:
        return None

    def power_on(self) -> None:
        return None


def switched_boot(request: ServerRequest) -> SwitchedMachine:
    """A boot that makes a `SwitchedMachine` (no host) with a documentation address (RFC 5737),
    for tests of the API alone: a server that is only its power switch."""
    return SwitchedMachine(public_ip=f"203.0.113.{request.id % 250 + 1}" if request.ipv4 else None)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details or {}


def _invalid(field_name: str, message: str) -> ApiError:
    return ApiError(
        400,
        "invalid_input",
        f"invalid input in field '{field_name}'",
        {"fields": [{"name": field_name, "messages": [message]}]},
    )


@dataclass
class StandinServer:
    id: int
    name: str
    machine: Machine
    public_ipv4: str | None = None
    private_ips: tuple[str, ...] = ()
    network: int = DEFAULT_NETWORK  # the Hetzner network a registered server's private addresses are in
    labels: dict[str, str] = field(default_factory=dict)
    created: str = field(default_factory=_now)
    busy: bool = False  # an action of it runs
    failure: tuple[str, str] | None = None
    server_type: str = "cx33"
    image: str | None = "debian-12"
    datacenter: str = "fsn1-dc14"
    public_ipv6: str | None = None
    protection: dict[str, bool] = field(default_factory=lambda: {"delete": False, "rebuild": False})
    placement_group: int | None = None
    attachments: dict[int, str] = field(default_factory=dict)  # stand-in network id -> its address there
    phase: str | None = None  # initializing, deleting, rebuilding while that action runs
    request: ServerRequest | None = None  # a created server's boot (kept for a rebuild)

    def view(self, standin: HcloudStandin | None = None) -> dict[str, Any]:
        firewalls = (
            [{"id": f.id, "status": "applied"} for f in standin.firewalls.values() if self.id in f.applied]
            if standin is not None
            else []
        )
        group = standin.placement_groups.get(self.placement_group) if standin and self.placement_group else None
        location = next(where for _, name, where in catalog.DATACENTERS if name == self.datacenter)
        return {
            "id": self.id,
            "name": self.name,
            "status": self.phase or ("running" if self.machine.is_running else "off"),
            "created": self.created,
            "labels": dict(self.labels),
            "locked": False,
            "public_net": {
                "ipv4": {"id": self.id * 10, "ip": self.public_ipv4, "blocked": False, "dns_ptr": self.name}
                if self.public_ipv4
                else None,
                "ipv6": {"id": self.id * 10 + 1, "ip": self.public_ipv6, "blocked": False, "dns_ptr": []}
                if self.public_ipv6
                else None,
                "floating_ips": [],
                "firewalls": firewalls,
            },
            "private_net": [
                {
                    "network": self.network,
                    "ip": ip,
                    "alias_ips": [],
                    "mac_address": f"86:00:00:00:{n:02x}:{self.id % 256:02x}",
                }
                for n, ip in enumerate(self.private_ips)
            ]
            + [
                {
                    "network": network,
                    "ip": ip,
                    "alias_ips": [],
                    "mac_address": f"86:00:00:01:{network % 256:02x}:{self.id % 256:02x}",
                }
                for network, ip in sorted(self.attachments.items())
            ],
            "server_type": catalog.server_type_view(self.server_type),
            "datacenter": catalog.datacenter_view(self.datacenter),
            "image": catalog.image_view(self.image, standin.deprecated_images.get(self.image) if standin else None)
            if self.image
            else None,
            "iso": None,
            "rescue_enabled": False,
            "backup_window": None,
            "outgoing_traffic": 0,
            "ingoing_traffic": 0,
            "included_traffic": 21990232555520,
            "protection": dict(self.protection),
            "volumes": [],
            "load_balancers": [],
            "primary_disk_size": catalog.server_type_view(self.server_type)["disk"],
            "placement_group": group.view() if group is not None else None,
            "location": catalog.location_view(location),
        }


@dataclass
class StandinFirewall:
    id: int
    name: str
    applied: set[int] = field(default_factory=set)
    created: str = field(default_factory=_now)
    rules: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "labels": dict(self.labels),
            "created": self.created,
            "rules": [dict(rule) for rule in self.rules],
            "applied_to": [{"type": "server", "server": {"id": server}} for server in sorted(self.applied)],
        }


@dataclass
class StandinSubnet:
    type: str
    ip_range: str
    network_zone: str

    def view(self, gateway: str) -> dict[str, Any]:
        return {
            "type": self.type,
            "ip_range": self.ip_range,
            "network_zone": self.network_zone,
            "gateway": gateway,
            "vswitch_id": None,
        }


@dataclass
class StandinNetwork:
    id: int
    name: str
    ip_range: str
    labels: dict[str, str] = field(default_factory=dict)
    subnets: list[StandinSubnet] = field(default_factory=list)
    protection: dict[str, bool] = field(default_factory=lambda: {"delete": False})
    created: str = field(default_factory=_now)

    @property
    def gateway(self) -> str:
        """The network's own first address: Hetzner's router in every subnet of it."""
        return str(ipaddress.IPv4Network(self.ip_range).network_address + 1)

    def view(self, servers: list[int]) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "ip_range": self.ip_range,
            "subnets": [subnet.view(self.gateway) for subnet in self.subnets],
            "routes": [],
            "servers": servers,
            "load_balancers": [],
            "protection": dict(self.protection),
            "labels": dict(self.labels),
            "created": self.created,
            "expose_routes_to_vswitch": False,
        }


@dataclass
class StandinPlacementGroup:
    id: int
    name: str
    type: str = "spread"
    labels: dict[str, str] = field(default_factory=dict)
    servers: list[int] = field(default_factory=list)
    created: str = field(default_factory=_now)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "labels": dict(self.labels),
            "type": self.type,
            "created": self.created,
            "servers": list(self.servers),
        }


def md5_fingerprint(public_key: str) -> str:
    """Hetzner's fingerprint of an OpenSSH public key line: MD5 of the blob, colon-separated hex."""
    digest = hashlib.md5(base64.b64decode(public_key.split()[1]), usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


@dataclass
class StandinSshKey:
    id: int
    name: str
    public_key: str
    fingerprint: str
    labels: dict[str, str] = field(default_factory=dict)
    created: str = field(default_factory=_now)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "fingerprint": self.fingerprint,
            "public_key": self.public_key,
            "labels": dict(self.labels),
            "created": self.created,
        }


@dataclass
class StandinAction:
    id: int
    command: str
    server: int
    status: str = "running"
    progress: int = 0
    started: str = field(default_factory=_now)
    finished: str | None = None
    error: dict[str, str] | None = None
    resources: list[tuple[int, str]] | None = None  # (id, type); None: the server alone

    def view(self) -> dict[str, Any]:
        resources = self.resources if self.resources is not None else [(self.server, "server")]
        return {
            "id": self.id,
            "command": self.command,
            "status": self.status,
            "progress": self.progress,
            "started": self.started,
            "finished": self.finished,
            "resources": [{"id": id_, "type": kind} for id_, kind in resources],
            "error": self.error,
        }

    def succeed(self) -> None:
        self.progress, self.status, self.finished = 100, "success", _now()

    def fail(self, code: str, message: str) -> None:
        self.error, self.status, self.finished = {"code": code, "message": message}, "error", _now()


@dataclass
class _Bucket:
    """Hetzner's rate limit of one project: `limit` requests, one more every 3600/limit s."""

    limit: int
    remaining: float
    at: float

    def take(self) -> tuple[bool, dict[str, str]]:
        now = time.time()
        rate = self.limit / 3600.0
        self.remaining = min(float(self.limit), self.remaining + (now - self.at) * rate)
        self.at = now
        allowed = self.remaining >= 1
        if allowed:
            self.remaining -= 1
        reset = now + (self.limit - self.remaining) / rate
        return allowed, {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(math.floor(self.remaining)),
            "RateLimit-Reset": str(math.ceil(reset)),
        }


def _labels_match(labels: dict[str, str], selector: str) -> bool:
    """Hetzner's label selector: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, ANDed by commas."""
    terms = re.findall(r"[^,(]+(?:\([^)]*\))?", selector)
    for raw in terms:
        term = raw.strip()
        if not term:
            continue
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
            values = {v.strip() for v in m.group(3).split(",")}
            inside = labels.get(m.group(1)) in values
            if inside != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (part.strip() for part in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _page(key: str, items: list[dict[str, Any]], query: dict[str, list[str]]) -> dict[str, Any]:
    """One page of a list ("Pagination"): `page` (from 1) and `per_page` (default 25, at most
    50), and meta.pagination with page, per_page, previous_page, next_page, last_page, total_entries."""
    try:
        page = int(query.get("page", ["1"])[0])
        per_page = int(query.get("per_page", [str(PER_PAGE)])[0])
    except ValueError:
        raise _invalid("page", "must be an integer") from None
    if page < 1:
        raise _invalid("page", "must be at least 1")
    if per_page < 1:
        raise _invalid("per_page", "must be at least 1")
    per_page = min(per_page, MAX_PER_PAGE)
    last = max(1, math.ceil(len(items) / per_page))
    return {
        key: items[(page - 1) * per_page : page * per_page],
        "meta": {
            "pagination": {
                "page": page,
                "per_page": per_page,
                "previous_page": page - 1 if page > 1 else None,
                "next_page": page + 1 if page < last else None,
                "last_page": last,
                "total_entries": len(items),
            }
        },
    }


def _filtered(items: list[Any], query: dict[str, list[str]], *names: str) -> list[Any]:
    """Items whose attributes `names` equal the query's, and whose labels match `label_selector`."""
    found = [item for item in items if all(query.get(n) is None or str(getattr(item, n)) == query[n][0] for n in names)]
    selector = query.get("label_selector")
    if selector:
        found = [item for item in found if _labels_match(getattr(item, "labels", {}), selector[0])]
    return found


def _id_or_name(raw: Any, field_name: str, known: list[tuple[int, str]]) -> str:
    """The name of the catalogue entry `raw` (its id or its name) names, or invalid_input."""
    for id_, name in known:
        if raw == name or (str(raw).isdigit() and int(raw) == id_):
            return name
    raise _invalid(field_name, f"{field_name} {raw!r} not found")


class HcloudStandin:
    """The stand-in: `add_server` registers a lab host; `url` is what hcloud:endpoint takes;
    `boot` makes the machine of a server created through the API (lab/hcloud_servers.py boots a
    lab host; `switched_boot` a power switch alone)."""

    def __init__(
        self,
        token: str | None = None,
        *,
        boot: Boot | None = None,
        rate_limit: int = RATE_LIMIT,
        limits: dict[str, int] | None = None,
    ) -> None:
        self.token = token or secrets.token_hex(32)
        self.boot = boot
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        self.servers: dict[int, StandinServer] = {}
        self.actions: dict[int, StandinAction] = {}
        self.firewalls: dict[int, StandinFirewall] = {}
        self.ssh_keys: dict[int, StandinSshKey] = {}
        self.networks: dict[int, StandinNetwork] = {}
        self.placement_groups: dict[int, StandinPlacementGroup] = {}
        self.deprecated_images: dict[str, str] = {}
        # A test's own catalogue: "server_types" and/or "images" as lists of API objects (shaped as
        # lab/hcloud_catalog.py's views), served instead of lab/hcloud_catalog.py's.
        self.catalog: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every authenticated request
        self._bucket = _Bucket(rate_limit, float(rate_limit), time.time())
        self._ids = itertools.count(4711)
        self._action_ids = itertools.count(13)
        self._lock = threading.RLock()
        self._threads: list[threading.Thread] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        # A short poll: stop() (shutdown) waits for the serving loop's next poll (0.5 s by default).
        self._serving = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def start(self) -> HcloudStandin:
        self._serving.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        for thread in self._threads:
            thread.join(timeout=120)

    def add_server(
        self,
        name: str,
        machine: Machine,
        *,
        public_ipv4: str | None = None,
        private_ips: tuple[str, ...] | None = None,
        network: int = DEFAULT_NETWORK,
        labels: dict[str, str] | None = None,
    ) -> int:
        """Register `machine` as the Hetzner server `name`; its id. Its addresses are the lab
        host's own (`public_ip`, `private_ip`) unless given; its private ones are in the Hetzner
        network `network`."""
        if public_ipv4 is None:
            public_ipv4 = getattr(machine, "public_ip", None)
        if private_ips is None:
            private = getattr(machine, "private_ip", None)
            private_ips = (private,) if private else ()
        with self._lock:
            server = StandinServer(
                next(self._ids), name, machine, public_ipv4, private_ips, network, dict(labels or {})
            )
            self.servers[server.id] = server
            return server.id

    def add_firewall(self, name: str, servers: tuple[int, ...] = ()) -> int:
        """A cloud firewall `name` applied to `servers`; its id."""
        with self._lock:
            firewall = StandinFirewall(next(self._ids), name, set(servers))
            self.firewalls[firewall.id] = firewall
            return firewall.id

    def apply_firewall(self, firewall: int, server: int) -> None:
        self.firewalls[firewall].applied.add(server)

    def add_ssh_key(
        self, name: str, public_key: str, labels: dict[str, str] | None = None, fingerprint: str | None = None
    ) -> int:
        """A key the project holds (uploaded by hand, say); its id."""
        return self._create_ssh_key({"name": name, "public_key": public_key, "labels": labels or {}}, fingerprint).id

    def deprecate_image(self, name: str, when: str | None = None) -> None:
        """Mark image `name` deprecated (its `deprecated` timestamp), as Hetzner does before it removes one."""
        self.deprecated_images[name] = when or _now()

    def fail_actions(self, server: int, code: str, message: str) -> None:
        """Every later power action of `server` ends in `error` (`code`, `message`), the host untouched."""
        self.servers[server].failure = (code, message)

    def clear_failures(self, server: int) -> None:
        self.servers[server].failure = None

    def power_actions(self, server: int, command: str = "stop_server") -> list[StandinAction]:
        """The actions `command` of `server` started, in order."""
        return [a for a in self.actions.values() if a.server == server and a.command == command]

    # The API: lookups.

    def _server(self, raw: str) -> StandinServer:
        server = self.servers.get(int(raw)) if raw.isdigit() else None
        if server is None:
            raise ApiError(404, "not_found", f"server with ID '{raw}' not found")
        return server

    def _firewall(self, raw: str) -> StandinFirewall:
        firewall = self.firewalls.get(int(raw)) if raw.isdigit() else None
        if firewall is None:
            raise ApiError(404, "not_found", f"firewall with ID '{raw}' not found")
        return firewall

    def _network(self, raw: Any) -> StandinNetwork:
        network = self.networks.get(int(raw)) if str(raw).isdigit() else None
        if network is None:
            raise ApiError(404, "not_found", f"network with ID '{raw}' not found")
        return network

    def _placement_group(self, raw: Any) -> StandinPlacementGroup:
        group = self.placement_groups.get(int(raw)) if str(raw).isdigit() else None
        if group is None:
            raise ApiError(404, "not_found", f"placement group with ID '{raw}' not found")
        return group

    def _ssh_key(self, raw: str) -> StandinSshKey:
        key = self.ssh_keys.get(int(raw)) if raw.isdigit() else None
        if key is None:
            raise ApiError(404, "not_found", f"SSH key with ID '{raw}' not found")
        return key

    def _check_limit(self, kind: str, count: int) -> None:
        if count >= self.limits[kind]:
            raise ApiError(
                403, "resource_limit_exceeded", f"{kind.replace('_', ' ')} limit of {self.limits[kind]} exceeded"
            )

    @staticmethod
    def _unique(kind: str, name: str, items: Any, own: int | None = None) -> None:
        if any(item.name == name and item.id != own for item in items):
            raise ApiError(409, "uniqueness_error", f"{kind} name is already used")

    def _new_action(
        self, command: str, resources: list[tuple[int, str]], server: int = 0, *, done: bool = False
    ) -> StandinAction:
        action = StandinAction(next(self._action_ids), command, server, resources=resources)
        if done:
            action.succeed()
        self.actions[action.id] = action
        return action

    def _later(self, work: Callable[[], None]) -> None:
        thread = threading.Thread(target=work, daemon=True)
        self._threads.append(thread)
        thread.start()

    # Firewalls.

    @staticmethod
    def _rules(raw: Any) -> list[dict[str, Any]]:
        """Rules as "Firewalls: Create a Firewall" takes them: direction in/out, protocol tcp, udp,
        icmp, esp or gre, a port (or range) for tcp and udp only, source_ips for `in` and
        destination_ips for `out` (CIDRs), an optional description."""
        if not isinstance(raw, list):
            raise _invalid("rules", "must be a list")
        rules = []
        for rule in raw:
            direction, protocol, port = rule.get("direction"), rule.get("protocol"), rule.get("port")
            if direction not in ("in", "out"):
                raise _invalid("rules.direction", "must be in or out")
            if protocol not in ("tcp", "udp", "icmp", "esp", "gre"):
                raise _invalid("rules.protocol", "must be tcp, udp, icmp, esp or gre")
            if protocol in ("tcp", "udp") and not port:
                raise _invalid("rules.port", f"a {protocol} rule needs a port")
            if protocol not in ("tcp", "udp") and port:
                raise _invalid("rules.port", f"a {protocol} rule takes no port")
            if port and not re.fullmatch(r"any|\d{1,5}(-\d{1,5})?", str(port)):
                raise _invalid("rules.port", f"{port!r} is no port or port range")
            addresses = rule.get("source_ips" if direction == "in" else "destination_ips") or []
            if not addresses:
                raise _invalid(
                    "rules.source_ips" if direction == "in" else "rules.destination_ips", "must not be empty"
                )
            for address in addresses:
                try:
                    ipaddress.ip_network(address, strict=True)
                except ValueError:
                    raise _invalid("rules.source_ips", f"{address!r} is no network in CIDR notation") from None
            rules.append(
                {
                    "direction": direction,
                    "protocol": protocol,
                    "port": port if protocol in ("tcp", "udp") else None,
                    "source_ips": list(rule.get("source_ips") or []) if direction == "in" else [],
                    "destination_ips": list(rule.get("destination_ips") or []) if direction == "out" else [],
                    "description": rule.get("description"),
                }
            )
        return rules

    @staticmethod
    def _targets(body: dict[str, Any], key: str) -> list[int]:
        targets = []
        for item in body.get(key) or []:
            if item.get("type") != "server":
                raise _invalid(f"{key}.type", "the stand-in applies firewalls to servers only")
            targets.append(int((item.get("server") or {}).get("id") or 0))
        return targets

    def _apply_firewall(self, firewall: StandinFirewall, servers: list[int]) -> list[StandinAction]:
        """ "Firewall Actions: Apply to Resources": an unknown server is 404
        `firewall_resource_not_found`, one it is already applied to 422
        `firewall_already_applied`, one without a public address 422 `private_net_only_server`;
        nothing is applied unless all can be."""
        with self._lock:
            for server in servers:
                if server not in self.servers:
                    raise ApiError(
                        404,
                        "firewall_resource_not_found",
                        f"the resource the Firewall should be applied to was not found (server {server})",
                    )
                if server in firewall.applied:
                    raise ApiError(422, "firewall_already_applied", f"firewall already applied to server {server}")
                target = self.servers[server]
                if target.public_ipv4 is None and target.public_ipv6 is None:
                    raise ApiError(422, "private_net_only_server", f"server {server} has no public interface")
            actions = []
            for server in servers:
                firewall.applied.add(server)
                actions.append(
                    self._new_action(
                        "apply_firewall", [(firewall.id, "firewall"), (server, "server")], server, done=True
                    )
                )
        return actions

    def _remove_firewall(self, firewall: StandinFirewall, body: dict[str, Any]) -> list[StandinAction]:
        servers = [int(item["server"]["id"]) for item in body.get("remove_from", []) if item.get("type") == "server"]
        with self._lock:
            missing = [server for server in servers if server not in firewall.applied]
            if missing:
                raise ApiError(
                    404,
                    "firewall_resource_not_found",
                    f"the resource the Firewall should be removed from was not found (servers {missing})",
                )
            actions = []
            for server in servers:
                firewall.applied.discard(server)
                action = StandinAction(next(self._action_ids), "remove_firewall", server, "success", 100)
                action.finished = _now()
                self.actions[action.id] = action
                actions.append(action)
        return actions

    def _route_firewalls(
        self, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if len(parts) == 1 and method == "GET":
            found = _filtered(sorted(self.firewalls.values(), key=lambda f: f.id), query, "name")
            return 200, _page("firewalls", [f.view() for f in found], query)
        if len(parts) == 1 and method == "POST":
            name = str(body.get("name") or "")
            if not name:
                raise _invalid("name", "is required")
            rules = self._rules(body.get("rules") or [])
            targets = self._targets(body, "apply_to")
            with self._lock:
                self._unique("firewall", name, self.firewalls.values())
                self._check_limit("firewalls", len(self.firewalls))
                firewall = StandinFirewall(next(self._ids), name, rules=rules, labels=dict(body.get("labels") or {}))
                self.firewalls[firewall.id] = firewall
                try:
                    actions = self._apply_firewall(firewall, targets)
                except ApiError:
                    del self.firewalls[firewall.id]
                    raise
            return 201, {"firewall": firewall.view(), "actions": [a.view() for a in actions]}
        firewall = self._firewall(parts[1])
        if len(parts) == 2 and method == "GET":
            return 200, {"firewall": firewall.view()}
        if len(parts) == 2 and method == "PUT":
            with self._lock:
                if body.get("name"):
                    self._unique("firewall", body["name"], self.firewalls.values(), firewall.id)
                    firewall.name = body["name"]
                if body.get("labels") is not None:
                    firewall.labels = dict(body["labels"])
            return 200, {"firewall": firewall.view()}
        if len(parts) == 2 and method == "DELETE":
            with self._lock:
                if firewall.applied:
                    raise ApiError(422, "resource_in_use", "firewall must not be in use to be deleted")
                del self.firewalls[firewall.id]
            return 204, {}
        if len(parts) == 4 and parts[2] == "actions" and method == "POST":
            if parts[3] == "remove_from_resources":
                return 201, {"actions": [a.view() for a in self._remove_firewall(firewall, body)]}
            if parts[3] == "apply_to_resources":
                return 201, {
                    "actions": [a.view() for a in self._apply_firewall(firewall, self._targets(body, "apply_to"))]
                }
            if parts[3] == "set_rules":
                rules = self._rules(body.get("rules") or [])
                with self._lock:
                    firewall.rules = rules
                    actions = [self._new_action("set_firewall_rules", [(firewall.id, "firewall")], done=True)]
                    actions += [
                        self._new_action("apply_firewall", [(firewall.id, "firewall"), (s, "server")], s, done=True)
                        for s in sorted(firewall.applied)
                    ]
                return 201, {"actions": [a.view() for a in actions]}
        raise ApiError(404, "not_found", "not found")

    # SSH keys.

    def _create_ssh_key(self, body: dict[str, Any], fingerprint: str | None = None) -> StandinSshKey:
        name, public_key = str(body.get("name") or ""), str(body.get("public_key") or "")
        try:
            fingerprint = fingerprint or md5_fingerprint(public_key)
        except (IndexError, ValueError):
            raise ApiError(400, "invalid_input", "invalid input in field 'public_key'") from None
        with self._lock:
            if any(key.fingerprint == fingerprint for key in self.ssh_keys.values()):
                raise ApiError(409, "uniqueness_error", "SSH key with the same fingerprint already exists")
            if any(key.name == name for key in self.ssh_keys.values()):
                raise ApiError(409, "uniqueness_error", "SSH key name is already used")
            self._check_limit("ssh_keys", len(self.ssh_keys))
            key = StandinSshKey(next(self._ids), name, public_key, fingerprint, dict(body.get("labels") or {}))
            self.ssh_keys[key.id] = key
            return key

    def _route_ssh_keys(
        self, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        if method == "GET" and len(parts) == 1:
            found = _filtered(sorted(self.ssh_keys.values(), key=lambda k: k.id), query, "fingerprint", "name")
            return 200, _page("ssh_keys", [key.view() for key in found], query)
        if method == "POST" and len(parts) == 1:
            return 201, {"ssh_key": self._create_ssh_key(body or {}).view()}
        if len(parts) == 2:
            key = self._ssh_key(parts[1])
            if method == "GET":
                return 200, {"ssh_key": key.view()}
            if method == "PUT":
                with self._lock:
                    name = (body or {}).get("name")
                    if name and any(k.name == name and k.id != key.id for k in self.ssh_keys.values()):
                        raise ApiError(409, "uniqueness_error", "SSH key name is already used")
                    key.name = name or key.name
                    if (body or {}).get("labels") is not None:
                        key.labels = dict(body["labels"])  # type: ignore[index]
                return 200, {"ssh_key": key.view()}
            if method == "DELETE":
                with self._lock:
                    self.ssh_keys.pop(key.id, None)
                return 204, {}
        raise ApiError(404, "not_found", "not found")

    # Networks.

    def _network_servers(self, network: StandinNetwork) -> list[int]:
        return sorted(s.id for s in self.servers.values() if network.id in s.attachments)

    def _route_networks(
        self, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if len(parts) == 1 and method == "GET":
            found = _filtered(sorted(self.networks.values(), key=lambda n: n.id), query, "name")
            return 200, _page("networks", [n.view(self._network_servers(n)) for n in found], query)
        if len(parts) == 1 and method == "POST":
            name, ip_range = str(body.get("name") or ""), str(body.get("ip_range") or "")
            if not name:
                raise _invalid("name", "is required")
            network_range = self._private_range(ip_range, "ip_range")
            if not 8 <= network_range.prefixlen <= 24:
                raise _invalid("ip_range", "must be a network between /8 and /24")
            with self._lock:
                self._unique("network", name, self.networks.values())
                self._check_limit("networks", len(self.networks))
                network = StandinNetwork(next(self._ids), name, str(network_range), dict(body.get("labels") or {}))
                for subnet in body.get("subnets") or []:
                    network.subnets.append(self._subnet(network, subnet))
                self.networks[network.id] = network
            return 201, {"network": network.view([])}
        network = self._network(parts[1])
        if len(parts) == 2 and method == "GET":
            return 200, {"network": network.view(self._network_servers(network))}
        if len(parts) == 2 and method == "PUT":
            with self._lock:
                if body.get("name"):
                    self._unique("network", body["name"], self.networks.values(), network.id)
                    network.name = body["name"]
                if body.get("labels") is not None:
                    network.labels = dict(body["labels"])
            return 200, {"network": network.view(self._network_servers(network))}
        if len(parts) == 2 and method == "DELETE":
            # "Delete a Network": refused while protected; attached servers are detached.
            with self._lock:
                if network.protection["delete"]:
                    raise ApiError(403, "protected", f"network {network.id} is delete protected")
                detached = [s for s in self.servers.values() if network.id in s.attachments]
                for server in detached:
                    ip = server.attachments.pop(network.id)
                    detach = getattr(server.machine, "detach_network", None)
                    if detach is not None:
                        detach(ip)
                del self.networks[network.id]
            return 204, {}
        if len(parts) == 4 and parts[2] == "actions" and method == "POST":
            with self._lock:
                if parts[3] == "add_subnet":
                    subnet = self._subnet(network, body)
                    network.subnets.append(subnet)
                    return 201, {"action": self._new_action("add_subnet", [(network.id, "network")], done=True).view()}
                if parts[3] == "delete_subnet":
                    wanted = str(body.get("ip_range") or "")
                    subnet = next((s for s in network.subnets if s.ip_range == wanted), None)
                    if subnet is None:
                        raise _invalid("ip_range", f"network {network.id} has no subnet {wanted}")
                    inside = ipaddress.IPv4Network(subnet.ip_range)
                    users = [
                        s.id
                        for s in self.servers.values()
                        if network.id in s.attachments and ipaddress.IPv4Address(s.attachments[network.id]) in inside
                    ]
                    if users:
                        # "Subnets containing attached resources can not be deleted, they must be detached beforehand."
                        raise ApiError(422, "resource_in_use", f"subnet {wanted} has attached servers {users}")
                    network.subnets.remove(subnet)
                    return 201, {
                        "action": self._new_action("delete_subnet", [(network.id, "network")], done=True).view()
                    }
                if parts[3] == "change_protection":
                    if "delete" in body:
                        network.protection["delete"] = bool(body["delete"])
                    return 201, {
                        "action": self._new_action("change_protection", [(network.id, "network")], done=True).view()
                    }
        raise ApiError(404, "not_found", "not found")

    @staticmethod
    def _private_range(raw: str, field_name: str) -> ipaddress.IPv4Network:
        try:
            network = ipaddress.IPv4Network(raw, strict=True)
        except ValueError:
            raise _invalid(field_name, f"{raw!r} is no network in CIDR notation") from None
        if not any(network.subnet_of(private) for private in _PRIVATE_RANGES):
            raise _invalid(field_name, f"{raw} is not in a private range (RFC 1918)")
        return network

    def _subnet(self, network: StandinNetwork, body: dict[str, Any]) -> StandinSubnet:
        """A subnet as "Add a subnet to a Network" takes it: type cloud/server/vswitch, a network
        zone, and a range inside the network's that overlaps no other subnet of it."""
        kind, zone = body.get("type"), body.get("network_zone")
        if kind not in ("cloud", "server", "vswitch"):
            raise _invalid("type", "must be cloud, server or vswitch")
        if zone not in {z for *_, z in catalog.LOCATIONS} | {"us-east", "us-west", "ap-southeast"}:
            raise _invalid("network_zone", f"unknown network zone {zone!r}")
        subnet = self._private_range(str(body.get("ip_range") or ""), "ip_range")
        if not subnet.subnet_of(ipaddress.IPv4Network(network.ip_range)):
            raise _invalid("ip_range", f"{subnet} is not inside the network's {network.ip_range}")
        if any(subnet.overlaps(ipaddress.IPv4Network(other.ip_range)) for other in network.subnets):
            raise _invalid("ip_range", f"{subnet} overlaps another subnet of the network")
        return StandinSubnet(str(kind), str(subnet), str(zone))

    # Placement groups.

    def _route_placement_groups(
        self, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if len(parts) == 1 and method == "GET":
            found = _filtered(sorted(self.placement_groups.values(), key=lambda g: g.id), query, "name", "type")
            return 200, _page("placement_groups", [g.view() for g in found], query)
        if len(parts) == 1 and method == "POST":
            name = str(body.get("name") or "")
            if not name:
                raise _invalid("name", "is required")
            if body.get("type") != "spread":
                raise _invalid("type", "must be spread")
            with self._lock:
                self._unique("placement group", name, self.placement_groups.values())
                self._check_limit("placement_groups", len(self.placement_groups))
                group = StandinPlacementGroup(next(self._ids), name, labels=dict(body.get("labels") or {}))
                self.placement_groups[group.id] = group
            return 201, {"placement_group": group.view(), "action": None}
        group = self._placement_group(parts[1])
        if len(parts) == 2 and method == "GET":
            return 200, {"placement_group": group.view()}
        if len(parts) == 2 and method == "PUT":
            with self._lock:
                if body.get("name"):
                    self._unique("placement group", body["name"], self.placement_groups.values(), group.id)
                    group.name = body["name"]
                if body.get("labels") is not None:
                    group.labels = dict(body["labels"])
            return 200, {"placement_group": group.view()}
        if len(parts) == 2 and method == "DELETE":
            with self._lock:
                for server in group.servers:
                    self.servers[server].placement_group = None
                del self.placement_groups[group.id]
            return 204, {}
        raise ApiError(404, "not_found", "not found")

    def _join_group(self, server: StandinServer, group: StandinPlacementGroup) -> None:
        """A server into a spread group: at most PLACEMENT_GROUP_SERVERS of them, else 422 `placement_error`."""
        if len(group.servers) >= PLACEMENT_GROUP_SERVERS:
            raise ApiError(
                422,
                "placement_error",
                f"placement group {group.id} already holds {PLACEMENT_GROUP_SERVERS} servers (a spread group's limit)",
            )
        group.servers.append(server.id)
        server.placement_group = group.id

    # Servers.

    def _create_server(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """ "Servers: Create a Server"."""
        name = str(body.get("name") or "")
        if not _HOSTNAME.match(name):
            raise _invalid("name", "must be a valid hostname")
        server_type = _id_or_name(body.get("server_type"), "server_type", [(t[0], t[1]) for t in catalog.SERVER_TYPES])
        image = _id_or_name(body.get("image"), "image", [(i[0], i[1]) for i in catalog.IMAGES])
        if body.get("location") is not None and body.get("datacenter") is not None:
            raise _invalid("location", "give location or datacenter, not both")
        if body.get("datacenter") is not None:
            datacenter = _id_or_name(body["datacenter"], "datacenter", [(d[0], d[1]) for d in catalog.DATACENTERS])
        else:
            location = _id_or_name(
                body.get("location") or "fsn1", "location", [(loc[0], loc[1]) for loc in catalog.LOCATIONS]
            )
            datacenter = catalog.datacenter_of(location)
        if len(str(body.get("user_data") or "").encode()) > USER_DATA_BYTES:
            raise _invalid("user_data", f"is longer than {USER_DATA_BYTES} bytes")
        public_net = body.get("public_net") or {}
        ipv4, ipv6 = public_net.get("enable_ipv4", True), public_net.get("enable_ipv6", True)
        with self._lock:
            keys = []
            for raw in body.get("ssh_keys") or []:
                key = next((k for k in self.ssh_keys.values() if str(raw) in (str(k.id), k.name)), None)
                if key is None:
                    raise _invalid("ssh_keys", f"SSH key {raw!r} not found")
                keys.append(key)
            networks = [self._network(raw) for raw in body.get("networks") or []]
            firewalls = [self._firewall(str((item or {}).get("firewall"))) for item in body.get("firewalls") or []]
            group = self._placement_group(body["placement_group"]) if body.get("placement_group") else None
            if not ipv4 and not ipv6 and not networks:
                raise _invalid("public_net", "a server without a public address needs a network")
            self._unique("server", name, self.servers.values())
            self._check_limit("servers", len(self.servers))
            if self.boot is None:
                raise ApiError(503, "resource_unavailable", "this stand-in boots no machines (HcloudStandin(boot=...))")
            server_id = next(self._ids)
            server = StandinServer(
                server_id,
                name,
                _Unbooted(),
                labels=dict(body.get("labels") or {}),
                server_type=server_type,
                image=image,
                datacenter=datacenter,
                phase="initializing",
                busy=True,
            )
            if group is not None:
                self._join_group(server, group)
            server.request = ServerRequest(
                server_id,
                name,
                catalog.image_view(image),
                body.get("user_data"),
                tuple(k.public_key for k in keys),
                bool(ipv4),
            )
            self.servers[server.id] = server
            create = self._new_action("create_server", [(server.id, "server")], server.id)
            start = body.get("start_after_create", True)
            following = [self._new_action("start_server", [(server.id, "server")], server.id)] if start else []
            answer = {
                "server": server.view(self),
                "action": create.view(),
                "next_actions": [a.view() for a in following],
                # Hetzner mails a root password for a server created without an SSH key.
                "root_password": None if keys else secrets.token_urlsafe(12),
            }
        self._later(lambda: self._boot(server, create, following, networks, firewalls, ipv6=bool(ipv6), start=start))
        return 201, answer

    def _boot(
        self,
        server: StandinServer,
        create: StandinAction,
        following: list[StandinAction],
        networks: list[StandinNetwork],
        firewalls: list[StandinFirewall],
        *,
        ipv6: bool,
        start: bool = True,
    ) -> None:
        """The create action: the machine booted (`boot`), its networks attached and its
        firewalls applied, then `success`; a boot that fails ends the actions in `error`."""
        assert self.boot is not None and server.request is not None
        time.sleep(ACTION_SECONDS)
        try:
            machine = self.boot(server.request)
            server.machine = machine
            server.public_ipv4 = getattr(machine, "public_ip", None) if server.request.ipv4 else None
            server.public_ipv6 = f"2001:db8:{server.id % 65536:x}::/64" if ipv6 else None
            for network in networks:
                self._attach(server, network, None)
            with self._lock:
                for firewall in firewalls:
                    firewall.applied.add(server.id)
            if not start:
                machine.power_off()
            create.succeed()
            for action in following:
                action.succeed()
        except Exception as error:  # a boot that could not boot ends in error, as Hetzner's would
            create.fail("action_failed", f"the server could not be created: {error}")
            for action in following:
                action.fail("action_failed", "the server was not created")
        finally:
            server.phase, server.busy = None, False

    def _free_ip(
        self, network: StandinNetwork, server: StandinServer, wanted: str | None, ip_range: str | None = None
    ) -> str:
        """The address a server gets in `network`: `wanted` if free and in a subnet of the
        server's network zone, else the first free one of the subnet `ip_range` or, without
        one, of the last subnet created (terraform-provider-hcloud's hcloud_server_network: "If
        subnet_id or ip are not provided, the Server will be assigned an IP in the last created
        subnet"). The network's first address (its gateway) is never given out."""
        zone = catalog.location_view(catalog.datacenter_view(server.datacenter)["location"]["name"])["network_zone"]
        subnets = [s for s in network.subnets if s.type in ("cloud", "server") and s.network_zone == zone]
        if ip_range is not None:
            subnets = [s for s in subnets if s.ip_range == ip_range]
            if not any(s.ip_range == ip_range for s in network.subnets):
                raise _invalid("ip_range", f"network {network.id} has no subnet {ip_range}")
        if not subnets:
            raise ApiError(422, "no_subnet_available", f"network {network.id} has no subnet in network zone {zone}")
        used = {s.attachments[network.id] for s in self.servers.values() if network.id in s.attachments}
        used.add(network.gateway)
        if wanted is not None:
            if (
                not any(ipaddress.IPv4Address(wanted) in ipaddress.IPv4Network(s.ip_range) for s in subnets)
                or wanted in used
            ):
                raise ApiError(422, "ip_not_available", f"IP {wanted} is not available in network {network.id}")
            return wanted
        for address in ipaddress.IPv4Network(subnets[-1].ip_range).hosts():
            if str(address) not in used:
                return str(address)
        raise ApiError(422, "no_subnet_available", f"subnet {subnets[-1].ip_range} has no free address")

    def _attach(self, server: StandinServer, network: StandinNetwork, wanted: str | None) -> None:
        with self._lock:
            ip = self._free_ip(network, server, wanted)
            server.attachments[network.id] = ip
        attach = getattr(server.machine, "attach_network", None)
        if attach is not None:
            attach(ip, network.ip_range)

    def _route_servers(
        self, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        if method == "GET" and len(parts) == 1:
            found = _filtered(sorted(self.servers.values(), key=lambda s: s.id), query, "name")
            statuses = query.get("status")
            views = [s.view(self) for s in found]
            if statuses:
                views = [v for v in views if v["status"] in statuses]
            return 200, _page("servers", views, query)
        if method == "POST" and len(parts) == 1:
            return self._create_server(body)
        server = self._server(parts[1])
        if method == "GET" and len(parts) == 2:
            return 200, {"server": server.view(self)}
        if method == "PUT" and len(parts) == 2:
            with self._lock:
                if body.get("name"):
                    if not _HOSTNAME.match(body["name"]):
                        raise _invalid("name", "must be a valid hostname")
                    self._unique("server", body["name"], self.servers.values(), server.id)
                    server.name = body["name"]
                if body.get("labels") is not None:
                    server.labels = dict(body["labels"])
            return 200, {"server": server.view(self)}
        if method == "DELETE" and len(parts) == 2:
            return 200, {"action": self._delete_server(server).view()}
        if method == "POST" and len(parts) == 4 and parts[2] == "actions":
            return self._server_action(server, parts[3], body)
        raise ApiError(404, "not_found", "not found")

    def _delete_server(self, server: StandinServer) -> StandinAction:
        """ "Delete a Server": refused 403 `protected` while its delete protection is on; else the
        machine is removed (a lab host goes), the server leaves its firewalls, networks and
        placement group, and is gone once the action ends."""
        with self._lock:
            if server.protection["delete"]:
                raise ApiError(403, "protected", f"server {server.id} is delete protected")
            if server.phase == "deleting":
                raise ApiError(423, "locked", f"server {server.id} is being deleted")
            server.phase, server.busy = "deleting", True
            action = self._new_action("delete_server", [(server.id, "server")], server.id)

        def delete() -> None:
            time.sleep(ACTION_SECONDS)
            try:
                remove = getattr(server.machine, "remove", None)
                (remove or server.machine.power_off)()
                with self._lock:
                    for firewall in self.firewalls.values():
                        firewall.applied.discard(server.id)
                    for group in self.placement_groups.values():
                        if server.id in group.servers:
                            group.servers.remove(server.id)
                    self.servers.pop(server.id, None)
                action.succeed()
            except Exception as error:
                server.phase, server.busy = None, False
                action.fail("action_failed", f"the server could not be deleted: {error}")

        self._later(delete)
        return action

    def _server_action(self, server: StandinServer, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        power = {"poweroff": "stop_server", "poweron": "start_server"}.get(name)
        if power is not None:
            return 201, {"action": self._start_action(server, power).view()}
        with self._lock:
            if name == "change_protection":
                # Hetzner: a server's delete and rebuild protection must be equal.
                changes: dict[str, bool] = {k: bool(body[k]) for k in ("delete", "rebuild") if k in body}
                wanted = {**server.protection, **changes}
                if wanted["delete"] != wanted["rebuild"]:
                    raise _invalid("delete", "delete and rebuild protection must have the same value")
                server.protection = wanted
                return 201, {
                    "action": self._new_action(
                        "change_protection", [(server.id, "server")], server.id, done=True
                    ).view()
                }
            if name == "rebuild":
                if server.protection["rebuild"]:
                    raise ApiError(403, "protected", f"server {server.id} is rebuild protected")
                return 201, {"action": self._rebuild(server, body).view(), "root_password": None}
            if name == "attach_to_network":
                network = self._network(body.get("network"))
                if network.id in server.attachments:
                    raise ApiError(
                        422,
                        "server_already_attached",
                        f"server {server.id} is already attached to network {network.id}",
                    )
                if server.busy:
                    raise ApiError(423, "locked", f"server {server.id} is locked by a running action")
                server.busy = True
                action = self._new_action(
                    "attach_to_network", [(server.id, "server"), (network.id, "network")], server.id
                )
                try:
                    ip = self._free_ip(network, server, body.get("ip"), body.get("ip_range"))
                except ApiError:
                    server.busy = False
                    del self.actions[action.id]
                    raise
                server.attachments[network.id] = ip  # reserved; the host gets it when the action runs
                self._later(lambda: self._network_action(server, action, network, ip, attach=True))
                return 201, {"action": action.view()}
            if name == "detach_from_network":
                network = self._network(body.get("network"))
                if network.id not in server.attachments:
                    raise ApiError(
                        422,
                        "server_not_attached_to_network",
                        f"server {server.id} is not attached to network {network.id}",
                    )
                if server.busy:
                    raise ApiError(423, "locked", f"server {server.id} is locked by a running action")
                server.busy = True
                action = self._new_action(
                    "detach_from_network", [(server.id, "server"), (network.id, "network")], server.id
                )
                ip = server.attachments[network.id]
                self._later(lambda: self._network_action(server, action, network, ip, attach=False))
                return 201, {"action": action.view()}
            if name == "add_to_placement_group":
                group = self._placement_group(body.get("placement_group"))
                if server.placement_group is not None:
                    raise ApiError(
                        422,
                        "already_in_placement_group",
                        f"server {server.id} is already in placement group {server.placement_group}",
                    )
                if server.machine.is_running:
                    raise ApiError(422, "server_not_stopped", f"server {server.id} must be powered off")
                self._join_group(server, group)
                return 201, {
                    "action": self._new_action(
                        "add_to_placement_group",
                        [(server.id, "server"), (group.id, "placement_group")],
                        server.id,
                        done=True,
                    ).view()
                }
            if name == "remove_from_placement_group":
                if server.placement_group is None:
                    raise ApiError(422, "server_not_in_placement_group", f"server {server.id} is in no placement group")
                group = self.placement_groups[server.placement_group]
                group.servers.remove(server.id)
                server.placement_group = None
                return 201, {
                    "action": self._new_action(
                        "remove_from_placement_group",
                        [(server.id, "server"), (group.id, "placement_group")],
                        server.id,
                        done=True,
                    ).view()
                }
        raise ApiError(404, "not_found", "not found")

    def _network_action(
        self, server: StandinServer, action: StandinAction, network: StandinNetwork, ip: str, *, attach: bool
    ) -> None:
        time.sleep(ACTION_SECONDS)
        try:
            if attach:
                hook = getattr(server.machine, "attach_network", None)
                if hook is not None:
                    hook(ip, network.ip_range)
            else:
                hook = getattr(server.machine, "detach_network", None)
                if hook is not None:
                    hook(ip)
                with self._lock:
                    server.attachments.pop(network.id, None)
            action.succeed()
        except Exception as error:
            if attach:
                with self._lock:
                    server.attachments.pop(network.id, None)
            action.fail("action_failed", str(error))
        finally:
            server.busy = False

    def _rebuild(self, server: StandinServer, body: dict[str, Any]) -> StandinAction:
        """ "Rebuild a Server from an Image": the machine removed and booted again from `image`
        with the user data it was created with."""
        if server.request is None or self.boot is None:
            raise ApiError(422, "unsupported_error", f"server {server.id} was registered, not created: no rebuild")
        image = _id_or_name(body.get("image"), "image", [(i[0], i[1]) for i in catalog.IMAGES])
        if server.busy:
            raise ApiError(423, "locked", f"server {server.id} is locked by a running action")
        server.busy, server.phase = True, "rebuilding"
        action = self._new_action("rebuild_server", [(server.id, "server")], server.id)
        request = ServerRequest(
            server.id,
            server.name,
            catalog.image_view(image),
            server.request.user_data,
            server.request.public_keys,
            server.request.ipv4,
        )

        def rebuild() -> None:
            try:
                remove = getattr(server.machine, "remove", None)
                (remove or server.machine.power_off)()
                server.request, server.image = request, image
                assert self.boot is not None
                server.machine = self.boot(request)
                for network_id, ip in server.attachments.items():
                    hook = getattr(server.machine, "attach_network", None)
                    if hook is not None:
                        hook(ip, self.networks[network_id].ip_range)
                action.succeed()
            except Exception as error:
                action.fail("action_failed", f"the server could not be rebuilt: {error}")
            finally:
                server.busy, server.phase = False, None

        self._later(rebuild)
        return action

    # Catalogue.

    def _route_catalog(self, parts: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        kind = parts[0]
        if kind == "images":
            entries = [(i[0], i[1], catalog.image_view(i[1], self.deprecated_images.get(i[1]))) for i in catalog.IMAGES]
            if "images" in self.catalog:
                entries = [(i["id"], i["name"], i) for i in self.catalog["images"]]
            if len(parts) == 1:
                # "List Images": deprecated images only with include_deprecated=true.
                include = query.get("include_deprecated", ["false"])[0].lower() == "true"
                entries = [e for e in entries if include or e[2]["deprecated"] is None]
                for key in ("name", "type", "architecture", "status"):
                    if key in query:
                        entries = [e for e in entries if str(e[2][key]) in query[key]]
        else:
            views: dict[str, tuple[list[tuple[int, str]], Callable[[str], dict[str, Any]]]] = {
                "server_types": ([(t[0], t[1]) for t in catalog.SERVER_TYPES], catalog.server_type_view),
                "locations": ([(loc[0], loc[1]) for loc in catalog.LOCATIONS], catalog.location_view),
                "datacenters": ([(d[0], d[1]) for d in catalog.DATACENTERS], catalog.datacenter_view),
            }
            known, view = views[kind]
            entries = [(id_, name, view(name)) for id_, name in known]
            if kind in self.catalog:
                entries = [(item["id"], item["name"], item) for item in self.catalog[kind]]
            if len(parts) == 1 and "name" in query:
                entries = [e for e in entries if e[1] == query["name"][0]]
        if len(parts) == 1:
            return 200, _page(kind, [e[2] for e in entries], query)
        found = next((e[2] for e in entries if str(e[0]) == parts[1]), None)
        if len(parts) != 2 or found is None:
            raise ApiError(404, "not_found", f"{kind[:-1].replace('_', ' ')} with ID '{parts[1]}' not found")
        return 200, {kind[:-1] if kind != "images" else "image": found}

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        parts = [part for part in path.split("/") if part]
        if parts[:1] != ["v1"]:
            raise ApiError(404, "not_found", "not found")
        parts = parts[1:]
        body = body or {}
        if parts[:1] == ["ssh_keys"]:
            return self._route_ssh_keys(method, parts, query, body)
        if parts[:1] == ["firewalls"]:
            return self._route_firewalls(method, parts, query, body)
        if parts[:1] == ["networks"]:
            return self._route_networks(method, parts, query, body)
        if parts[:1] == ["placement_groups"]:
            return self._route_placement_groups(method, parts, query, body)
        if parts[:1] == ["servers"]:
            return self._route_servers(method, parts, query, body)
        if (
            method == "GET"
            and parts[:1] in (["images"], ["server_types"], ["locations"], ["datacenters"])
            and len(parts) <= 2
        ):
            return self._route_catalog(parts, query)
        if method == "GET" and parts == ["actions"] and query.get("id"):
            ids = [int(raw) for raw in query["id"] if raw.isdigit()]
            found = [self.actions[i].view() for i in ids if i in self.actions]
            return 200, _page("actions", found, query)
        if method == "GET" and len(parts) == 2 and parts[0] == "actions" and parts[1].isdigit():
            action = self.actions.get(int(parts[1]))
            if action is None:
                raise ApiError(404, "not_found", f"action with ID '{parts[1]}' not found")
            return 200, {"action": action.view()}
        raise ApiError(404, "not_found", "not found")

    def _start_action(self, server: StandinServer, command: str) -> StandinAction:
        with self._lock:
            if server.busy:
                raise ApiError(423, "locked", f"server {server.id} is locked by a running action")
            server.busy = True
            action = StandinAction(next(self._action_ids), command, server.id)
            self.actions[action.id] = action
        self._later(lambda: self._run_action(server, action))
        return action

    def _run_action(self, server: StandinServer, action: StandinAction) -> None:
        time.sleep(ACTION_SECONDS)
        try:
            if server.failure is not None:
                code, message = server.failure
                action.error, action.status = {"code": code, "message": message}, "error"
                return
            if action.command == "stop_server":
                server.machine.power_off()
            else:
                server.machine.power_on()
            action.progress, action.status = 100, "success"
        except Exception as error:  # an action that could not act ends in error, as Hetzner's would
            action.error, action.status = {"code": "action_failed", "message": str(error)}, "error"
        finally:
            action.finished = _now()
            server.busy = False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str, raw: bytes | None = None) -> None:
                split = urlsplit(self.path)
                headers: dict[str, str] = {}
                try:
                    if self.headers.get("Authorization") != f"Bearer {standin.token}":
                        raise ApiError(401, "unauthorized", "unable to authenticate")
                    with standin._lock:
                        allowed, headers = standin._bucket.take()
                    if not allowed:
                        raise ApiError(429, "rate_limit_exceeded", "limit of requests per hour reached")
                    standin.requests.append((method, split.path))
                    try:
                        sent = json.loads(raw) if raw and raw.strip() else None
                    except ValueError:
                        raise ApiError(400, "json_error", "the request body is no valid JSON") from None
                    if sent is not None and not isinstance(sent, dict):
                        raise ApiError(400, "json_error", "the request body must be a JSON object")
                    status, body = standin._route(method, split.path, parse_qs(split.query), sent)
                except ApiError as error:
                    status = error.status
                    body = {"error": {"code": error.code, "message": error.message, "details": error.details}}
                data = json.dumps(body).encode() if status != 204 else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST", self._body())

            def do_PUT(self) -> None:
                self._serve("PUT", self._body())

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


@contextmanager
def running_standin(token: str | None = None, *, boot: Boot | None = None) -> Iterator[HcloudStandin]:
    """A started stand-in, stopped on the way out."""
    standin = HcloudStandin(token, boot=boot).start()
    try:
        yield standin
    finally:
        standin.stop()
