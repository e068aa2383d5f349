"""The teardown guard and what a teardown reads from the state.

The wiring runs under Pulumi mocks (tests/components/mock_engine.py: Hetzner cannot be
reached from here, and mocks plan no deletes); the guard's and the providers' decisions
are their real code, called as the engine calls them. The destroy itself, through the
real engine on lab hosts, is tests/lab/test_teardown.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_settings import load_settings
from components.program import build_cluster, read_credentials
from lab.hcloud_standin import running_standin
from providers.node_join import NodeJoinProvider
from providers.teardown_guard import TeardownGuardProvider, TeardownRefusedError
from tests.components.mock_engine import Recording, run_with_mocks


def _config(key_file: Path, **cluster: Any) -> dict[str, Any]:
    return {
        "cluster": {"name": "t", "k3s_version": "v1.31.4+k3s1", "server_type": "cx23", **cluster},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "network": {"mode": "private"},
        "workers": [{"name": "w1"}, {"name": "metal", "kind": "existing", "address": "198.51.100.250"}],
    }


def _run(config: dict[str, Any]) -> Recording:
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), stack="test")


def test_the_guard_depends_on_every_other_resource(ssh_key_file: Path) -> None:
    """In a destroy the engine deletes a resource only after everything that depends on it:
    the guard, depending on all, is deleted first and alone."""
    graph = _run(_config(ssh_key_file))
    guard = graph.by_name("teardown-guard")
    customs = [r for r in graph.registrations if r.custom and r.urn != guard.urn]
    assert len(customs) > 20
    missing = [r.name for r in customs if r.urn not in guard.dependencies]
    assert missing == [], f"the guard does not depend on {missing}"
    # Nothing depends on the guard: nothing else can be deleted before it.
    assert not [r.name for r in graph.registrations if guard.urn in r.dependencies]
    port = guard.inputs["api_forward_port"]
    assert {k: v for k, v in guard.inputs.items() if k != "__provider"} == {
        "teardown_allowed": False,
        "stack": "test",
        "api_forward_port": port,
    }
    assert 17000 <= port < 27000  # the stack installs Longhorn (the default): its forward's port


def test_allowing_the_teardown_lifts_the_protection_and_reaches_every_deleting_resource(ssh_key_file: Path) -> None:
    refused = _run(_config(ssh_key_file))
    assert sorted(r.name for r in refused.registrations if r.protect) == sorted(
        ["srv", "srv-private", "private-network-network", "private-network-subnet", "private-network-ranges"]
    )
    allowed = _run(_config(ssh_key_file, teardown="allowed"))
    assert [r.name for r in allowed.registrations if r.protect] == []
    assert allowed.by_name("teardown-guard").inputs["teardown_allowed"] is True
    # Every resource whose delete acts on a host reads the flag from its own state.
    for graph, expected in ((refused, False), (allowed, True)):
        for name in ("srv-k3s", "w1-join", "metal-join", "srv-firewall", "w1-firewall", "metal-firewall"):
            assert graph.by_name(name).inputs["teardown_allowed"] is expected, name


def test_the_guard_refuses_a_destroy_unless_the_state_allows_it() -> None:
    provider = TeardownGuardProvider()
    with pytest.raises(TeardownRefusedError) as refused:
        provider.delete("teardown-guard", {"teardown_allowed": False, "stack": "prod"})
    message = str(refused.value)
    assert message.startswith("stack prod: pulumi destroy is refused: hk3s:cluster.teardown is not 'allowed'")
    assert "Nothing was changed" in message and "set hk3s:cluster.teardown: allowed and run pulumi up" in message
    # A state written before the guard had the flag refuses too.
    with pytest.raises(TeardownRefusedError):
        provider.delete("teardown-guard", {})
    provider.delete("teardown-guard", {"teardown_allowed": True, "stack": "prod"})
    # Allowing it is an update of the guard alone, never a replacement.
    diff = provider.diff("teardown-guard", {"teardown_allowed": False}, {"teardown_allowed": True})
    assert diff.changes and not diff.replaces


def test_allowing_the_teardown_is_stored_without_touching_the_host() -> None:
    """The flag changes NodeJoin's inputs: the update stores it and runs nothing (a rejoin
    would log in to 192.0.2.1, TEST-NET-1, which answers nobody)."""
    olds = {
        "node": "w1",
        "address": "192.0.2.1",
        "ssh_port": 22,
        "ssh_user": "root",
        "private_key": "key",
        "labels": {},
        "state": "ready",
        "teardown_allowed": False,
    }
    news = {**olds, "teardown_allowed": True}
    del news["state"]
    provider = NodeJoinProvider()
    diff = provider.diff("w1-join", olds, news)
    assert diff.changes and not diff.replaces
    result = provider.update("w1-join", olds, news)
    assert result.outs is not None
    assert result.outs["teardown_allowed"] is True and result.outs["state"] == "ready"


def test_the_guard_refuses_a_destroy_of_a_longhorn_stack_that_reaches_no_api() -> None:
    """A plain `pulumi destroy` runs no program, so nothing serves the forward's port: refused
    before anything changes, naming the command that runs the program. With the forward
    serving (a listening socket here, as the program's forward is), the destroy goes ahead."""
    import socket  # noqa: PLC0415

    provider = TeardownGuardProvider()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        provider.delete("teardown-guard", {"teardown_allowed": True, "stack": "prod", "api_forward_port": port})
    with pytest.raises(TeardownRefusedError) as refused:
        provider.delete("teardown-guard", {"teardown_allowed": True, "stack": "prod", "api_forward_port": port})
    message = str(refused.value)
    assert f"nothing serves 127.0.0.1:{port}" in message and "Nothing was changed" in message, message
    assert "run pulumi destroy --run-program --stack prod" in message, message
    # Not allowed: the teardown refusal comes first, whatever the forward.
    with pytest.raises(TeardownRefusedError, match=r"hk3s:cluster\.teardown is not 'allowed'"):
        provider.delete("teardown-guard", {"teardown_allowed": False, "stack": "prod", "api_forward_port": port})
    # A stack without Longhorn (port 0) needs no forward.
    provider.delete("teardown-guard", {"teardown_allowed": True, "stack": "prod", "api_forward_port": 0})


def test_a_declared_loss_of_the_control_plane_forgets_the_clusters_objects(ssh_key_file: Path) -> None:
    """hk3s:cluster.control_plane_lost: the in-cluster objects are kept as the state holds them
    (ignore_changes) and forgotten by the destroy (retain_on_delete), and the guard asks for no
    forward (none serves a lost server). Without it, the same objects are deleted through the API."""
    allowed = _run(_config(ssh_key_file, teardown="allowed"))
    lost = _run(_config(ssh_key_file, teardown="allowed", control_plane_lost=True))
    in_cluster = [r.name for r in lost.registrations if r.type.startswith("kubernetes:") and "providers" not in r.type]
    assert {"storage-namespace", "storage-longhorn", "storage-hk3s-one-copy"} <= set(in_cluster), in_cluster
    for name in in_cluster:
        assert lost.by_name(name).retain_on_delete, name
        assert lost.by_name(name).ignore_changes == ["*"], name
        assert allowed.by_name(name).ignore_changes == [], name
    assert not allowed.by_name("storage-longhorn").retain_on_delete
    assert lost.by_name("teardown-guard").inputs["api_forward_port"] == 0
    assert allowed.by_name("teardown-guard").inputs["api_forward_port"] > 0


def test_the_guard_refuses_a_destroy_whose_recorded_hetzner_token_was_rotated_or_revoked() -> None:
    """The deletes at Hetzner run with the token each resource recorded at the last `up`. A token
    rotated or revoked since then is refused before anything changes, saying to record the current
    one with an `up`. The Hetzner API here is the lab's stand-in (a real HTTP server answering 401
    `unauthorized` to a token it does not hold, as Hetzner does), reached through Hetzner's library."""
    provider = TeardownGuardProvider()
    with running_standin() as standin:
        held = {"teardown_allowed": True, "stack": "prod", "hcloud_endpoint": standin.url}
        provider.delete("teardown-guard", {**held, "hcloud_token": standin.token})
        asked = len(standin.requests)
        assert asked >= 1 and all(method == "GET" for method, _ in standin.requests), standin.requests
        revoked = standin.token
        standin.token = "a-token-made-after-the-rotation"
        with pytest.raises(TeardownRefusedError) as refused:
            provider.delete("teardown-guard", {**held, "hcloud_token": revoked})
        message = str(refused.value)
        assert message.startswith("stack prod: pulumi destroy is refused: the Hetzner API at"), message
        assert "unauthorized" in message and "rotated or revoked" in message and "Nothing was changed" in message
        assert "pulumi config set --secret hcloud:token" in message and "pulumi up --yes --stack prod" in message
        assert revoked not in message and standin.token not in message
        assert all(method == "GET" for method, _ in standin.requests), standin.requests
        # Not allowed: that refusal comes first, and Hetzner is not asked.
        before = len(standin.requests)
        with pytest.raises(TeardownRefusedError, match=r"hk3s:cluster\.teardown is not 'allowed'"):
            provider.delete("teardown-guard", {**held, "teardown_allowed": False, "hcloud_token": revoked})
        assert len(standin.requests) == before
        url = standin.url
    # An API that does not answer: the servers could not be deleted either.
    with pytest.raises(TeardownRefusedError, match="the Hetzner API did not answer") as refused:
        provider.delete("teardown-guard", {**held, "hcloud_endpoint": url, "hcloud_token": revoked})
    assert url in str(refused.value)
