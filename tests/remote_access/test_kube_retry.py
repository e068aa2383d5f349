"""The Kubernetes API layer riding through API outages: which failures are waited for and
repeated, which are raised at once, which writes are repeated and which are checked first.

The server here is a scripted stand-in for an SSH session that answers each `k3s ...`
command as the server's kubectl would (the failure texts are kubectl's own); the lab tests
(tests/lab/test_api_outage.py) restart the real API under real joins."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from remote_access.kube import API_WAIT_SETTING, ApiUnavailableError, ClusterApi, Taint, api_unavailable
from remote_access.ssh import CommandResult, RemoteCommandError, SshDeadlineError, SshSession, SshTarget

REFUSED = "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?"

RETRIED = {
    REFUSED: "connection refused",
    "Unable to connect to the server: dial tcp 127.0.0.1:6443: connect: connection refused": "connection refused",
    "read tcp 127.0.0.1:50312->127.0.0.1:6443: read: connection reset by peer": "connection reset",
    "Unable to connect to the server: net/http: TLS handshake timeout": "TLS handshake cut",
    "Error from server: etcdserver: leader changed": "etcd leader changed",
    "Error from server (TooManyRequests): the server has received too many requests and has asked us to try "
    "again later": "HTTP 429",
    "Error from server (ServiceUnavailable): the server is currently unable to handle the request": "HTTP 503",
    "Error from server (InternalError): Internal error occurred: resource quota evaluation timed out": "HTTP 500",
    "Error from server (Timeout): the server was unable to return a response in the time allotted": "HTTP 504",
    "Unable to connect to the server: unexpected EOF": "cannot connect",
}

RAISED = [
    'Error from server (NotFound): nodes "w9" not found',
    'Error from server (Forbidden): nodes is forbidden: User "x" cannot list resource "nodes"',
    'Error from server (Invalid): Node "w1" is invalid: metadata.labels: Invalid value: "-"',
    # The API answered; the kubelet behind its proxy did not (the caller's diagnosis).
    "Error from server (ServiceUnavailable): error trying to reach service: dial tcp 198.51.100.12:10250: "
    "connect: connection refused",
    "Unable to connect to the server: tls: failed to verify certificate: x509: certificate signed by unknown authority",
    'taint "hk3s.dev/validating" not found',
]


@pytest.mark.parametrize("stderr, reason", RETRIED.items())
def test_api_away_is_recognised(stderr: str, reason: str) -> None:
    assert api_unavailable(RemoteCommandError("srv", "kubectl get node", 1, stderr)) == reason


@pytest.mark.parametrize("stderr", RAISED)
def test_other_failures_are_not_outages(stderr: str) -> None:
    assert api_unavailable(RemoteCommandError("srv", "kubectl get node", 1, stderr)) is None


def test_an_ssh_failure_is_not_an_api_outage() -> None:
    assert api_unavailable(SshDeadlineError("srv", "kubectl get node did not finish within 30s")) is None


Answer = Callable[[list[str]], str]


@dataclass
class ScriptedServer:
    """Answers `k3s` commands: `outage` failing calls first (with `stderr`), then `answer`."""

    answer: Answer
    outage: int = 0
    stderr: str = REFUSED
    calls: list[list[str]] = field(default_factory=list)
    target: SshTarget = field(default_factory=lambda: SshTarget(node="srv", address="192.0.2.1", private_key="k"))
    # Commands that take effect even though kubectl reports the API as gone (the reply was lost).
    lost_replies: Sequence[str] = ()

    async def run(self, argv: Sequence[str], *, deadline: float, stdin: str | None = None, **_: Any) -> CommandResult:
        command = list(argv[1:])
        self.calls.append(command)
        if self.outage > 0:
            self.outage -= 1
            if any(word in command for word in self.lost_replies):
                self.answer(command)
            raise RemoteCommandError("srv", " ".join(command[:3]), 1, self.stderr)
        return CommandResult(0, self.answer(command), "")


def cluster(server: ScriptedServer, lines: list[str] | None = None, api_wait: float = 30.0) -> ClusterApi:
    return ClusterApi(cast(SshSession, server), lines.append if lines is not None else None, api_wait)


def node_json(name: str, taints: Sequence[str] = ()) -> str:
    parsed = [Taint.parse(t) for t in taints]
    return json.dumps(
        {
            "metadata": {"name": name},
            "spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in parsed]},
            "status": {},
        }
    )


def test_a_read_waits_for_the_api_and_says_so_once() -> None:
    server = ScriptedServer(lambda _cmd: node_json("w1"), outage=3)
    lines: list[str] = []
    api = cluster(server, lines)
    node = asyncio.run(api.get_node("w1"))
    assert node is not None and node.name == "w1"
    assert len(server.calls) == 4
    assert lines[0] == "waiting for the Kubernetes API on srv: connection refused"
    assert len(lines) == 2 and lines[1].startswith("waited for the Kubernetes API on srv: connection refused, ")
    assert api.waited_seconds > 0


@pytest.mark.parametrize(
    "write",
    [
        lambda api: api.set_labels("w1", {"tier": "web", "old": None}),
        lambda api: api.add_taint("w1", Taint.parse("hk3s.dev/validating=true:NoSchedule")),
        lambda api: api.cordon("w1", True),
        lambda api: api.apply("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
        lambda api: api.patch_merge("configmap", "permits", "kube-system", {"data": {"w1": None}}),
        lambda api: api.delete_token("abcdef"),
    ],
    ids=["label-overwrite", "taint-overwrite", "cordon", "server-side-apply", "merge-patch", "delete-ignore-not-found"],
)
def test_idempotent_writes_are_repeated_through_an_outage(write: Callable[[ClusterApi], Any]) -> None:
    server = ScriptedServer(lambda _cmd: "", outage=2)
    asyncio.run(write(cluster(server)))
    assert len(server.calls) == 3 and server.calls[0] == server.calls[2]


def test_a_taint_removal_checks_what_the_first_try_did() -> None:
    # The removal took effect but its reply was lost to the outage: it is not sent again
    # (a second removal would fail: not found); the node read afterwards shows it is done.
    taints = ["hk3s.dev/validating=true:NoSchedule"]

    def answer(command: list[str]) -> str:
        if command[:2] == ["kubectl", "taint"]:
            taints.clear()
            return ""
        return node_json("w1", taints)

    server = ScriptedServer(answer)
    api = cluster(server)

    async def scenario() -> None:
        original = server.run

        async def run(argv: Sequence[str], **kwargs: Any) -> CommandResult:
            if list(argv[1:3]) == ["kubectl", "taint"]:
                server.outage, server.lost_replies = 1, ("taint",)
            return await original(argv, **kwargs)

        server.run = run  # type: ignore[method-assign]
        await api.remove_taint("w1", "hk3s.dev/validating")

    asyncio.run(scenario())
    verbs = [" ".join(call[:2]) for call in server.calls]
    assert verbs == ["kubectl get", "kubectl taint", "kubectl get"]


def test_a_token_is_never_created_twice_blindly() -> None:
    # `k3s token create` made a token, then the API went away before its reply came back:
    # the token this program never saw is deleted before a new one is made.
    token = "K10" + "a" * 64 + "::abcdef.0123456789abcdef"
    made: list[str] = []
    ids = iter(["lost1x", "abcdef"])

    def answer(command: list[str]) -> str:
        if command[:2] == ["token", "create"]:
            made.append(next(ids))
            return token
        if command[:3] == ["kubectl", "get", "secrets"]:
            description = "dzE="  # base64 of "w1"
            items = [{"metadata": {"name": f"bootstrap-token-{i}"}, "data": {"description": description}} for i in made]
            return json.dumps({"items": items})
        if command[:2] == ["kubectl", "delete"]:
            made.remove(command[-2].removeprefix("bootstrap-token-"))
        return "ok"

    server = ScriptedServer(answer, outage=1, lost_replies=("create",))
    result = asyncio.run(cluster(server).create_join_token("w1"))
    assert result.token_id == "abcdef" and made == ["abcdef"]
    creates = [call for call in server.calls if call[:2] == ["token", "create"]]
    deletes = [call for call in server.calls if call[:2] == ["kubectl", "delete"]]
    assert len(creates) == 2 and len(deletes) == 1 and "bootstrap-token-lost1x" in deletes[0]


@pytest.mark.parametrize("stderr", RAISED[:3])
def test_a_failure_that_is_not_an_outage_is_raised_at_once(stderr: str) -> None:
    server = ScriptedServer(lambda _cmd: "", outage=5, stderr=stderr)
    with pytest.raises(RemoteCommandError) as caught:
        asyncio.run(cluster(server).set_labels("w1", {"tier": "web"}))
    assert len(server.calls) == 1 and not isinstance(caught.value, ApiUnavailableError)


def test_an_api_away_past_the_deadline_stops_naming_server_address_wait_and_setting() -> None:
    server = ScriptedServer(lambda _cmd: "", outage=10_000)
    with pytest.raises(ApiUnavailableError) as caught:
        asyncio.run(cluster(server, api_wait=1.5).nodes())
    message = str(caught.value)
    assert message.startswith("srv: the Kubernetes API at 127.0.0.1:6443 did not answer for 2 s (connection refused")
    assert API_WAIT_SETTING in message and "pulumi up again" in message
    assert 1.5 <= caught.value.waited < 3


def test_after_waiting_in_vain_the_next_calls_try_once() -> None:
    # A failed join's clean-up (token, permit) must not wait the whole deadline again per call.
    server = ScriptedServer(lambda _cmd: "", outage=10_000)
    api = cluster(server, api_wait=1.0)
    with pytest.raises(ApiUnavailableError):
        asyncio.run(api.get_node("w1"))
    before = len(server.calls)
    with pytest.raises(RemoteCommandError):
        asyncio.run(api.delete_token("abcdef"))
    assert len(server.calls) == before + 1
    server.outage = 0
    asyncio.run(api.delete_token("abcdef"))  # the API answers again: waiting is back on
    server.outage = 1
    asyncio.run(api.delete_token("abcdef"))
    assert len(server.calls) == before + 4
