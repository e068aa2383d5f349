"""The Kubernetes API layer: nodes, taints, labels and join tokens.

Every call runs `k3s kubectl` (or `k3s token`) on the server over its SSH
session. That needs no API port open to the operator's machine, works before
any kubeconfig has left the server, and is pinned by the server's host key.

Brief API outages are ridden through here, in one place. A k3s restart on the
server (a network-mode switch, an upgrade, a firewall change that needs one, an
operator's restart) leaves the API refusing connections for 10-30 s, longer on
small servers. A call that finds the API away (`api_unavailable`) waits and is
repeated with backoff until the API deadline, when repeating it is safe: reads
always; writes only when running them twice leaves the same state as once
(server-side apply, merge patches of fixed values, label/taint/cordon with
overwrite, deletes that accept NotFound), or after checking what the first try
did (the taint removal, the token creation). Every other failure is raised at once.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from remote_access.host_steps import HostStep, run_steps
from remote_access.ssh import CommandResult, RemoteCommandError, SshError, SshSession
from remote_access.stop_reading import StopWhen

K3S = "/usr/local/bin/k3s"
KUBECTL_DEADLINE_SECONDS = 30.0
# How much longer than this side reads it a watch runs on the server before kubectl ends it.
WATCH_MARGIN_SECONDS = 5.0
FIELD_MANAGER = "hk3s"
APPLY_ATTEMPTS = 3
TOKEN_PATTERN = re.compile(r"^K10[0-9a-f]{64}::([a-z0-9]{6})\.([a-z0-9]{16})$")
# How long a call waits for an API that is away (hk3s:cluster.api_wait_seconds): a k3s restart
# on a small server takes the API away for up to about a minute; twice that leaves room.
API_WAIT_SECONDS = 120.0
API_WAIT_SETTING = "hk3s:cluster.api_wait_seconds"
# Where k3s's admin kubeconfig on the server points `k3s kubectl`.
SERVER_API_ADDRESS = "127.0.0.1:6443"
# Backoff between tries while the API is away: quick at first (most outages are seconds),
# never slower than RETRY_MAX_SECONDS so the call goes on soon after the API is back.
RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 4.0

T = TypeVar("T")
Progress = Callable[[str], None]


class Repeat(enum.Enum):
    """Whether an API call may be sent again after the API was found away."""

    READ = "read"  # changes nothing: repeated freely
    IDEMPOTENT = "idempotent"  # a write whose repetition leaves the same state as one run
    ONCE = "once"  # a write that must not run twice blindly: never repeated by the layer


# kubectl's own words when the API is away (client side: nothing reached the API, or the
# connection broke) or answered that it cannot serve now (server side: 429, 5xx, etcd).
# Matched in kubectl's stderr; each maps to the short reason the progress line gives.
_UNAVAILABLE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), reason)
    for pattern, reason in (
        (r"connection to the server \S+ was refused|connect: connection refused", "connection refused"),
        (r"connection reset by peer", "connection reset"),
        (r"TLS handshake|remote error: tls", "TLS handshake cut"),
        (r"etcdserver: leader changed", "etcd leader changed"),
        (r"etcdserver: (request timed out|too many requests|no leader)", "etcd busy"),
        (r"\(TooManyRequests\)|too many requests", "HTTP 429"),
        (r"\(ServiceUnavailable\)|currently unable to handle the request", "HTTP 503"),
        (r"\(InternalError\)", "HTTP 500"),
        (r"\(Timeout\)|unable to return a response in the time allotted", "HTTP 504"),
        (r"Unable to connect to the server", "cannot connect"),
        (r"unexpected EOF|http2: server sent GOAWAY|use of closed network connection", "connection cut"),
        (r"no route to host|i/o timeout|context deadline exceeded|Client\.Timeout exceeded", "no answer"),
    )
)
# The API answered, but about something behind it (the kubelet a proxy call goes to): an
# outage of that backend is the caller's diagnosis, not the API's.
_BACKEND_FAILURE = re.compile(r"error trying to reach service|proxy error|dial tcp [^ ]+:10250", re.IGNORECASE)
# A certificate the client refuses does not heal by waiting.
_PERMANENT = re.compile(r"x509:|certificate", re.IGNORECASE)
_ADDRESS = re.compile(r"(?:connection to the server|dial tcp|Get \"https://)\s*([0-9A-Za-z.\-\[\]:]+:\d+)")


def api_unavailable(error: BaseException) -> str | None:
    """The reason an API call failed because the API was away or could not serve yet
    (retry), or None for every other failure (raise)."""
    if not isinstance(error, RemoteCommandError):
        return None  # the SSH link itself failed, or the command timed out: not the API's outage
    text = error.stderr_tail
    if _BACKEND_FAILURE.search(text) or _PERMANENT.search(text):
        return None
    for pattern, reason in _UNAVAILABLE_PATTERNS:
        if pattern.search(text):
            return reason
    return None


class ApiUnavailableError(SshError):
    """The Kubernetes API stayed away past the API deadline."""

    def __init__(self, node: str, *, address: str, waited: float, reason: str, what: str, last: str) -> None:
        self.waited = waited
        self.reason = reason
        super().__init__(
            node,
            f"the Kubernetes API at {address} did not answer for {waited:.0f} s ({reason}; last: {what}: {last}). "
            f"Check k3s on {node} (systemctl status k3s; journalctl -u k3s) and run pulumi up again: it continues "
            f"where this run stopped. To wait longer through a slow restart, raise {API_WAIT_SETTING}",
        )


@dataclass(frozen=True)
class Taint:
    """A node taint."""

    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"

    @classmethod
    def parse(cls, text: str) -> Taint:
        """Parse `key=value:Effect` (or `key:Effect`)."""
        key_value, _, effect = text.rpartition(":")
        key, _, value = key_value.partition("=")
        if not key or not effect:
            raise ValueError(f"{text!r} is not a taint (key=value:Effect)")
        return cls(key, value, effect)


@dataclass(frozen=True)
class NodeStatus:
    """What the program needs to know about a Node."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    ready: bool = False
    ready_reason: str = ""
    unschedulable: bool = False
    addresses: dict[str, str] = field(default_factory=dict)  # InternalIP/ExternalIP/Hostname -> address
    kubelet_version: str = ""
    container_runtime: str = ""
    machine_id: str = ""  # the kubelet's host's /etc/machine-id
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeStatus:
        metadata, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
        ready: Mapping[str, Any] = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), {})
        return cls(
            name=metadata["name"],
            labels=dict(metadata.get("labels") or {}),
            taints=[Taint(t["key"], t.get("value", ""), t["effect"]) for t in spec.get("taints") or []],
            ready=ready.get("status") == "True",
            ready_reason=ready.get("reason", ""),
            unschedulable=bool(spec.get("unschedulable")),
            addresses={a["type"]: a["address"] for a in status.get("addresses") or []},
            kubelet_version=status.get("nodeInfo", {}).get("kubeletVersion", ""),
            container_runtime=status.get("nodeInfo", {}).get("containerRuntimeVersion", ""),
            machine_id=status.get("nodeInfo", {}).get("machineID", ""),
            annotations=dict(metadata.get("annotations") or {}),
        )

    def has_taint(self, key: str, effect: str | None = None) -> bool:
        return any(taint.key == key and effect in (None, taint.effect) for taint in self.taints)


