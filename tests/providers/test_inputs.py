"""The typed inputs between components and providers: stored under the same keys the
resources always used, read back tolerantly from a state an earlier release wrote, and a
key a provider names that is no input fails at once. Plain data: no engine, no host."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from node_operations.k3s_install import K3sBinary
from providers.disk_probe import DiskProbeInputs
from providers.inputs import K3sRelease, NodeLogin
from providers.node_access_check import NodeAccessCheckInputs, RecordedHost
from providers.node_join import DEFAULT_VALIDATION_IMAGE, NodeJoinInputs
from providers.teardown_guard import TeardownGuardInputs
from remote_access.kube import API_WAIT_SECONDS

LOGIN = NodeLogin(
    node="w1", address="198.51.100.7", private_key="KEY", ssh_port=2222, recorded_host_key="ssh-ed25519 A"
)


def _join(**changes: object) -> NodeJoinInputs:
    inputs = NodeJoinInputs(
        login=LOGIN,
        server_node="srv",
        server_address="198.51.100.1",
        server_url="https://10.0.0.2:6443",
        ca_hash="abc",
        k3s=K3sRelease(k3s_version="v1.31.4+k3s1"),
        network_mode="private",
        node_ip="10.0.0.3",
        node_external_ip="198.51.100.7",
        validation_taint="hk3s.dev/validating=true:NoSchedule",
        pod_network="wireguard",
    )
    return dataclasses.replace(inputs, **changes)  # type: ignore[arg-type]


def test_groups_are_stored_flat_under_the_keys_resources_always_used() -> None:
    props = _join().props()
    assert {"node", "address", "ssh_port", "ssh_user", "private_key", "recorded_host_key"} <= set(props)
    assert {"k3s_version", "k3s_binary", "k3s_sha256"} <= set(props)
    assert "login" not in props and "k3s" not in props
    assert props["ssh_port"] == 2222 and props["k3s_version"] == "v1.31.4+k3s1"


def test_stored_inputs_read_back_the_same() -> None:
    inputs = _join(labels={"a": "b"}, taints=["x=y:NoSchedule"])
    assert NodeJoinInputs.from_props(inputs.props()) == inputs
    access = NodeAccessCheckInputs(login=LOGIN, nodes=[RecordedHost(node="w2", address="198.51.100.8")])
    stored = access.props()
    assert stored["nodes"] == [
        {"node": "w2", "address": "198.51.100.8", "ssh_port": 22, "host_key": None, "firewall_managed": True}
    ]
    assert NodeAccessCheckInputs.from_props(stored) == access


def test_a_state_from_an_earlier_release_reads_with_defaults() -> None:
    # Written before api_wait_seconds, validation_image, taints and teardown_allowed existed,
    # with a key since removed (peers), the outputs and the provider beside the inputs.
    old = {
        key: value
        for key, value in _join().props().items()
        if key not in ("api_wait_seconds", "validation_image", "taints", "teardown_allowed") and value is not None
    }
    old.update(peers=["w2"], state="ready", __provider="pickled")
    read = NodeJoinInputs.from_props(old)
    assert read.api_wait_seconds == API_WAIT_SECONDS and read.validation_image == DEFAULT_VALIDATION_IMAGE
    assert read.taints == [] and read.teardown_allowed is False
    assert read.login == LOGIN
    assert TeardownGuardInputs.from_props({}) == TeardownGuardInputs(teardown_allowed=False, stack="this stack")


def test_a_missing_required_input_names_itself() -> None:
    props = _join().props()
    del props["ca_hash"]
    with pytest.raises(KeyError, match="ca_hash"):
        NodeJoinInputs.from_props(props)


def test_a_key_that_is_no_input_fails_at_once() -> None:
    assert DiskProbeInputs.names("node", "recorded_host_key", "join_run") == ("node", "recorded_host_key", "join_run")
    with pytest.raises(AttributeError, match="DiskProbeInputs has no input disk_pth"):
        DiskProbeInputs.names("disk_pth")


def test_the_k3s_release_gives_the_binary_once_for_server_and_workers() -> None:
    release = K3sRelease(k3s_version="v1.31.4+k3s1", k3s_binary="/opt/k3s", k3s_sha256="a" * 64)
    assert release.binary() == K3sBinary(version="v1.31.4+k3s1", local_path=Path("/opt/k3s"), sha256="a" * 64)
    assert K3sRelease(k3s_version="v1.31.4+k3s1").binary() == K3sBinary("v1.31.4+k3s1", None, None)
