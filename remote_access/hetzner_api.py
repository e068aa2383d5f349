"""The program's own calls to the Hetzner Cloud API, through Hetzner's official Python library
(`hcloud`): find a server (by id, or by name), read its status, power it off or on, and wait
for the action each power change starts; take a new server off the SSH-only cloud firewall it
was created with once its full firewall is applied.

- The token is a Pulumi secret the caller passes in (hcloud:token, the setting the Hetzner
  Pulumi provider reads); it goes only into the library's `Authorization: Bearer` header, never
  into a message or a log line. The endpoint is hcloud:endpoint (default Hetzner's).
- Every call has a deadline: each HTTP request a timeout, each action wait a bound number of
  polls. The library retries what Hetzner says may be retried (a 429 `rate_limit_exceeded`,
  `conflict`, 502/504, a network timeout) with backoff; anything else is reported at once.
- Power changes are actions: POST /servers/{id}/actions/poweroff (or poweron) answers with an
  `action` whose status goes from `running` to `success` or `error` (with `error.code` and
  `error.message`). `poweroff` cuts the power like pulling the cord; the ACPI `shutdown` is
  never used, since its action finishing says only that the signal was sent. After the action
  succeeds, the server's own status must read `off`.
- Every error names the server, the call or action, Hetzner's code and message, and the fix.

The library's calls block, so they run in a worker thread (`asyncio.to_thread`); the client is
made inside each call (a dynamic provider is pickled: no client may live on it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # hcloud (with requests and urllib3) costs a fresh process about 0.05 CPU-s to import; each
    # call imports what it uses, so a provider process that makes no API call never loads them.
    from hcloud import APIException, Client
    from hcloud.actions import BoundAction
    from hcloud.servers import BoundServer

DEFAULT_ENDPOINT = "https://api.hetzner.cloud/v1"
APPLICATION = "hk3s"
# One request: 10 s to connect, 30 s for the answer (the library's default waits forever).
REQUEST_TIMEOUT = (10.0, 30.0)
POLL_SECONDS = 1.0
# Hetzner's power actions finish within seconds; a minute and a half of polls is ample.
ACTION_POLLS = 90
# After a successful poweroff, how long the server's status may take to read `off`.
STATUS_OFF_SECONDS = 30.0

Progress = Callable[[str], None]


class HetznerApiError(RuntimeError):
    """A Hetzner API call failed or did not do what it must; the message names the server,
    the call, Hetzner's answer and the fix (never the token)."""


@dataclass(frozen=True)
class HetznerAccess:
    """How to reach the Hetzner API: the token (a secret: kept out of repr) and the endpoint."""

    token: str
    endpoint: str = DEFAULT_ENDPOINT

    def __repr__(self) -> str:
        return f"HetznerAccess(endpoint={self.endpoint!r}, token=<secret>)"

    def client(self) -> Client:
        from hcloud import Client  # noqa: PLC0415 - loaded on first use

        return Client(
            token=self.token,
            api_endpoint=(self.endpoint or DEFAULT_ENDPOINT).rstrip("/"),
            application_name=APPLICATION,
            poll_interval=POLL_SECONDS,
            poll_max_retries=ACTION_POLLS,
            timeout=REQUEST_TIMEOUT,
        )


@dataclass(frozen=True)
class PrivateAddress:
    """A server's address in one Hetzner network (`private_net[].ip`, or one of its `alias_ips`),
    with that network's id (`private_net[].network`). A private address is unique only within its
    network: every project's networks may use the same range (10.0.0.0/16 is the Console's
    default), so the same address may belong to servers in two networks."""

    network: int
    ip: str

    def __str__(self) -> str:
        return f"{self.ip} in Hetzner network {self.network}"


@dataclass(frozen=True)
class ServerState:
    """A Hetzner server as the API reports it."""

    id: int
    name: str
    status: str  # running, initializing, starting, stopping, off, deleting, migrating, rebuilding, unknown
    public_ipv4: str | None = None
    public_ipv6: str | None = None  # the server's /64 (public_net.ipv6.ip), e.g. 2001:db8:1::/64
    private_net: tuple[PrivateAddress, ...] = ()  # its address in each private network, alias IPs included
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def private_ips(self) -> tuple[str, ...]:
        return tuple(address.ip for address in self.private_net)

    def owns(self, address: str, networks: Collection[int] | None = None) -> bool:
        """Whether `address` is one of the server's own: its public IPv4, in its IPv6 /64, or a
        private address in one of `networks` (None: in any network)."""
        if address == self.public_ipv4:
            return True
        if any(p.ip == address and (networks is None or p.network in networks) for p in self.private_net):
            return True
        if self.public_ipv6 and ":" in address:
            try:
                return ipaddress.IPv6Address(address) in ipaddress.IPv6Network(self.public_ipv6, strict=False)
            except ValueError:
                return False
        return False

    def addresses(self) -> list[str]:
        return [a for a in (self.public_ipv4, self.public_ipv6) if a] + [str(p) for p in self.private_net]


