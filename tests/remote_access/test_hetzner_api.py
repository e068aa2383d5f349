"""The program's Hetzner API client against the lab's Hetzner API stand-in (a real HTTP server,
Hetzner's own library in between): power off and on, the action waited for, the status
confirmed, and every error naming the server, the call, Hetzner's answer and the fix."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from lab.hcloud_standin import HcloudStandin, SwitchedMachine, running_standin
from remote_access import hetzner_api
from remote_access.hetzner_api import HetznerAccess, HetznerApiError, power_off, power_on, server_state

FakeMachine = SwitchedMachine


@pytest.fixture
def standin() -> Iterator[HcloudStandin]:
    with running_standin() as running:
        yield running


def access(standin: HcloudStandin, token: str | None = None) -> HetznerAccess:
    return HetznerAccess(token or standin.token, standin.url)


def off(standin: HcloudStandin, server: str) -> tuple[hetzner_api.ServerState, hetzner_api.ActionResult | None]:
    return asyncio.run(power_off(access(standin), server, lambda _line: None))


def test_power_off_waits_for_the_action_and_confirms_the_status_off(standin: HcloudStandin) -> None:
    machine = FakeMachine()
    server = standin.add_server("worker-1", machine)
    lines: list[str] = []
    state, action = asyncio.run(power_off(access(standin), str(server), lines.append))
    assert state.status == "off" and state.id == server and state.name == "worker-1"
    assert action is not None and action.command == "stop_server"
    assert not machine.is_running
    assert [a.status for a in standin.power_actions(server)] == ["success"]
    assert ("POST", f"/v1/servers/{server}/actions/poweroff") in standin.requests
    assert ("GET", f"/v1/actions/{action.id}") in standin.requests
    assert any("powering off Hetzner server worker-1" in line for line in lines), lines


def test_a_server_is_found_by_name_and_one_already_off_is_left_alone(standin: HcloudStandin) -> None:
    machine = FakeMachine(is_running=False)
    server = standin.add_server("worker-2", machine)
    state, action = off(standin, "worker-2")
    assert state.id == server and state.status == "off" and action is None
    assert standin.power_actions(server) == []


def test_a_failed_action_names_its_error_and_leaves_the_host_running(standin: HcloudStandin) -> None:
    machine = FakeMachine()
    server = standin.add_server("worker-3", machine)
    standin.fail_actions(server, "action_failed", "host is unreachable")
    with pytest.raises(HetznerApiError) as raised:
        off(standin, str(server))
    action = standin.power_actions(server)[0]
    message = str(raised.value)
    assert f"poweroff action {action.id} (stop_server)" in message, message
    assert "worker-3" in message and "ended in error: action_failed: host is unreachable" in message, message
    assert machine.is_running


def test_a_wrong_token_is_named_with_hetzners_answer_and_never_shown(standin: HcloudStandin) -> None:
    server = standin.add_server("worker-4", FakeMachine())
    wrong = "not-the-token-0123456789"
    with pytest.raises(HetznerApiError) as raised:
        asyncio.run(power_off(access(standin, wrong), str(server), lambda _line: None))
    message = str(raised.value)
    assert "Hetzner answered unauthorized: unable to authenticate" in message, message
    assert "hcloud:token" in message and wrong not in message and standin.token not in message
    assert standin.requests == []  # refused before anything was read or done
    assert wrong not in repr(access(standin, wrong))


def test_unknown_servers_are_named(standin: HcloudStandin) -> None:
    with pytest.raises(HetznerApiError, match=r"no Hetzner server with id 99 .*not_found"):
        asyncio.run(server_state(access(standin), "99"))
    with pytest.raises(HetznerApiError, match=r"no Hetzner server named 'nowhere'.*hcloud_server"):
        asyncio.run(server_state(access(standin), "nowhere"))


def test_a_second_action_while_one_runs_is_locked(standin: HcloudStandin) -> None:
    server = standin.add_server("worker-5", FakeMachine())
    client = access(standin).client()
    client.servers.power_off(client.servers.get_by_id(server))
    with pytest.raises(HetznerApiError, match=r"Hetzner answered locked: .*running action"):
        off(standin, str(server))


def test_a_server_not_off_after_its_action_is_reported(standin: HcloudStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hetzner_api, "STATUS_OFF_SECONDS", 2.0)
    server = standin.add_server("worker-6", FakeMachine(stuck=True))
    with pytest.raises(HetznerApiError, match=r"worker-6 \(id \d+\) reads 'running', not 'off'"):
        off(standin, str(server))


def test_power_on_starts_a_server_that_is_off(standin: HcloudStandin) -> None:
    machine = FakeMachine(is_running=False)
    server = standin.add_server("worker-7", machine)
    state, action = asyncio.run(power_on(access(standin), str(server), lambda _line: None))
    assert action is not None and action.command == "start_server" and machine.is_running
    assert asyncio.run(power_on(access(standin), str(server), lambda _line: None))[1] is None
    assert state.id == server


def test_an_endpoint_that_does_not_answer_is_named() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    unreachable = HetznerAccess("token", f"http://127.0.0.1:{port}/v1")
    with pytest.raises(HetznerApiError, match=r"did not answer .*hcloud:endpoint") as raised:
        asyncio.run(server_state(unreachable, "4711"))
    assert "token" not in str(raised.value).replace("hcloud:token", "")


def test_the_server_state_carries_its_addresses_as_hetzner_reports_them(standin: HcloudStandin) -> None:
    """The fence proves a server is the worker by its addresses: public IPv4 and private IPs, read
    through Hetzner's own library from `public_net` and `private_net` (a server behind no public
    IPv4 has `ipv4: null`), each private one with the id of its network (`private_net[].network`),
    and by its labels."""
    labels = {"hk3s-owner": "hk3s.dev", "hk3s-node": "worker-1"}
    both = standin.add_server(
        "worker-1", FakeMachine(), public_ipv4="203.0.113.7", private_ips=("10.0.1.7",), network=41, labels=labels
    )
    private_only = standin.add_server(
        "worker-2", FakeMachine(), public_ipv4=None, private_ips=("10.0.1.8",), network=42
    )
    state = asyncio.run(server_state(access(standin), str(both)))
    assert (state.public_ipv4, state.private_ips) == ("203.0.113.7", ("10.0.1.7",))
    assert state.private_net == (hetzner_api.PrivateAddress(41, "10.0.1.7"),) and state.labels == labels
    assert state.owns("203.0.113.7") and state.owns("10.0.1.7") and not state.owns("10.0.1.8")
    # A private address is the server's only in its own network.
    assert state.owns("10.0.1.7", {41}) and not state.owns("10.0.1.7", {42}) and not state.owns("10.0.1.7", set())
    assert state.owns("203.0.113.7", set())  # a public address is unique everywhere
    assert state.addresses() == ["203.0.113.7", "10.0.1.7 in Hetzner network 41"]
    other = asyncio.run(server_state(access(standin), "worker-2"))
    assert other.id == private_only and other.public_ipv4 is None and other.private_ips == ("10.0.1.8",)
    assert other.private_net[0].network == 42 and other.labels == {}
    v6 = hetzner_api.ServerState(1, "v6", "running", public_ipv6="2001:db8:1::/64")
    assert v6.owns("2001:db8:1::1") and not v6.owns("2001:db8:2::1") and not v6.owns("203.0.113.7")
