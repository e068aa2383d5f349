"""NodeFence's provider around the fence itself: a fence done stays done when its inputs change,
and a fence is lifted only from a worker that answers. The fence and its lift run in the lab
(tests/lab/test_fence.py)."""

from __future__ import annotations

import socket

import asyncssh
import pytest

from node_operations.refusal import refusal_code
from providers.inputs import NodeLogin
from providers.node_fence import NodeFenceInputs, NodeFenceProvider

KEY = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fence_props(port: int, *, powered_off: bool) -> dict[str, object]:
    """A fence whose worker and server are a closed port: any login would fail the call."""
    return NodeFenceInputs(
        login=NodeLogin(node="w1", address="127.0.0.1", private_key=KEY, ssh_port=port),
        powered_off=powered_off,
        kubeconfig="apiVersion: v1",
        server_node="srv",
        server_address="127.0.0.1",
        server_ssh_port=port,
        kubelet_address="127.0.0.1",
    ).props()


def test_a_changed_flag_keeps_the_fence_done_and_touches_no_host() -> None:
    port = closed_port()
    done = {**fence_props(port, powered_off=False), "recorded_at": "2026-12-03T18:00:00Z", "stopped_by": "ssh"}
    done |= {"pods_deleted": ["default/web-1"], "stopped_services": []}
    news = fence_props(port, powered_off=True)
    assert NodeFenceProvider().diff("w1-fence", done, news).changes
    outs = NodeFenceProvider().update("w1-fence", done, news).outs
    assert outs is not None and outs["powered_off"] is True
    assert (outs["recorded_at"], outs["stopped_by"], outs["pods_deleted"]) == (
        "2026-12-03T18:00:00Z",
        "ssh",
        ["default/web-1"],
    )


def test_lifting_a_fence_whose_worker_does_not_answer_is_refused_and_the_fence_stays() -> None:
    props = fence_props(closed_port(), powered_off=True)
    props |= {"server_url": "https://127.0.0.1:6443", "validation_taint": "hk3s.dev/validating=true:NoSchedule"}
    with pytest.raises(RuntimeError) as refused:
        NodeFenceProvider().delete("w1-fence", props)
    message = str(refused.value)
    assert refusal_code(message) == "fence"
    assert message.startswith("w1: lifting the fence is refused: w1 does not answer over SSH")
    assert "the fence stays" in message and "Nothing was changed" in message
    # The address it tried, and the way to lift a fence whose worker moved (the fence stores the new one first).
    assert f"at {props['address']} (" in message
    assert "put hk3s:fences.w1 back, run up with the new address" in message


def test_a_fence_recorded_without_the_rejoin_settings_is_not_lifted() -> None:
    with pytest.raises(RuntimeError) as refused:
        NodeFenceProvider().delete("w1-fence", fence_props(closed_port(), powered_off=False))
    message = str(refused.value)
    assert refusal_code(message) == "capability-missing"
    assert message.startswith("w1: lifting a fence recorded by an earlier release (put hk3s:fences back")


def test_a_teardown_lifts_no_fence() -> None:
    # The worker is wiped by its join's delete; a closed port shows no host is reached here.
    NodeFenceProvider().delete("w1-fence", {**fence_props(closed_port(), powered_off=True), "teardown_allowed": True})


def test_a_fence_that_cannot_reach_the_server_fails_naming_it() -> None:
    with pytest.raises(RuntimeError) as failed:
        NodeFenceProvider().create(fence_props(closed_port(), powered_off=True))
    assert str(failed.value).startswith("srv: "), failed.value


def test_the_fence_order_carries_the_hetzner_server_and_api_access() -> None:
    props = fence_props(closed_port(), powered_off=False)
    props |= {"hcloud_server": "4711", "hcloud_token": "secret-token", "hcloud_endpoint": None}
    order = NodeFenceInputs.from_props(props).fence_order()
    assert order.hcloud_server == "4711" and order.hcloud is not None
    assert order.hcloud.token == "secret-token" and order.hcloud.endpoint == "https://api.hetzner.cloud/v1"
    assert "secret-token" not in repr(order)
    plain = NodeFenceInputs.from_props(fence_props(closed_port(), powered_off=True)).fence_order()
    assert plain.hcloud_server is None and plain.hcloud is None and plain.powered_off


def test_consent_to_stale_copies_reaches_the_server_only_while_workloads_stay_stopped() -> None:
    port = closed_port()
    done = {**fence_props(port, powered_off=False), "recorded_at": "2026-12-03T18:00:00Z", "stopped_by": "ssh"}
    consent = {**fence_props(port, powered_off=False), "accept_stale_data": True}
    # Nothing stopped: the consent is stored, no host is reached (the closed port would fail it).
    outs = NodeFenceProvider().update("w1-fence", {**done, "stopped_services": []}, consent).outs
    assert outs is not None and outs["accept_stale_data"] is True and outs["stopped_services"] == []
    # Workloads stopped: the consent starts them through the server (here unreachable: named).
    stopped = {**done, "stopped_services": ["Deployment default/db stays stopped: ..."]}
    with pytest.raises(RuntimeError) as failed:
        NodeFenceProvider().update("w1-fence", stopped, consent)
    assert str(failed.value).startswith("srv: "), failed.value


def test_a_new_address_updates_the_fence_which_lifts_there(capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    done = {**fence_props(port, powered_off=False), "recorded_at": "2026-12-03T18:00:00Z", "stopped_by": "ssh"}
    moved = {**fence_props(port, powered_off=False), "address": "127.0.0.2", "kubelet_address": "127.0.0.2"}
    diff = NodeFenceProvider().diff("w1-fence", done, moved)
    # Not a replacement, which would lift the fence at the old address and fence the worker again.
    assert diff.changes and not diff.replaces and not diff.delete_before_replace
    outs = NodeFenceProvider().update("w1-fence", done, moved).outs
    assert outs is not None and outs["address"] == "127.0.0.2" and outs["recorded_at"] == "2026-12-03T18:00:00Z"
    assert "[w1] fenced: its address is now 127.0.0.2 (was 127.0.0.1); lifting the fence logs in there" in (
        capsys.readouterr().err
    )
