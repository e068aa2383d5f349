"""A changed login key alone (hk3s:ssh.private_key_file rotated) stores the new key in each
resource's state and runs nothing on any host; with another change the real update runs."""

from __future__ import annotations

from typing import Any

import pytest

from node_operations.login_keys import key_fingerprint
from providers.k3s_server import K3sServerProvider
from providers.login_key import NodeLoginKeyProvider
from providers.node_join import NodeJoinProvider
from remote_access.ssh import SshError

JOINED = {
    "node": "w1",
    "address": "198.51.100.7",
    "private_key": "old-key",
    "k3s_version": "v1.31.4+k3s1",
    "labels": {"tier": "web"},
    "recorded_nodes": ["srv", "w1"],
    "state": "ready",
}


def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("a host operation ran for a login key change")


def test_a_key_change_alone_touches_no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NodeJoinProvider, "_join", _refuse)
    news = {key: value for key, value in JOINED.items() if key != "state"}
    # Context that changed too but that the join's own diff ignores: still no rejoin.
    news.update(private_key="new-key", recorded_nodes=["srv", "w1", "w2"])
    result = NodeJoinProvider().update("w1-join", dict(JOINED), news)
    assert result.outs is not None
    assert result.outs["private_key"] == "new-key" and result.outs["state"] == "ready"
    assert result.outs["recorded_nodes"] == ["srv", "w1", "w2"]


def test_a_key_change_with_a_real_change_runs_the_update(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def join(
        _self: NodeJoinProvider, props: dict[str, Any], old_labels: Any = None, old_taints: Any = None
    ) -> dict[str, Any]:
        calls.append(props)
        return props

    monkeypatch.setattr(NodeJoinProvider, "_join", join)
    # A cluster registry configured: a rejoin (labels alone would be set through the API, and a
    # new k3s release alone recorded once K3sUpgrade moved the worker: neither rejoins).
    news = {
        **{k: v for k, v in JOINED.items() if k != "state"},
        "private_key": "new-key",
        "registry": "registry.example:5000",
    }
    NodeJoinProvider().update("w1-join", dict(JOINED), news)
    assert [c["private_key"] for c in calls] == ["new-key"]


def test_every_node_provider_but_the_rotation_is_guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(K3sServerProvider, "_install", _refuse)
    olds = {"node": "srv", "address": "198.51.100.5", "private_key": "old-key", "pod_cidr": "10.42.0.0/16"}
    K3sServerProvider().update("srv-k3s", olds, {**olds, "private_key": "new-key"})
    monkeypatch.setattr(NodeLoginKeyProvider, "_rotate", lambda self, props, previous: {**props, "rotated": previous})
    outs = NodeLoginKeyProvider().update("srv-login-key", olds, {**olds, "private_key": "new-key"}).outs
    assert outs is not None and outs["rotated"] == ["old-key"]


def _key() -> str:
    import asyncssh  # noqa: PLC0415 - as the program loads it

    return str(asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())


def _unreachable(*_args: Any, **_kwargs: Any) -> Any:
    raise SshError("w1", "cannot connect to 198.51.100.7:22: [Errno 113] No route to host")


def test_a_fenced_workers_rotation_waits_for_its_host_and_stays_pending(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fence never waits on its own worker's login key: a rotation a fenced worker's host
    cannot take now keeps the previous key in the state (the next diff still finds it) and says
    so; an unfenced worker's failure stops the run as before."""
    monkeypatch.setattr(NodeLoginKeyProvider, "_rotate", _unreachable)
    old, new = _key(), _key()
    olds = {"node": "w1", "address": "198.51.100.7", "private_key": old, "host_key": "ssh-ed25519 AAAA"}
    news = {**olds, "private_key": new, "fenced": True}
    provider = NodeLoginKeyProvider()
    outs = provider.update("w1-login-key", dict(olds), dict(news)).outs
    assert outs == olds
    said = capsys.readouterr().err
    assert f"[w1] fenced: its login key rotation {key_fingerprint(old)} -> {key_fingerprint(new)} waits until" in said
    assert "(cannot connect to 198.51.100.7:22: [Errno 113] No route to host)" in said
    assert provider.diff("w1-login-key", outs, news).changes
    # Whether the worker is fenced is no change of its own.
    assert not provider.diff("w1-login-key", {**olds, "fenced": False}, {**olds, "fenced": True}).changes
    with pytest.raises(SshError, match="cannot connect"):
        provider.update("w1-login-key", dict(olds), {**news, "fenced": False})
