"""The worker roster's judgement of a leaving worker, with real TCP: a closed port on this
machine stands for a host that does not answer. No removal runs here (that needs a cluster:
tests/lab/test_worker_removal.py)."""

from __future__ import annotations

import socket

import asyncssh
import pytest

from node_operations.refusal import refusal_code
from providers.worker_roster import RosterMember, WorkerRosterInputs, WorkerRosterProvider, operator_firewalls

KEY = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def roster(workers: list[str], port: int, *, key: str | None = KEY, managed: bool = True) -> dict:
    members = [
        RosterMember(node=name, address="127.0.0.1", ssh_port=port, firewall_managed=managed) for name in workers
    ]
    return WorkerRosterInputs(
        workers=workers,
        server=RosterMember(node="srv", address="127.0.0.1", ssh_port=port, firewall_managed=managed),
        members=members,
        private_key=key,
        pod_network="vxlan",
    ).props()


def test_a_leaving_worker_that_does_not_answer_is_refused_naming_it_and_the_fence() -> None:
    port = closed_port()
    result = WorkerRosterProvider().check(roster(["w1", "w2"], port), roster(["w1"], port))
    assert len(result.failures) == 1
    message = result.failures[0].reason
    assert message.startswith("w2: removing the worker is refused: does not answer over SSH"), message
    assert "cannot connect to 127.0.0.1" in message, message
    assert "fence it first (hk3s:fences.w2)" in message and "Nothing was changed" in message
    assert refusal_code(message) == "removal"


def test_a_give_up_whose_fence_cannot_be_read_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Whether the fence completed is read from the cluster: with the server not answering, the
    give-up is refused at check (the lab tests the rest: tests/lab/test_fence.py, test_fence_hcloud.py)."""
    port = closed_port()
    leaving = {**roster(["w1"], port), "forced": ["w2"]}
    failures = WorkerRosterProvider().check(roster(["w1", "w2"], port), leaving).failures
    assert len(failures) == 1, failures
    message = failures[0].reason
    assert message.startswith("w2: giving the worker up is refused: whether its fence completed cannot be read"), (
        message
    )
    assert "Nothing was changed" in message and refusal_code(message) == "removal"
    assert WorkerRosterProvider().diff("r", roster(["w1", "w2"], port), leaving).changes is True
    assert "[w2] plan: given up (fenced, force_remove): deregistered without a drain" in capsys.readouterr().err


def test_staying_workers_and_a_new_one_are_not_judged() -> None:
    port = closed_port()
    result = WorkerRosterProvider().check(roster(["w1"], port), roster(["w1", "w3"], port))
    assert result.failures == []


def test_a_leaving_worker_recorded_without_a_login_is_refused_with_the_way_out() -> None:
    port = closed_port()
    earlier = {"workers": ["w1", "w2"]}  # the state an earlier release wrote: names only
    result = WorkerRosterProvider().check(earlier, roster(["w1"], port))
    assert "w2: removing the worker is refused: the stack holds no login for it" in result.failures[0].reason
    assert "put it back in the stack, run up once, then remove it" in result.failures[0].reason


def test_a_changed_login_is_stored_and_a_same_roster_is_no_change() -> None:
    provider = WorkerRosterProvider()
    assert not provider.diff("workers", roster(["w1"], 22), roster(["w1"], 22)).changes
    assert provider.diff("workers", roster(["w1"], 22), roster(["w1"], 2222)).changes
    assert provider.diff("workers", {"workers": ["w1"]}, roster(["w1"], 22)).changes


def test_operator_run_firewalls_get_the_ports_the_leaving_worker_used() -> None:
    inputs = WorkerRosterInputs.from_props(roster(["w1", "w2"], 22, managed=False))
    peers = operator_firewalls(inputs, "w2")
    assert [(p.node, p.ports) for p in peers] == [
        ("srv", ("6443/tcp", "8472/udp", "10250/tcp")),
        ("w1", ("8472/udp", "10250/tcp")),
    ]
    assert operator_firewalls(WorkerRosterInputs.from_props(roster(["w1", "w2"], 22)), "w2") == []


def test_a_login_not_known_yet_is_an_update_and_never_a_replacement() -> None:
    # While the engine weighs replacing a worker's host probe (its new address), the member's
    # login reaches the diff as one unknown value.
    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's placeholder for an unknown value
    news = roster(["w1"], 22)
    news["members"] = [unknown]
    result = WorkerRosterProvider().diff("workers", roster(["w1"], 22), news)
    assert result.changes and not result.replaces
    assert WorkerRosterProvider().diff("workers", roster(["w1"], 22), {**roster(["w1"], 22), "server": unknown}).changes
