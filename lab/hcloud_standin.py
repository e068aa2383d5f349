"""A stand-in of the Hetzner Cloud API for the lab: an HTTP server on this machine that serves
only the calls the program's client (remote_access/hetzner_api.py, through Hetzner's `hcloud`
library) makes, for lab hosts registered as Hetzner servers. LAB ONLY: the product never
imports it; it reaches it through hcloud:endpoint as it would reach Hetzner.

What it serves, each as Hetzner's API reference (docs.hetzner.cloud) describes it:
- Authentication ("Authentication"): every request needs `Authorization: Bearer <token>`; a
  missing or wrong token is answered 401 `{"error": {"code": "unauthorized", "message":
  "unable to authenticate", "details": {}}}`.
- Errors ("Errors"): `{"error": {"code", "message", "details"}}` with the HTTP status of the
  code: `not_found` 404 (an unknown server, action or path), `locked` 423 (an action while the
  server's previous one still runs), `unauthorized` 401.
- GET /servers/{id} ("Servers: Get a Server"): `{"server": {...}}` with id, name, status,
  created, labels (those `add_server` is given), locked, `public_net` (`ipv4`: id, ip, blocked,
  dns_ptr; `ipv6` null; `floating_ips` and `firewalls` empty) and `private_net` (per network:
  `network`, the network's id, `ip`, `alias_ips`, `mac_address`), the addresses the lab host
  really has (its public address, or none behind a NAT, and its private one), or those
  `add_server` is given. A private address is unique only within its network: the reference says
  `private_net[].network` is "The Network ID the server is attached to" and `ip` "The server IP
  address on the network"; every project's networks may use the same range (10.0.0.0/16 is the
  Console's default), so servers in two networks may report the same `ip`. The stand-in reports
  each server's own network id (`add_server`'s `network`; default `DEFAULT_NETWORK`). The status is the host's power,
  read when asked: `running` while the lab host runs, `off` once it is powered off (never `off`
  before it really is).
- GET /servers?name=NAME ("Servers: List Servers", `name` filter, exact match): `{"servers":
  [...], "meta": {"pagination": {...}}}` (one page).
- POST /servers/{id}/actions/poweroff and .../poweron ("Server Actions: Power off / Power on a
  Server"): 201 `{"action": {...}}` with command `stop_server` / `start_server`, status
  `running`, progress 0. The action runs on its own thread: after ACTION_SECONDS it powers the
  lab host off (Host.power_off: the host's init killed, like pulling the cord) or on
  (Host.power_on), then ends `success` (progress 100, `finished` set).
- GET /actions/{id} ("Actions: Get an Action"): `{"action": {...}}`, status `running`, then
  `success` or `error` with `error: {"code", "message"}`.
- GET /firewalls/{id} ("Firewalls: Get a Firewall"): `{"firewall": {...}}` with id, name, labels,
  created, `rules` (empty: the stand-in keeps none) and `applied_to` (`{"type": "server", "server":
  {"id"}}` per server `add_firewall` or `apply_firewall` put in it).
- POST /firewalls/{id}/actions/remove_from_resources ("Firewall Actions: Remove from Resources"),
  body `{"remove_from": [{"type": "server", "server": {"id"}}]}`: 201 `{"actions": [...]}`, one
  `remove_firewall` action per server, finished `success` at once. A server the firewall is not
  applied to (or no server at all) is answered 404 `firewall_resource_not_found` ("The resource
  the Firewall should be removed from was not found", the call's error table in Hetzner's API
  reference), and nothing is removed. `firewall_already_removed` is never answered: hcloud-go
  (hcloud/error.go) marks it "not used by the API anymore" since Hetzner's changelog of
  2025-08-04 ("multiple API behavior changes for firewalls"), and terraform-provider-hcloud
  (internal/firewall/resource.go, removeFromResources) takes `firewall_resource_not_found` as
  "nothing left to remove".
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

What it does not model: every other endpoint (404), SSH keys' label selectors, `shutdown`, `reset` and `reboot`, the
rate limit (no RateLimit-* headers, never a 429), pagination beyond one page, a server's
other fields (type, image, datacenter), IPv6, label selectors, the networks themselves (GET /networks),
`protection`, the `deprecation` of API calls, and TLS (it serves plain HTTP on 127.0.0.1).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

# How long an action stays `running` before it acts (Hetzner's power actions take seconds).
ACTION_SECONDS = 1.0
# The id of the network a server's private addresses are in, unless `add_server` names another.
DEFAULT_NETWORK = 1


class Machine(Protocol):
    """What the stand-in powers: a lab host (lab.hosts.Host) or anything with the same calls."""

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

    def power_off(self) -> None:
        if not self.stuck:
            self.is_running = False

    def power_on(self) -> None:
        self.is_running = True


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


@dataclass
class StandinServer:
    id: int
    name: str
    machine: Machine
    public_ipv4: str | None = None
    private_ips: tuple[str, ...] = ()
    network: int = DEFAULT_NETWORK  # the Hetzner network its private addresses are in
    labels: dict[str, str] = field(default_factory=dict)
    created: str = field(default_factory=_now)
    busy: bool = False  # an action of it runs
    failure: tuple[str, str] | None = None

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "status": "running" if self.machine.is_running else "off",
            "created": self.created,
            "labels": dict(self.labels),
            "locked": False,
            "public_net": {
                "ipv4": {"id": self.id * 10, "ip": self.public_ipv4, "blocked": False, "dns_ptr": self.name}
                if self.public_ipv4
                else None,
                "ipv6": None,
                "floating_ips": [],
                "firewalls": [],
            },
            "private_net": [
                {
                    "network": self.network,
                    "ip": ip,
                    "alias_ips": [],
                    "mac_address": f"86:00:00:00:{n:02x}:{self.id % 256:02x}",
                }
                for n, ip in enumerate(self.private_ips)
            ],
        }


@dataclass
class StandinFirewall:
    id: int
    name: str
    applied: set[int] = field(default_factory=set)
    created: str = field(default_factory=_now)

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "labels": {},
            "created": self.created,
            "rules": [],
            "applied_to": [{"type": "server", "server": {"id": server}} for server in sorted(self.applied)],
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

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "command": self.command,
            "status": self.status,
            "progress": self.progress,
            "started": self.started,
            "finished": self.finished,
            "resources": [{"id": self.server, "type": "server"}],
            "error": self.error,
        }


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class HcloudStandin:
    """The stand-in: `add_server` registers a lab host; `url` is what hcloud:endpoint takes."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_hex(32)
        self.servers: dict[int, StandinServer] = {}
        self.actions: dict[int, StandinAction] = {}
        self.firewalls: dict[int, StandinFirewall] = {}
        self.ssh_keys: dict[int, StandinSshKey] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every authenticated request
        self._ids = itertools.count(4711)
        self._action_ids = itertools.count(13)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._serving = threading.Thread(target=self._http.serve_forever, daemon=True)

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
            thread.join(timeout=60)

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

    def fail_actions(self, server: int, code: str, message: str) -> None:
        """Every later power action of `server` ends in `error` (`code`, `message`), the host untouched."""
        self.servers[server].failure = (code, message)

    def clear_failures(self, server: int) -> None:
        self.servers[server].failure = None

    def power_actions(self, server: int, command: str = "stop_server") -> list[StandinAction]:
        """The actions `command` of `server` started, in order."""
        return [a for a in self.actions.values() if a.server == server and a.command == command]

    # The API.

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

    def _ssh_key(self, raw: str) -> StandinSshKey:
        key = self.ssh_keys.get(int(raw)) if raw.isdigit() else None
        if key is None:
            raise ApiError(404, "not_found", f"SSH key with ID '{raw}' not found")
        return key

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
            key = StandinSshKey(next(self._ids), name, public_key, fingerprint, dict(body.get("labels") or {}))
            self.ssh_keys[key.id] = key
            return key

    def _route_ssh_keys(
        self, method: str, parts: list[str], query: dict[str, list[str]], body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        if method == "GET" and len(parts) == 1:
            found = [
                key.view()
                for key in self.ssh_keys.values()
                if all(query.get(f) is None or getattr(key, f) == query[f][0] for f in ("fingerprint", "name"))
            ]
            pagination = {"page": 1, "per_page": 25, "previous_page": None, "next_page": None, "last_page": 1}
            return 200, {"ssh_keys": found, "meta": {"pagination": {**pagination, "total_entries": len(found)}}}
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

    def _route(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        parts = [part for part in path.split("/") if part]
        if parts[:1] != ["v1"]:
            raise ApiError(404, "not_found", "not found")
        parts = parts[1:]
        if parts[:1] == ["ssh_keys"]:
            return self._route_ssh_keys(method, parts, query, body)
        if method == "GET" and len(parts) == 2 and parts[0] == "firewalls":
            return 200, {"firewall": self._firewall(parts[1]).view()}
        if method == "POST" and parts[:1] == ["firewalls"] and parts[2:] == ["actions", "remove_from_resources"]:
            actions = self._remove_firewall(self._firewall(parts[1]), body or {})
            return 201, {"actions": [action.view() for action in actions]}
        if method == "GET" and parts == ["servers"]:
            names = query.get("name")
            found = [s.view() for s in self.servers.values() if not names or s.name == names[0]]
            pagination = {"page": 1, "per_page": 25, "previous_page": None, "next_page": None, "last_page": 1}
            return 200, {"servers": found, "meta": {"pagination": {**pagination, "total_entries": len(found)}}}
        if method == "GET" and len(parts) == 2 and parts[0] == "servers":
            return 200, {"server": self._server(parts[1]).view()}
        if method == "POST" and len(parts) == 4 and parts[0] == "servers" and parts[2] == "actions":
            command = {"poweroff": "stop_server", "poweron": "start_server"}.get(parts[3])
            if command is not None:
                return 201, {"action": self._start_action(self._server(parts[1]), command).view()}
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
        thread = threading.Thread(target=self._run_action, args=(server, action), daemon=True)
        self._threads.append(thread)
        thread.start()
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
            def _serve(self, method: str, sent: dict[str, Any] | None = None) -> None:
                split = urlsplit(self.path)
                try:
                    if self.headers.get("Authorization") != f"Bearer {standin.token}":
                        raise ApiError(401, "unauthorized", "unable to authenticate")
                    standin.requests.append((method, split.path))
                    status, body = standin._route(method, split.path, parse_qs(split.query), sent)
                except ApiError as error:
                    status = error.status
                    body = {"error": {"code": error.code, "message": error.message, "details": {}}}
                data = json.dumps(body).encode() if status != 204 else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                self._serve("POST", json.loads(raw) if raw.strip() else None)

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                self._serve("PUT", json.loads(raw) if raw.strip() else None)

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


@contextmanager
def running_standin(token: str | None = None) -> Iterator[HcloudStandin]:
    """A started stand-in, stopped on the way out."""
    standin = HcloudStandin(token).start()
    try:
        yield standin
    finally:
        standin.stop()