@dataclass(frozen=True)
class ActionResult:
    """A power action that finished with `success` (None: none was needed, the server was already there)."""

    id: int
    command: str


def _answer(error: APIException) -> str:
    return f"Hetzner answered {error.code}: {error.message}"


def _fix(error: APIException) -> str:
    if error.code in ("unauthorized", 401):
        return "check hcloud:token (pulumi config set --secret hcloud:token <token>) and hcloud:endpoint"
    if error.code in ("forbidden", 403):
        return "the token is read-only or of another project: give a read & write token of the server's project"
    if error.code in ("not_found", 404):
        return "check that the server exists in the token's project and that the worker names the right one"
    if error.code in ("rate_limit_exceeded", 429):
        return "the project's API rate limit is spent; run up again in a minute"
    return "check the server in Hetzner's console, then run up again"


def _call_failed(what: str, server: str, error: Exception) -> HetznerApiError:
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use

    if isinstance(error, APIException):
        return HetznerApiError(f"{what} of Hetzner server {server} failed: {_answer(error)}; {_fix(error)}")
    # A network failure: requests names the URL, never the header holding the token.
    return HetznerApiError(
        f"{what} of Hetzner server {server} failed: the Hetzner API did not answer ({type(error).__name__}: "
        f"{error}); check hcloud:endpoint and this machine's network, then run up again"
    )


def token_refusal(access: HetznerAccess) -> str | None:
    """Why Hetzner's API does not take `access`'s token (its answer, or that it did not answer);
    None when it does. One GET, so it changes nothing; it blocks (no event loop needed)."""
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    try:
        # Every endpoint needs the token; the locations are the smallest list a project has.
        access.client().locations.get_all()
    except APIException as error:
        return _answer(error)
    except RequestException as error:
        # requests names the URL, never the header holding the token.
        return f"the Hetzner API did not answer ({type(error).__name__})"
    return None


def _find(client: Client, server: str) -> BoundServer:
    """The server `server` names: its id (digits) or its name."""
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    try:
        found = client.servers.get_by_id(int(server)) if server.isdigit() else client.servers.get_by_name(server)
    except APIException as error:
        if error.code == "not_found" and server.isdigit():
            raise HetznerApiError(
                f"there is no Hetzner server with id {server} in the token's project ({_answer(error)}); "
                "check the worker's Hetzner server (hcloud_server) and hcloud:token"
            ) from None
        raise _call_failed("reading", server, error) from None
    except RequestException as error:
        raise _call_failed("reading", server, error) from None
    if found is None:
        raise HetznerApiError(
            f"there is no Hetzner server named {server!r} in the token's project; check the worker's Hetzner "
            "server (hcloud_server: its id or name) and hcloud:token"
        )
    return found


def _state(server: BoundServer) -> ServerState:
    public, private = server.public_net, server.private_net or []
    return ServerState(
        id=int(server.id or 0),
        name=str(server.name),
        status=str(server.status),
        public_ipv4=public.ipv4.ip if public is not None and public.ipv4 is not None else None,
        public_ipv6=public.ipv6.ip if public is not None and public.ipv6 is not None else None,
        private_net=tuple(
            PrivateAddress(int(net.network.id or 0), ip)
            for net in private
            for ip in (net.ip, *(net.alias_ips or []))
            if ip and net.network is not None
        ),
        labels=dict(server.labels or {}),
    )


def _wait_action(action: BoundAction, server: ServerState, call: str) -> ActionResult:
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from hcloud.actions import ActionFailedException, ActionTimeoutException  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    where = f"Hetzner server {server.name} (id {server.id})"
    try:
        action.wait_until_finished()
    except ActionFailedException:
        failure = action.error
        code = failure["code"] if failure else "no code"
        message = failure["message"] if failure else ""
        raise HetznerApiError(
            f"the {call} action {action.id} ({action.command}) of {where} ended in error: "
            f"{code}: {message or 'no message'}; the server may still be "
            "running. Check it in Hetzner's console (or Hetzner's status page), then run up again"
        ) from None
    except ActionTimeoutException:
        raise HetznerApiError(
            f"the {call} action {action.id} ({action.command}) of {where} was still running after "
            f"{ACTION_POLLS * POLL_SECONDS:.0f} s; check the server in Hetzner's console, then run up again"
        ) from None
    except (APIException, RequestException) as error:
        raise _call_failed(f"waiting for the {call} action {action.id}", server.name, error) from None
    return ActionResult(id=int(action.id or 0), command=str(action.command))


