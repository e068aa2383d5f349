"""The join's own waits (registration, Ready, the validation pod) through an API outage: time
spent waiting for the API does not count against their deadlines, and the validation pod is
created once however often its creation is sent.

The server is a scripted stand-in for the SSH session to it: it answers the `k3s kubectl`
commands the join sends as kubectl would, and refuses them with kubectl's own words while its
API is "away" (a window of wall-clock time). The deadlines are shortened to a second and the
outages last a few, so a clock that did not stand still would run out in every test here. The
lab restarts the real API under real joins in tests/lab/test_api_outage.py, where the outages
are short against the real deadlines."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

import node_operations.join as join_module
import node_operations.join_validation as validation_module
from node_operations.join import Joiner, JoinError, JoinSpec
from node_operations.join_validation import TaintedNodeValidation, ValidatedNode
from node_operations.k3s_install import K3sBinary
from remote_access.ssh import CommandResult, RemoteCommandError, SshSession, SshTarget

REFUSED = "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?"
NODE = "w1"
POD = f"hk3s-validate-{NODE}"


@dataclass
class ScriptedApi:
    """The server's kubectl over a clock: the API is away from `away[0]` to `away[1]` seconds
    after the start; the Node registers at `registers`, turns Ready at `ready`, and a validation
    pod succeeds `pod_runs` seconds after it was created. An apply sent while the API is away
    takes effect when `lost_replies` (the reply lost, not the request)."""

    away: tuple[float, float] | None = None
    registers: float = 0.0
    ready: float = 0.0
    pod_runs: float = 0.0
    lost_replies: bool = False
    started: float = field(default_factory=time.monotonic)
    pods_created: list[float] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    target: SshTarget = field(default_factory=lambda: SshTarget(node="srv", address="192.0.2.1", private_key="k"))

    def now(self) -> float:
        return time.monotonic() - self.started

    async def run(self, argv: Sequence[str], *, stdin: str | None = None, **_: Any) -> CommandResult:
        command = list(argv[2:])  # after "k3s kubectl"
        self.commands.append(command)
        if self.away is not None and self.away[0] <= self.now() < self.away[1]:
            if self.lost_replies and command[0] == "apply":
                self._apply(stdin or "")
            raise RemoteCommandError("srv", " ".join(command[:3]), 1, REFUSED)
        if command[:2] == ["get", "node"]:
            return CommandResult(0, self._node(), "")
        if command[0] == "apply":
            self._apply(stdin or "")
            return CommandResult(0, "pod/x serverside-applied", "")
        if command[:2] == ["get", "pod"]:
            return CommandResult(0, self._pod(), "")
        if command[:2] in (["delete", "pod"], ["get", "events"]):
            return CommandResult(0, '{"items": []}' if command[1] == "events" else "", "")
        raise AssertionError(f"unexpected command {command}")

    def _apply(self, manifest: str) -> None:
        assert json.loads(manifest)["kind"] == "Pod"
        if not self.pods_created:  # server-side apply: the same object however often it is applied
            self.pods_created.append(self.now())

    def _node(self) -> str:
        if self.now() < self.registers:
            return ""
        ready = "True" if self.now() >= self.ready else "False"
        return json.dumps(
            {
                "metadata": {"name": NODE},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "KubeletNotReady"}]},
            }
        )

    def _pod(self) -> str:
        phase = "Succeeded" if self.pods_created and self.now() >= self.pods_created[0] + self.pod_runs else "Pending"
        return json.dumps({"metadata": {"name": POD}, "status": {"phase": phase}})


class QuietWorker:
    """The worker's SSH session: an agent log with nothing to diagnose, and the server's API port
    open from it (the TCP dial the join makes once its deadline passed)."""

    target = SshTarget(node=NODE, address="192.0.2.2", private_key="k")

    async def run(self, argv: Sequence[str], **_: Any) -> CommandResult:
        assert argv[0] == "journalctl" or "/dev/tcp/192.0.2.1/6443" in argv[-1], argv
        return CommandResult(0, "", "")


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(join_module, "POLL_SECONDS", 0.2)
    monkeypatch.setattr(validation_module, "POLL_SECONDS", 0.2)
    monkeypatch.setattr(validation_module, "VALIDATION_POD_SECONDS", 1.0)


def joiner(api: ScriptedApi, lines: list[str]) -> Joiner:
    spec = JoinSpec(
        node=NODE,
        node_ip="192.0.2.2",
        external_ip="192.0.2.2",
        server_url="https://192.0.2.1:6443",
        ca_hash="0" * 64,
        binary=K3sBinary(version="v1.33.1+k3s1"),
        pod_network="10.42.0.0/16",
        network_mode="public",
        validation_taint="hk3s.dev/validating=true:NoSchedule",
        validation_image="registry.k8s.io/pause:3.10",
        register_deadline=1.0,
        ready_deadline=1.0,
        api_wait=30.0,
    )
    return Joiner(spec, cast(SshSession, QuietWorker()), cast(SshSession, api), lines.append)


def test_the_registration_wait_stands_still_while_the_api_is_away() -> None:
    # Away from 0.3 s to 3.5 s; the Node registers at 4 s: three times the 1 s deadline, all of
    # it but half a second spent waiting for the API.
    api = ScriptedApi(away=(0.3, 3.5), registers=4.0)
    lines: list[str] = []
    node = asyncio.run(joiner(api, lines).wait_registered("2026-01-01 00:00:00"))
    assert node.name == NODE and api.now() >= 4.0
    assert "waiting for the Kubernetes API on srv: connection refused" in lines
    assert any(line.startswith("waited for the Kubernetes API on srv") for line in lines), lines


def test_without_an_outage_the_registration_deadline_holds() -> None:
    # The control: the same late Node with the API up all along is past the deadline.
    api = ScriptedApi(registers=4.0)
    with pytest.raises(JoinError, match="did not register within 1s"):
        asyncio.run(joiner(api, []).wait_registered("2026-01-01 00:00:00"))
    assert api.now() < 2.5


def test_the_ready_wait_stands_still_while_the_api_is_away() -> None:
    api = ScriptedApi(away=(0.3, 3.5), ready=4.0)
    node = asyncio.run(joiner(api, []).wait_ready())
    assert node.ready and api.now() >= 4.0


def test_without_an_outage_the_ready_deadline_holds() -> None:
    api = ScriptedApi(ready=4.0)
    with pytest.raises(JoinError, match="not Ready within 1s"):
        asyncio.run(joiner(api, []).wait_ready())


def validation(api: ScriptedApi, join: Joiner) -> TaintedNodeValidation:
    target = ValidatedNode(
        node=NODE,
        server_url="https://192.0.2.1:6443",
        registry=None,
        validation_taint="hk3s.dev/validating=true:NoSchedule",
        validation_image="registry.k8s.io/pause:3.10",
        kubelet_address="192.0.2.2",
    )
    return TaintedNodeValidation(target, join)


def test_the_validation_pod_wait_stands_still_while_the_api_is_away() -> None:
    # The pod is created at once and runs for 4 s; the API is away for 3.2 of them.
    api = ScriptedApi(away=(0.5, 3.7), pod_runs=4.0)
    join = joiner(api, [])
    asyncio.run(validation(api, join)._validation_pod())
    assert join.checks["validation-pod"].startswith("ok")


def test_without_an_outage_the_validation_pod_deadline_holds() -> None:
    api = ScriptedApi(pod_runs=4.0)
    join = joiner(api, [])
    with pytest.raises(validation_module.ValidationError, match="did not run"):
        asyncio.run(validation(api, join)._validation_pod())


def test_a_validation_pod_whose_creation_reply_was_lost_is_created_once() -> None:
    # The API goes away as the pod is created: the first apply takes effect, its reply is lost.
    # Sent again once the API is back, it leaves the one pod, and the check goes on.
    api = ScriptedApi(lost_replies=True)
    join = joiner(api, [])
    original_run = api.run

    async def away_at_the_apply(argv: Sequence[str], **kwargs: Any) -> CommandResult:
        if argv[2] == "apply" and api.away is None:
            api.away = (api.now(), api.now() + 1.5)
        return await original_run(argv, **kwargs)

    api.run = away_at_the_apply  # type: ignore[method-assign]
    asyncio.run(validation(api, join)._validation_pod())
    applies = [command for command in api.commands if command[0] == "apply"]
    assert len(applies) >= 2, api.commands
    assert len(api.pods_created) == 1
    assert join.checks["validation-pod"].startswith("ok")