@dataclass(frozen=True)
class JoinToken:
    """A short-lived, per-node bootstrap token. `value` is secret: never log it."""

    token_id: str
    value: str = field(repr=False)


class ClusterApi:
    """Kubernetes operations through the server's `k3s kubectl`, riding through brief
    API outages (see the module docstring). `progress` gets one line when a call starts
    waiting for the API and one when it answers again; `waited_seconds` adds up the time
    spent waiting, so callers with clocks of their own can leave it out of them."""

    def __init__(
        self, server: SshSession, progress: Progress | None = None, api_wait: float = API_WAIT_SECONDS
    ) -> None:
        self._server = server
        self._progress = progress or (lambda _line: None)
        self.api_wait = api_wait
        self.waited_seconds = 0.0
        # Set once a call waited the whole deadline in vain, cleared by the next answer: the
        # calls that follow (a failed join's clean-up) try once instead of waiting all over again.
        self._gave_up = False

    @property
    def node(self) -> str:
        return self._server.target.node

    async def _call(self, what: str, attempt: Callable[[], Awaitable[T]], repeat: Repeat) -> T:
        """Run `attempt`; while the API is away and `repeat` allows, wait and try again
        with backoff until the API deadline."""
        started: float | None = None
        delay = RETRY_FIRST_SECONDS
        reason = ""
        while True:
            try:
                result = await attempt()
            except RemoteCommandError as error:
                found = api_unavailable(error)
                if found is None or repeat is Repeat.ONCE or self._gave_up:
                    raise
                now = time.monotonic()
                if started is None:
                    started, reason = now, found
                    self._progress(f"waiting for the Kubernetes API on {self.node}: {found}")
                if now - started >= self.api_wait:
                    self.waited_seconds += now - started
                    self._gave_up = True
                    address = _ADDRESS.search(error.stderr_tail)
                    raise ApiUnavailableError(
                        self.node,
                        address=address.group(1) if address else SERVER_API_ADDRESS,
                        waited=now - started,
                        reason=reason,
                        what=what,
                        last=error.stderr_tail,
                    ) from None
                await asyncio.sleep(min(delay, max(0.0, started + self.api_wait - now)))
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            self._gave_up = False
            if started is not None:
                waited = time.monotonic() - started
                self.waited_seconds += waited
                self._progress(f"waited for the Kubernetes API on {self.node}: {reason}, {waited:.0f} s")
            return result

    async def run_steps(
        self, steps: Sequence[HostStep], repeat: Repeat, *, deadline: float = KUBECTL_DEADLINE_SECONDS
    ) -> list[CommandResult]:
        """Several calls (kubectl_step, or other commands) in one command to the server; while the
        API is away and `repeat` allows, the whole batch is repeated, as `kubectl` repeats one
        call. Each step's failure is raised as that call's would be."""
        what = ", then ".join(step.what for step in steps)
        return await self._call(what, lambda: run_steps(self._server, steps, deadline=deadline), repeat)

    async def kubectl(
        self,
        args: Sequence[str],
        *,
        repeat: Repeat = Repeat.ONCE,
        stdin: str | None = None,
        deadline: float = KUBECTL_DEADLINE_SECONDS,
        until: StopWhen | None = None,
    ) -> str:
        """Run `k3s kubectl args` on the server; `repeat` says whether it may run again
        after finding the API away (a call that does not say is never repeated); `until`
        says when to stop reading a watch."""
        what = f"kubectl {' '.join(args[:3])}"

        async def attempt() -> str:
            result = await self._server.run(
                [K3S, "kubectl", *args], stdin=stdin, deadline=deadline, what=what, until=until
            )
            return result.stdout

        return await self._call(what, attempt, repeat)

    async def delete_node_password(self, node: str) -> None:
        """Delete k3s's record of the node's password (kube-system/<node>.node-password.k3s)."""
        await self.kubectl(
            node_password_delete_args(node),
            repeat=Repeat.IDEMPOTENT,
        )

    async def wait_api(self) -> None:
        """Return once the API answers (waiting through an outage up to the API deadline)."""
        await self.kubectl(["get", "--raw", "/readyz"], repeat=Repeat.READ)

    async def nodes(self) -> list[NodeStatus]:
        return parse_nodes(await self.kubectl(NODES_ARGS, repeat=Repeat.READ))

    async def get_node(self, name: str) -> NodeStatus | None:
        out = await self.kubectl(["get", "node", name, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
        return NodeStatus.from_object(json.loads(out)) if out.strip() else None

    async def watch_node(
        self, name: str, seconds: float, done: Callable[[NodeStatus], bool] = lambda _node: True
    ) -> NodeStatus | None:
        """The Node as a watch sees it for up to `seconds`: returned as soon as `done` accepts
        it (by default, as soon as it exists), else its last state seen (None: no such Node).

        One call where polling costs one per interval, and no interval to wait out once the
        Node is there. This side stops reading after `seconds`; kubectl's own request timeout
        ends the watch on the server a little later (WATCH_MARGIN_SECONDS), since sshd ends a
        root login's command only at its next write (remote_access.stop_reading)."""
        watch = _NodeWatch(done)
        args = ["get", "node", "--field-selector", f"metadata.name={name}", "--watch", "-o", "json"]
        out = await self.kubectl(
            [*args, f"--request-timeout={math.ceil(seconds + WATCH_MARGIN_SECONDS)}s"],
            repeat=Repeat.READ,
            until=StopWhen(watch.line, seconds),
            deadline=seconds + KUBECTL_DEADLINE_SECONDS,
        )
        objects = _json_objects(out)
        return NodeStatus.from_object(objects[-1]) if objects else None

    async def set_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Set labels (a None value removes the label). Idempotent: with --overwrite a label
        gets the same value however often it is set, and removing a missing one is no error."""
        args = label_args(name, labels)
        if args:
            await self.kubectl(args, repeat=Repeat.IDEMPOTENT)

    async def add_taint(self, name: str, taint: Taint) -> None:
        await self.kubectl(taint_add_args(name, taint), repeat=Repeat.IDEMPOTENT)

    async def remove_taint(self, name: str, key: str, effect: str | None = None) -> None:
        """Remove a taint (with `effect`, only the one of that effect). Not blindly repeatable (a
        second removal fails: not found), so after the API was away the node is read again to
        see what the first try did."""
        while True:
            node = await self.get_node(name)
            if node is None or not node.has_taint(key, effect):
                return
            try:
                await self.kubectl(taint_remove_args(name, key, effect), repeat=Repeat.ONCE)
                return
            except RemoteCommandError as error:
                if api_unavailable(error) is None:
                    raise

    async def cordon(self, name: str, cordoned: bool) -> None:
        await self.kubectl(cordon_args(name, cordoned), repeat=Repeat.IDEMPOTENT)

    async def drain(self, name: str, timeout: float) -> None:
        """Cordon and evict: PodDisruptionBudgets respected (a blocked eviction is retried until
        `timeout`), DaemonSet pods stay, emptyDir data goes as with any drain. Idempotent: a drain
        again evicts what is left. Raises RemoteCommandError when the pods did not go in time."""
        await self.kubectl(
            ["drain", name, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={int(timeout)}s"],
            repeat=Repeat.IDEMPOTENT,
            deadline=timeout + 60,
        )

    async def patch_merge(self, kind: str, name: str, namespace: str, patch: Mapping[str, Any]) -> None:
        """A JSON merge patch of fixed values: idempotent, the object ends the same whether
        it ran once or twice."""
        await self.kubectl(merge_patch_args(kind, name, namespace, patch), repeat=Repeat.IDEMPOTENT)

    async def kubelet_healthz(self, node: str) -> None:
        """The kubelet's health through the API server's node proxy (what logs and exec need).
        The API being away is waited for; the kubelet not answering is raised at once."""
        await self.kubectl(healthz_args(node), repeat=Repeat.READ)

    async def apply(self, manifest: str) -> None:
        """Create or update the manifest's objects. Server-side apply, because joins run side
        by side: client-side apply reads then creates, and two joins creating the same object
        at once fail with AlreadyExists. A conflict left over is retried. Server-side apply is
        idempotent, so it is repeated through an API outage too."""
        for attempt in range(APPLY_ATTEMPTS):
            try:
                await self.kubectl(APPLY_ARGS, stdin=manifest, repeat=Repeat.IDEMPOTENT)
                return
            except RemoteCommandError as error:
                retried = any(word in str(error) for word in ("AlreadyExists", "Conflict"))
                if attempt + 1 == APPLY_ATTEMPTS or not retried:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))

    async def create_join_token(self, node: str, ttl: str = "10m") -> JoinToken:
        """`k3s token create` for one node: short-lived, described by the node's name.

        Not blindly repeatable (each run makes another token). When the API was away, what
        the first try did is checked: tokens described by this node whose value this program
        never saw are deleted, then a new one is made."""
        what = f"k3s token create for {node}"

        async def attempt() -> str:
            result = await self._server.run(token_create_argv(node, ttl), deadline=KUBECTL_DEADLINE_SECONDS, what=what)
            return result.stdout

        while True:
            try:
                out = await self._call(what, attempt, Repeat.ONCE)
                break
            except RemoteCommandError as error:
                if api_unavailable(error) is None:
                    raise
                await self.wait_api()
                for token_id, description in (await self.token_ids()).items():
                    if description == node:
                        await self.delete_token(token_id)
        return parse_join_token(self.node, node, out)

    async def token_ids(self) -> dict[str, str]:
        """Existing bootstrap token ids and their descriptions."""
        return parse_token_ids(await self.kubectl(TOKENS_ARGS, repeat=Repeat.READ))

    async def delete_token(self, token_id: str) -> None:
        # --ignore-not-found: a second delete (after the API was away) finds nothing and succeeds.
        await self.kubectl(token_delete_args(token_id), repeat=Repeat.IDEMPOTENT)


# The calls' arguments, shared by the calls one at a time and the batches (kubectl_step).
NODES_ARGS = ("get", "nodes", "-o", "json")
TOKENS_ARGS = (
    *("get", "secrets", "-n", "kube-system"),
    *("--field-selector", "type=bootstrap.kubernetes.io/token", "-o", "json"),
)
APPLY_ARGS = ("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", "-f", "-")


def node_password_delete_args(node: str) -> list[str]:
    return ["delete", "secret", "-n", "kube-system", f"{node}.node-password.k3s", "--ignore-not-found"]


def token_delete_args(token_id: str) -> list[str]:
    # --ignore-not-found: a second delete (after the API was away) finds nothing and succeeds.
    return ["delete", "secret", "-n", "kube-system", f"bootstrap-token-{token_id}", "--ignore-not-found"]


def token_create_argv(node: str, ttl: str) -> list[str]:
    return [K3S, "token", "create", "--ttl", ttl, "--description", node]


def merge_patch_args(kind: str, name: str, namespace: str, patch: Mapping[str, Any]) -> list[str]:
    return ["patch", kind, name, "-n", namespace, "--type", "merge", "-p", json.dumps(patch)]


def label_args(name: str, labels: Mapping[str, str | None]) -> list[str] | None:
    """`kubectl label` setting `labels` (None removes one); None when there is nothing to set."""
    args = [f"{key}-" if value is None else f"{key}={value}" for key, value in sorted(labels.items())]
    return ["label", "node", name, "--overwrite", *args] if args else None


def taint_add_args(name: str, taint: Taint) -> list[str]:
    return ["taint", "node", name, "--overwrite", str(taint)]


def taint_remove_args(name: str, key: str, effect: str | None = None) -> list[str]:
    return ["taint", "node", name, f"{key}:{effect}-" if effect else f"{key}-"]


def cordon_args(name: str, cordoned: bool) -> list[str]:
    return ["cordon" if cordoned else "uncordon", name]


def healthz_args(node: str) -> list[str]:
    return ["get", "--raw", f"/api/v1/nodes/{node}/proxy/healthz"]


def kubectl_step(args: Sequence[str], *, stdin: str | None = None, check: bool = True) -> HostStep:
    """One `k3s kubectl` call as a step of a batch (ClusterApi.run_steps), named as the call is."""
    return HostStep.command([K3S, "kubectl", *args], what=f"kubectl {' '.join(args[:3])}", stdin=stdin, check=check)


def parse_nodes(out: str) -> list[NodeStatus]:
    return [NodeStatus.from_object(item) for item in json.loads(out).get("items", [])]


def parse_token_ids(out: str) -> dict[str, str]:
    """Bootstrap token ids and their descriptions, from TOKENS_ARGS' output."""
    tokens: dict[str, str] = {}
    for item in json.loads(out).get("items", []):
        name = item["metadata"]["name"]
        description = item.get("data", {}).get("description", "")
        tokens[name.removeprefix("bootstrap-token-")] = _b64(description)
    return tokens


def parse_join_token(server: str, node: str, out: str) -> JoinToken:
    """The token `k3s token create` printed (its last line)."""
    value = out.strip().splitlines()[-1] if out.strip() else ""
    match = TOKEN_PATTERN.match(value)
    if match is None:
        # Never echo what was printed: it may be a token in an unexpected shape.
        raise RemoteCommandError(server, f"k3s token create for {node}", 0, "printed no K10 token")
    return JoinToken(token_id=match.group(1), value=value)


class _NodeWatch:
    """Follows `kubectl get --watch -o json` line by line: each object ends with a "}" line."""

    def __init__(self, done: Callable[[NodeStatus], bool]) -> None:
        self.done = done
        self.lines: list[str] = []

    def line(self, text: str) -> bool:
        self.lines.append(text)
        if text != "}":
            return False
        objects = _json_objects("\n".join(self.lines))
        self.lines.clear()
        return bool(objects) and self.done(NodeStatus.from_object(objects[-1]))


def _json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one after the other (as a watch prints them)."""
    decoder, objects, position = json.JSONDecoder(), [], 0
    while (position := _skip_space(text, position)) < len(text):
        found, position = decoder.raw_decode(text, position)
        objects.append(found)
    return objects


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def _b64(text: str) -> str:
    import base64  # noqa: PLC0415 - only token descriptions need it

    return base64.b64decode(text).decode() if text else ""