def _power_off(access: HetznerAccess, server: str, progress: Progress) -> tuple[ServerState, ActionResult | None]:
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    client = access.client()
    found = _find(client, server)
    state = _state(found)
    result = None
    if state.status != "off":
        progress(f"powering off Hetzner server {state.name} (id {state.id}, {state.status}) through the Hetzner API")
        try:
            action = client.servers.power_off(found)
        except (APIException, RequestException) as error:
            raise _call_failed("the poweroff", f"{state.name} (id {state.id})", error) from None
        result = _wait_action(action, state, "poweroff")
    deadline = time.monotonic() + STATUS_OFF_SECONDS
    while True:
        state = _state(_find(client, str(state.id)))
        if state.status == "off":
            return state, result
        if time.monotonic() > deadline:
            raise HetznerApiError(
                f"Hetzner server {state.name} (id {state.id}) reads {state.status!r}, not 'off', "
                f"{STATUS_OFF_SECONDS:.0f} s after its poweroff action succeeded; check it in Hetzner's console, "
                "then run up again"
            )
        time.sleep(POLL_SECONDS)


async def power_off(access: HetznerAccess, server: str, progress: Progress) -> tuple[ServerState, ActionResult | None]:
    """Power `server` (an id or a name) off, wait for the action, and confirm its status reads
    `off`; the action is None when the server was off already."""
    return await asyncio.to_thread(_power_off, access, server, progress)


def _power_on(access: HetznerAccess, server: str, progress: Progress) -> tuple[ServerState, ActionResult | None]:
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    client = access.client()
    found = _find(client, server)
    state = _state(found)
    if state.status != "off":
        return state, None
    progress(f"powering on Hetzner server {state.name} (id {state.id}) through the Hetzner API")
    try:
        action = client.servers.power_on(found)
    except (APIException, RequestException) as error:
        raise _call_failed("the poweron", f"{state.name} (id {state.id})", error) from None
    result = _wait_action(action, state, "poweron")
    return _state(_find(client, str(state.id))), result


async def power_on(access: HetznerAccess, server: str, progress: Progress) -> tuple[ServerState, ActionResult | None]:
    """Power `server` on when it is off and wait for the action; None when it was not off."""
    return await asyncio.to_thread(_power_on, access, server, progress)


async def server_state(access: HetznerAccess, server: str) -> ServerState:
    """The server `server` (an id or a name) names, and its status."""
    return await asyncio.to_thread(lambda: _state(_find(access.client(), server)))


def _release_bootstrap_firewall(
    access: HetznerAccess, node: str, *, server_id: int, bootstrap_id: int, full_id: int, progress: Progress
) -> bool:
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from hcloud.firewalls import Firewall, FirewallResource  # noqa: PLC0415 - loaded on first use
    from hcloud.servers import Server  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    client = access.client()
    where = f"{node} (id {server_id})"
    try:
        full = client.firewalls.get_by_id(full_id)
    except (APIException, RequestException) as error:
        raise _call_failed(f"reading its full firewall (id {full_id})", where, error) from None
    applied = {int(item.server.id or 0) for item in full.applied_to or [] if item.server is not None}
    if server_id not in applied:
        # Never left without a cloud firewall: the SSH-only one stays until the full one is on.
        raise HetznerApiError(
            f"Hetzner server {where} is not in its full cloud firewall {full.name} (id {full_id}) yet, so it keeps "
            "the SSH-only firewall it was created with; run up again (it attaches the full firewall first)"
        )
    progress(f"taking Hetzner server {where} off the SSH-only firewall (id {bootstrap_id}): its full one is on")
    try:
        actions = client.firewalls.remove_from_resources(
            Firewall(id=bootstrap_id),
            [FirewallResource(type="server", server=Server(id=server_id))],
        )
    except APIException as error:
        # Nothing to take off: the server is not on it (an earlier run took it off, or someone by
        # hand), which Hetzner answers 404 `firewall_resource_not_found` (the call's error table
        # in its API reference; terraform-provider-hcloud's removeFromResources reads it the same
        # way), or the firewall itself is gone (`not_found`). `firewall_already_removed` is what
        # the API answered before its change of 2025-08-04 (hcloud-go marks it unused since).
        if error.code in ("firewall_resource_not_found", "firewall_already_removed", "not_found"):
            return False
        raise _call_failed("taking the SSH-only firewall off", where, error) from None
    except RequestException as error:
        raise _call_failed("taking the SSH-only firewall off", where, error) from None
    state = ServerState(id=server_id, name=node, status="running")
    for action in actions:
        _wait_action(action, state, "remove_firewall")
    return True


