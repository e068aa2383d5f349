"""Host keys known before first contact: each Hetzner server gets an SSH host key the
program generated, through cloud-init `user_data` at creation, kept secret, and pinned.

Hetzner Cloud cannot be reached from the test machine, so the engine and Hetzner are
mocked (tests/components/mock_engine.py). The host keys themselves are real: the mock
answers each HostKeyPair with what its provider's `create` generates.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pulumi
import yaml

from cluster_settings import load_settings
from components.program import build_cluster, read_credentials
from providers.host_key_pair import HostKeyPairProvider, cloud_config
from tests.components.mock_engine import ClusterMocks, Recording, run_with_mocks
from tests.components.test_hetzner_guards import _config


class KeyMocks(ClusterMocks):
    """ClusterMocks whose HostKeyPairs hold keys their provider generated."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.generated: dict[str, dict[str, Any]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        if args.typ.endswith("hk3s:HostKeyPair"):
            created = HostKeyPairProvider().create(dict(args.inputs))
            # By resource: a server has its first key (<node>-host-key) and its replacement.
            node = args.inputs["node"]
            key = node if args.name == f"{node}-host-key" else args.name
            self.generated[key] = dict(created.outs or {})
            return created.id, dict(created.outs or {})
        return super().new_resource(args)


def _plain(value: Any) -> Any:
    """An input as the engine received it, a secret's wrapper taken off."""
    return value["value"] if isinstance(value, dict) and "value" in value else value


def _run(config: dict[str, Any], mocks: ClusterMocks) -> Recording:
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), mocks=mocks)


def test_each_hetzner_server_gets_its_generated_host_key_as_secret_user_data(ssh_key_file: Path) -> None:
    mocks = KeyMocks()
    graph = _run(_config(ssh_key_file), mocks)
    # The existing host "metal" gets none.
    assert sorted(mocks.generated) == [
        "srv",
        "srv-host-key-replacement",
        "w1",
        "w1-host-key-replacement",
        "w2",
        "w2-host-key-replacement",
    ]
    for node in ("srv", "w1", "w2"):
        pair = graph.by_name(f"{node}-host-key")
        assert "private_key" in pair.additional_secret_outputs
        (server,) = [r for r in graph.of_type("hcloud:index/server:Server") if r.name == node]
        assert server.is_secret("userData"), node
        assert "userData" in server.additional_secret_outputs and "userData" in server.ignore_changes
        user_data = _plain(server.inputs["userData"])
        assert user_data.startswith("#cloud-config\n")
        document = yaml.safe_load(user_data)
        keys = mocks.generated[node]
        assert document["ssh_keys"] == {"ed25519_private": keys["private_key"], "ed25519_public": keys["public_key"]}
        assert document["ssh_genkeytypes"] == [] and document["ssh_deletekeys"] is True


def test_the_first_login_is_pinned_to_the_generated_key(ssh_key_file: Path) -> None:
    mocks = KeyMocks()
    graph = _run(_config(ssh_key_file), mocks)
    for node in ("srv", "w1", "w2"):
        public = mocks.generated[node]["public_key"]
        assert public.startswith("ssh-ed25519 ")
        assert graph.by_name(f"{node}-probe").inputs["recorded_host_key"] == public, node
        assert graph.by_name(f"{node}-login-key").inputs["recorded_host_key"] == public, node
    # An existing host has no key the program made: nothing is pinned unless the stack records one.
    assert graph.by_name("metal-probe").inputs.get("recorded_host_key") is None


def test_a_key_the_stack_records_wins_and_an_older_server_keeps_its_recorded_key(ssh_key_file: Path) -> None:
    recorded = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJs7uk0rUSnm8T1IyiW2eZ4KCvGpKDaNrALiMKlhhVbM"
    # w2 was created by an earlier release: Hetzner hands back no user data for it.
    mocks = KeyMocks(server_state={"w2": {"userData": ""}})
    graph = _run(_config(ssh_key_file, ssh={"host_keys": {"w1": recorded}}), mocks)
    assert graph.by_name("w1-probe").inputs["recorded_host_key"] == recorded
    # Not the generated key, which that server never got: the probe's state keeps the key it recorded.
    assert graph.by_name("w2-probe").inputs.get("recorded_host_key") is None


def test_the_generated_key_is_a_real_key_and_never_regenerated(tmp_path: Path) -> None:
    provider = HostKeyPairProvider()
    created = provider.create({"node": "w1"})
    outs = dict(created.outs or {})
    assert created.id == "w1-host-key"
    (tmp_path / "key").write_text(outs["private_key"])
    (tmp_path / "key").chmod(0o600)
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(tmp_path / "key")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert derived[:2] == outs["public_key"].split()[:2]
    # No input change makes a new key: the server holds this one from its creation.
    assert provider.diff("w1-host-key", outs, {"node": "w1", "private_key": None, "public_key": None}).changes is False
    assert provider.update("w1-host-key", outs, {"node": "w1"}).outs == outs
    assert "ed25519_private" in yaml.safe_load(cloud_config(outs["private_key"], outs["public_key"]))["ssh_keys"]


def test_the_key_given_in_user_data_is_replaced_by_one_never_in_it(ssh_key_file: Path) -> None:
    """Each server's login key resource gets a second generated key, a secret, that replaces the
    one in user_data at its creation (tests/lab/test_host_key_trust.py does it on a real host); the
    existing host gets none."""
    mocks = KeyMocks()
    graph = _run(_config(ssh_key_file), mocks)
    for node in ("srv", "w1", "w2"):
        replacement = mocks.generated[f"{node}-host-key-replacement"]
        assert replacement["public_key"] != mocks.generated[node]["public_key"]
        login_key = graph.by_name(f"{node}-login-key")
        assert login_key.is_secret("replacement_host_key"), node
        assert _plain(login_key.inputs["replacement_host_key"]) == replacement["private_key"]
        assert login_key.inputs["replacement_host_public_key"] == replacement["public_key"]
        server = next(r for r in graph.of_type("hcloud:index/server:Server") if r.name == node)
        assert replacement["private_key"] not in _plain(server.inputs["userData"])
    assert graph.by_name("metal-login-key").inputs.get("replacement_host_key") is None
