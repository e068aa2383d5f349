"""NodeFence's provider around the fence itself: a fence done stays done when its inputs change,
and lifting it is refused in this release. The fence runs in the lab (tests/lab/test_fence.py)."""

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


def test_lifting_a_fence_is_refused_naming_the_worker() -> None:
    with pytest.raises(RuntimeError) as refused:
        NodeFenceProvider().delete("w1-fence", fence_props(closed_port(), powered_off=False))
    message = str(refused.value)
    assert refusal_code(message) == "capability-missing"
    assert message.startswith("w1: lifting the fence") and "Nothing was changed on the host" in message


def test_a_fence_that_cannot_reach_the_server_fails_naming_it() -> None:
    with pytest.raises(RuntimeError) as failed:
        NodeFenceProvider().create(fence_props(closed_port(), powered_off=True))
    assert str(failed.value).startswith("srv: "), failed.value