async def release_bootstrap_firewall(
    access: HetznerAccess, node: str, *, server_id: int, bootstrap_id: int, full_id: int, progress: Progress
) -> bool:
    """Take Hetzner server `server_id` off the SSH-only firewall `bootstrap_id` once the full
    firewall `full_id` is applied to it (refused before); False when it was not on it."""
    return await asyncio.to_thread(
        _release_bootstrap_firewall,
        access,
        node,
        server_id=server_id,
        bootstrap_id=bootstrap_id,
        full_id=full_id,
        progress=progress,
    )


# The project's SSH key (providers.project_ssh_key). Hetzner's API reference ("SSH Keys: Create an
# SSH key"): a key whose fingerprint, or whose name, the project already holds is refused with
# 409 `uniqueness_error` ("SSH key with the same fingerprint already exists", "SSH key name is
# already used"); GET /ssh_keys?fingerprint= lists the one key with that MD5 fingerprint.

# The label that says which stack uploaded a key: its StackIdentity (providers.stack_identity),
# made once and kept in the stack's state, so a stack rename does not change it.
STACK_ID_LABEL = "hk3s-stack-id"


@dataclass(frozen=True)
class ProjectKey:
    """The key the stack's servers are created with: its id, and whether this stack uploaded it
    (False: another stack's upload won the race and this one took that key)."""

    id: int
    name: str
    owned: bool


def _same_public_key(held: str | None, wanted: str) -> bool:
    return bool(held) and str(held).split()[:2] == wanted.split()[:2]


def upload_or_adopt_ssh_key(
    access: HetznerAccess, name: str, public_key: str, fingerprint: str, labels: dict[str, str]
) -> ProjectKey:
    """Upload the key; when the project already holds its fingerprint, take that key, and only if
    its public key is this one. The key taken is this stack's own (`owned`) when its stack-id label
    is the one in `labels`: this stack's earlier upload, whose run ended before Pulumi wrote it to
    the state. Otherwise another stack uploaded it (between this run's look-up and now, or it is
    another stack's key this stack shares): not owned."""
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use
    from requests import RequestException  # noqa: PLC0415 - loaded on first use

    client = access.client()
    try:
        key = client.ssh_keys.create(name=name, public_key=public_key, labels=labels)
        return ProjectKey(int(key.id or 0), name, owned=True)
    except APIException as error:
        if error.code != "uniqueness_error":
            raise HetznerApiError(f"uploading the SSH key {name!r}: {_answer(error)}; check hcloud:token") from None
        refused = error
    except RequestException as error:
        raise HetznerApiError(f"uploading the SSH key {name!r}: {error}; check hcloud:endpoint") from None
    held = client.ssh_keys.get_by_fingerprint(fingerprint)
    if held is None:
        raise HetznerApiError(
            f"uploading the SSH key {name!r}: {_answer(refused)}, and the project holds no key with its fingerprint "
            f"{fingerprint}: the name is another key's; rename or delete that key in the Hetzner project"
        )
    if not _same_public_key(held.public_key, public_key):
        raise HetznerApiError(
            f"uploading the SSH key {name!r}: the project's key {held.name!r} has its fingerprint {fingerprint} but "
            "another public key; use another key pair, or name a key with hk3s:ssh.hetzner_key"
        )
    ours = labels.get(STACK_ID_LABEL)
    if not ours or (held.labels or {}).get(STACK_ID_LABEL) != ours:
        return ProjectKey(int(held.id or 0), str(held.name), owned=False)
    if held.name != name or (held.labels or {}) != labels:
        # This stack's own upload, under an earlier cluster name or labels: brought up to date.
        try:
            client.ssh_keys.update(held, name=name, labels=labels)
        except APIException as error:
            raise HetznerApiError(f"updating the SSH key {held.id} this stack uploaded: {_answer(error)}") from None
    return ProjectKey(int(held.id or 0), name, owned=True)


def update_ssh_key(access: HetznerAccess, key_id: int, name: str, labels: dict[str, str]) -> None:
    """Rename and relabel the key in place (an unknown key is an error: it was deleted by hand)."""
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use

    client = access.client()
    try:
        client.ssh_keys.update(client.ssh_keys.get_by_id(key_id), name=name, labels=labels)
    except APIException as error:
        raise HetznerApiError(f"updating the SSH key {key_id}: {_answer(error)}") from None


def delete_ssh_key(access: HetznerAccess, key_id: int) -> None:
    """Delete the key; one already gone is fine."""
    from hcloud import APIException  # noqa: PLC0415 - loaded on first use

    client = access.client()
    try:
        client.ssh_keys.delete(client.ssh_keys.get_by_id(key_id))
    except APIException as error:
        if error.code != "not_found":
            raise HetznerApiError(f"deleting the SSH key {key_id}: {_answer(error)}") from None
