"""What guards the Hetzner machines, the network and the operator's key, under Pulumi mocks.

Hetzner Cloud cannot be reached from the test machine, so the engine and Hetzner are
mocked (tests/components/mock_engine.py): the monitor records each resource's options as
the engine receives them (protect, ignoreChanges, dependencies), and the mocks answer the
`getSshKeys` data source with the keys a test says the project holds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings
from components.hetzner_ssh_key import OWNER_LABEL, STACK_ID_LABEL, hetzner_fingerprint
from components.program import build_cluster, read_credentials
from providers.network_ranges import NetworkRangesProvider
from tests.components.mock_engine import ClusterMocks, Recording, run_with_mocks

SERVER = "hcloud:index/server:Server"
SSH_KEY = "hcloud:index/sshKey:SshKey"
PROJECT_KEY = "hk3s:ProjectSshKey"
# As the engine receives them: the SDK translates the Python names to the provider's.
CREATION_ONLY = {"sshKeys", "image", "location", "datacenter", "userData", "serverType"}


def _config(key_file: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "cluster": {"name": "t", "k3s_version": "v1.31.4+k3s1", "server_type": "cx23"},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "network": {"mode": "private"},
        "workers": [{"name": "w1"}, {"name": "w2"}, {"name": "metal", "kind": "existing", "address": "198.51.100.250"}],
    }
    for key, value in overrides.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    return config


def _run(config: dict[str, Any], mocks: ClusterMocks | None = None, stack: str = "test") -> Recording:
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), mocks=mocks, stack=stack)


def _server(graph: Recording, name: str) -> Any:
    (found,) = [r for r in graph.of_type(SERVER) if r.name == name]
    return found


def _fingerprint(key_file: Path) -> str:
    return hetzner_fingerprint(key_file.with_name(key_file.name + ".pub").read_text())


def _public_key(key_file: Path) -> str:
    return key_file.with_name(key_file.name + ".pub").read_text().strip()


def test_hetzner_fingerprint_is_what_ssh_keygen_prints_as_md5(tmp_path: Path) -> None:
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    printed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "md5", "-f", str(key) + ".pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert printed == "MD5:" + hetzner_fingerprint((tmp_path / "id.pub").read_text())


def test_every_server_ignores_its_creation_only_inputs(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file))
    servers = graph.of_type(SERVER)
    assert sorted(s.name for s in servers) == ["srv", "w1", "w2"]
    for server in servers:
        assert set(server.ignore_changes) >= CREATION_ONLY, server.name


def test_control_plane_machine_network_and_subnet_are_protected_by_default(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file))
    protected = sorted(r.name for r in graph.registrations if r.protect)
    assert protected == sorted(
        ["srv", "srv-private", "private-network-network", "private-network-subnet", "private-network-ranges"]
    )
    # Workers come and go: their machines are not protected.
    assert not _server(graph, "w1").protect and not graph.by_name("w1-private").protect
    # The network's ranges never change on Hetzner's side either.
    assert set(graph.by_name("private-network-network").ignore_changes) == {"ipRange"}
    assert set(graph.by_name("private-network-subnet").ignore_changes) == {"ipRange", "networkZone"}


def test_protection_is_off_when_the_setting_says_so(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file, cluster={"protect_control_plane": False}))
    assert [r.name for r in graph.registrations if r.protect] == []
    # The creation-only inputs stay ignored: protection is about deletes.
    assert set(_server(graph, "srv").ignore_changes) >= CREATION_ONLY


def test_a_worker_machine_goes_only_after_its_join(ssh_key_file: Path) -> None:
    """Pulumi deletes a resource after everything that depends on it: the NodeJoin's delete
    (the worker's remove path) runs before its server's."""
    graph = _run(_config(ssh_key_file))
    for worker in ("w1", "w2"):
        assert _server(graph, worker).urn in graph.by_name(f"{worker}-join").dependencies


def test_network_ranges_are_checked_before_the_network() -> None:
    """The record whose check refuses a changed range at preview (the engine checks a resource
    when it is registered, before anything that depends on it)."""
    provider = NetworkRangesProvider()
    olds = {"network_range": "10.0.0.0/16", "subnet_range": "10.0.1.0/24"}
    same = provider.check(olds, dict(olds))
    assert same.failures == []
    changed = provider.check(olds, {"network_range": "10.1.0.0/16", "subnet_range": "10.0.1.0/24"})
    assert [f.property for f in changed.failures] == ["network_range"]
    reason = changed.failures[0].reason
    assert "hk3s:network.private_network_cidr was 10.0.0.0/16" in reason and "Set" in reason
    subnet = provider.check(olds, {"network_range": "10.0.0.0/16", "subnet_range": "10.0.2.0/24"})
    assert "hk3s:network.private_subnet_cidr" in subnet.failures[0].reason
    # First creation: nothing to compare with.
    assert provider.check({}, olds).failures == []


def test_network_and_subnet_wait_for_the_ranges_record(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file))
    ranges = graph.by_name("private-network-ranges")
    assert ranges.inputs["network_range"] == "10.0.0.0/16" and ranges.inputs["subnet_range"] == "10.0.1.0/24"
    for name in ("private-network-network", "private-network-subnet"):
        assert ranges.urn in graph.by_name(name).dependencies, name


def test_a_key_with_the_operators_fingerprint_is_used_not_uploaded(ssh_key_file: Path) -> None:
    mocks = ClusterMocks(
        hetzner_ssh_keys=[
            {
                "id": 4711,
                "name": "alice@laptop",
                "fingerprint": _fingerprint(ssh_key_file),
                "public_key": _public_key(ssh_key_file),
                "labels": {},
            },
            {"id": 99, "name": "someone-else", "fingerprint": "00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff"},
        ]
    )
    graph = _run(_config(ssh_key_file), mocks)
    assert graph.of_type(SSH_KEY) == graph.of_type(PROJECT_KEY) == []
    assert [token for token, _ in mocks.calls].count("hcloud:index/getSshKeys:getSshKeys") == 1
    for server in graph.of_type(SERVER):
        assert server.inputs["sshKeys"] == ["4711"], server.name


def test_no_key_with_that_fingerprint_so_one_is_uploaded(ssh_key_file: Path) -> None:
    mocks = ClusterMocks(hetzner_ssh_keys=[{"id": 99, "name": "other", "fingerprint": "00:11:22:33:44:55:66:77"}])
    graph = _run(_config(ssh_key_file), mocks, stack="dev")
    assert graph.of_type(SSH_KEY) == []
    # Uploaded through ProjectSshKey, which takes another stack's upload of the same key if that
    # one wins the race (tests/providers/test_project_ssh_key.py).
    (key,) = graph.of_type(PROJECT_KEY)
    assert key.inputs["public_key"] == ssh_key_file.with_name("id_ed25519.pub").read_text().strip()
    assert key.inputs["fingerprint"] == _fingerprint(ssh_key_file)
    assert key.inputs["labels"][OWNER_LABEL] == "hk3s.dev"
    assert key.is_secret("hcloud_token")
    # Named after the fingerprint: a rotation's new key can exist beside the old one.
    assert key.inputs["name"] == "t-" + _fingerprint(ssh_key_file).replace(":", "")[:12]
    for server in graph.of_type(SERVER):
        assert key.urn in server.dependencies, server.name


def _in_project(ssh_key_file: Path, uploaded: Any) -> dict[str, Any]:
    """The key a run uploaded, as Hetzner's list shows it at the next run."""
    return {
        "id": 1234,
        "name": uploaded.inputs["name"],
        "fingerprint": _fingerprint(ssh_key_file),
        "public_key": _public_key(ssh_key_file),
        "labels": uploaded.inputs["labels"],
    }


def test_two_stacks_in_one_project_share_one_key(ssh_key_file: Path) -> None:
    """dev uploads the key; staging, in the same Hetzner project with the same deploy key, uses it;
    dev's next run keeps managing its own key. Whose the key is, is decided by ProjectSshKey's
    provider from the state and the key's stack-id label (tests/providers/test_project_ssh_key.py),
    never by a stack's name: every run declares the key, and staging's, whose stack id is not the
    key's, takes it as not its own (`owned: false`: never renamed, relabelled or deleted)."""
    dev_first = _run(_config(ssh_key_file), ClusterMocks(), stack="dev")
    (uploaded,) = dev_first.of_type(PROJECT_KEY)
    in_project = _in_project(ssh_key_file, uploaded)
    staging_mocks = ClusterMocks(hetzner_ssh_keys=[in_project])
    staging_mocks.stack_id = "0ther57ac1d00000"
    staging = _run(_config(ssh_key_file), staging_mocks, stack="staging")
    assert staging.of_type(SSH_KEY) == []
    (taken,) = staging.of_type(PROJECT_KEY)
    assert taken.inputs["labels"][STACK_ID_LABEL] == "0ther57ac1d00000" != in_project["labels"][STACK_ID_LABEL]
    dev_again = _run(_config(ssh_key_file), ClusterMocks(hetzner_ssh_keys=[in_project]), stack="dev")
    assert [k.urn for k in dev_again.of_type(PROJECT_KEY)] == [uploaded.urn]


def test_a_renamed_stack_keeps_declaring_the_key_it_uploaded(ssh_key_file: Path) -> None:
    """Under Pulumi mocks (Hetzner cannot be reached). `pulumi stack rename dev prod` keeps the
    state (its URNs rewritten to the new name) but changes pulumi.get_stack(), so the owner label
    the program computes (`hk3s.prod`) is no longer the one on the key (`hk3s.dev`). The key must
    still be declared, under the same logical name and type: a key the program stops declaring is
    deleted by Pulumi at the end of the `up`. Its stack-id label comes from StackIdentity, whose
    state the rename keeps."""
    first = _run(_config(ssh_key_file), ClusterMocks(), stack="dev")
    (uploaded,) = first.of_type(PROJECT_KEY)
    in_project = _in_project(ssh_key_file, uploaded)
    renamed = _run(_config(ssh_key_file), ClusterMocks(hetzner_ssh_keys=[in_project]), stack="prod")
    (kept,) = renamed.of_type(PROJECT_KEY)
    assert uploaded.inputs["labels"][STACK_ID_LABEL] == ClusterMocks().stack_id
    assert (kept.type, kept.name) == (uploaded.type, uploaded.name)
    assert kept.inputs["labels"][STACK_ID_LABEL] == uploaded.inputs["labels"][STACK_ID_LABEL]
    assert kept.inputs["labels"][OWNER_LABEL] == "hk3s.prod"
    assert kept.inputs["public_key"] == uploaded.inputs["public_key"]  # the one input that replaces it


def test_a_key_named_like_the_clusters_without_the_owner_label_is_the_operators(ssh_key_file: Path) -> None:
    """Ownership is read from the owner label only, never from a name: a key the operator uploaded
    by hand as `<cluster>-admin` (the name the first releases gave theirs) is used and never
    managed, so no run renames, relabels or deletes it, and none uploads a second key with its
    fingerprint, which Hetzner refuses (`uniqueness_error`)."""
    by_hand = {
        "id": 7,
        "name": "t-admin",
        "fingerprint": _fingerprint(ssh_key_file),
        "public_key": _public_key(ssh_key_file) + " alice@laptop",
        "labels": {},
    }
    graph = _run(_config(ssh_key_file), ClusterMocks(hetzner_ssh_keys=[by_hand]))
    assert graph.of_type(SSH_KEY) == graph.of_type(PROJECT_KEY) == []
    assert {tuple(s.inputs["sshKeys"]) for s in graph.of_type(SERVER)} == {("7",)}


def test_renaming_the_cluster_renames_the_key_in_place(ssh_key_file: Path) -> None:
    """Under Pulumi mocks (Hetzner cannot be reached). terraform-provider-hcloud's hcloud_ssh_key
    (internal/sshkey/resource.go) updates `name` and `labels` in place and replaces the key only
    for a new `public_key` (ForceNew); Hetzner refuses a second key with a fingerprint or a name it
    holds (`uniqueness_error`). So the key's logical name must not follow hk3s:cluster.name, whose
    rename would otherwise create a second key with the same fingerprint mid-run: it stays
    `cluster-ssh-key`. A key uploaded as an hcloud.SshKey by an earlier release stays one, with
    aliases for the names those releases gave it (`<cluster>-ssh-key`, the cluster's name now and
    the one recorded on the key), so their state maps onto it too."""
    first = _run(_config(ssh_key_file), ClusterMocks(), stack="dev")
    (uploaded,) = first.of_type(PROJECT_KEY)
    renamed = _run(
        _config(ssh_key_file, cluster={"name": "t2"}),
        ClusterMocks(hetzner_ssh_keys=[_in_project(ssh_key_file, uploaded)]),
        stack="dev",
    )
    (kept,) = renamed.of_type(PROJECT_KEY)
    assert kept.urn == uploaded.urn and kept.name == "cluster-ssh-key"
    assert kept.inputs["public_key"] == uploaded.inputs["public_key"]  # the one input that replaces it
    assert kept.inputs["name"] == "t2-" + _fingerprint(ssh_key_file).replace(":", "")[:12]
    # Uploaded as an hcloud.SshKey (this stack's owner label, no upload marker).
    earlier = {**_in_project(ssh_key_file, uploaded), "labels": {OWNER_LABEL: "hk3s.dev", "hk3s-cluster": "t"}}
    renamed = _run(_config(ssh_key_file, cluster={"name": "t2"}), ClusterMocks(hetzner_ssh_keys=[earlier]), stack="dev")
    assert renamed.of_type(PROJECT_KEY) == []
    (kept_earlier,) = renamed.of_type(SSH_KEY)
    assert kept_earlier.name == "cluster-ssh-key"
    assert {"t-ssh-key", "t2-ssh-key"} <= set(kept_earlier.aliases)
    assert kept_earlier.inputs["name"] == "t2-" + _fingerprint(ssh_key_file).replace(":", "")[:12]


def test_a_key_with_the_fingerprint_but_another_public_key_is_refused(ssh_key_file: Path) -> None:
    """Taken by fingerprint only when its public key is this one: Hetzner matches keys by MD5, and
    an upload beside it would be refused (`uniqueness_error`)."""
    other = {
        "id": 8,
        "name": "other",
        "fingerprint": _fingerprint(ssh_key_file),
        "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOthe x",
        "labels": {},
    }
    with pytest.raises(SettingsError) as raised:
        _run(_config(ssh_key_file), ClusterMocks(hetzner_ssh_keys=[other]))
    assert "hk3s:ssh.private_key_file" in str(raised.value) and "'other'" in str(raised.value)


def test_hetzner_key_names_the_key_explicitly(ssh_key_file: Path) -> None:
    keys = [{"id": 55, "name": "deploy", "fingerprint": "aa:bb"}, {"id": 56, "name": "other", "fingerprint": "cc"}]
    config = _config(ssh_key_file, ssh={"private_key_file": str(ssh_key_file), "hetzner_key": "deploy"})
    graph = _run(config, ClusterMocks(hetzner_ssh_keys=keys))
    assert graph.of_type(SSH_KEY) == graph.of_type(PROJECT_KEY) == []
    assert {tuple(s.inputs["sshKeys"]) for s in graph.of_type(SERVER)} == {("55",)}


def test_an_unknown_hetzner_key_is_refused_naming_the_setting(ssh_key_file: Path) -> None:
    config = _config(ssh_key_file, ssh={"private_key_file": str(ssh_key_file), "hetzner_key": "typo"})
    with pytest.raises(SettingsError) as raised:
        _run(config, ClusterMocks(hetzner_ssh_keys=[{"id": 55, "name": "deploy", "fingerprint": "aa"}]))
    assert "hk3s:ssh.hetzner_key" in str(raised.value) and "deploy" in str(raised.value)


def test_changed_creation_only_settings_are_reported_per_machine(
    ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1 and srv were created from debian-12; the settings now say debian-13: the worker still on
    the old image is listed, the server's change reported as never applied; nothing is replaced."""
    warnings: list[str] = []
    monkeypatch.setattr("components.machine.pulumi.log.warn", lambda message, resource=None: warnings.append(message))
    mocks = ClusterMocks(server_state={"w1": {"image": "debian-12"}, "srv": {"image": "debian-12"}})
    graph = _run(_config(ssh_key_file, cluster={"image": "debian-13"}), mocks)
    assert set(_server(graph, "w1").ignore_changes) >= CREATION_ONLY
    assert sorted(warnings) == [
        "srv runs image debian-12 (settings now say debian-13): the control plane keeps them: "
        "the change is never applied to it",
        "w1 runs image debian-12 (settings now say debian-13): servers created from now on get the new values; "
        "replace this worker (remove it, then add it) to move it",
    ]


def test_every_login_comes_after_the_nodes_login_key_and_before_the_retirement(ssh_key_file: Path) -> None:
    """The order a rotation needs within one run: each node's NodeLoginKey before every resource
    that logs in to that node; every node's RetiredLoginKeys after every resource that logs in."""
    graph = _run(_config(ssh_key_file))
    dynamic = [r for r in graph.registrations if "pulumi-python:dynamic/hk3s:" in r.type]
    # HostKeyPair holds a server's host key (a private_key input) but logs in nowhere.
    keyless = ("NodeLoginKey", "RetiredLoginKeys", "HostKeyPair")
    logging_in = [r for r in dynamic if r.type.rsplit(":", 1)[1] not in keyless]
    logging_in = [r for r in logging_in if "private_key" in r.inputs]
    for reg in logging_in:
        node = reg.inputs.get("node")
        if node is None:  # the network plan logs in to every node: after every node's key
            assert all(graph.urn_of(f"{n}-login-key") in reg.dependencies for n in ("srv",)), reg.name
            continue
        login_key = graph.by_name(f"{node}-login-key")
        assert login_key.urn in reg.dependencies or any(
            graph.by_name(f"{node}-probe").urn == dep for dep in reg.dependencies
        ), f"{reg.name} does not wait for {node}'s login key"
    probe_of = {r.inputs["node"]: r for r in graph.of_type("hk3s:HostProbe")}
    for node, probe in probe_of.items():
        assert graph.urn_of(f"{node}-login-key") in probe.dependencies, node
    for node in ("srv", "w1", "w2", "metal"):
        retired = graph.by_name(f"{node}-retired-login-keys")
        # Through one barrier (components.barrier); a retirement's delete does nothing, so only
        # the creation and update order matters, which the engine keeps through it.
        before = graph.dependencies_of(retired.name)
        missing = [r.name for r in logging_in if r.urn not in before]
        assert not missing, f"{node}'s previous key could go before {missing} hold the new one"
        assert retired.is_secret("private_key")
    for login_key in graph.of_type("hk3s:NodeLoginKey"):
        assert login_key.is_secret("private_key")
        assert "private_key" in login_key.additional_secret_outputs
        assert "previous_private_key" in login_key.additional_secret_outputs


NETWORK = "hcloud:index/network:Network"


def _hetzner_protection(graph: Recording) -> dict[str, tuple[Any, Any]]:
    """(deleteProtection, rebuildProtection) of every Hetzner server and network, as the engine receives them."""
    return {
        r.name: (r.inputs.get("deleteProtection"), r.inputs.get("rebuildProtection"))
        for r in [*graph.of_type(SERVER), *graph.of_type(NETWORK)]
    }


def test_the_control_plane_server_and_the_network_carry_hetzners_own_protection(ssh_key_file: Path) -> None:
    """Pulumi's `protect` guards only against Pulumi: a delete or rebuild in the Cloud Console or
    the hcloud CLI goes through. Hetzner's own lock does not (terraform-provider-hcloud,
    docs/resources/server.md: `delete_protection` "Enable or disable delete protection (Needs to be
    the same as `rebuild_protection`)"; Hetzner's API refuses a server's protection change whose
    delete and rebuild differ; hcloud_network has `delete_protection` alone). Mocks stand in for the
    engine and Hetzner (it cannot be reached from here): what is tested is what the program asks for."""
    graph = _run(_config(ssh_key_file))
    assert _hetzner_protection(graph) == {
        "srv": (True, True),
        "private-network-network": (True, None),
        # Workers come and go, and a worker's removal deletes its server: no lock on them.
        "w1": (None, None),
        "w2": (None, None),
    }
    # The lock must follow the setting on a running server: never frozen by ignore_changes.
    for resource in (_server(graph, "srv"), graph.by_name("private-network-network")):
        ignored = set(resource.ignore_changes)
        assert not ignored & {"deleteProtection", "rebuildProtection", "delete_protection", "rebuild_protection"}


@pytest.mark.parametrize("cluster", [{"teardown": "allowed"}, {"protect_control_plane": False}])
def test_the_teardown_setting_lifts_hetzners_protection_with_pulumis(
    ssh_key_file: Path, cluster: dict[str, Any]
) -> None:
    """A teardown is `up` with hk3s:cluster.teardown: allowed, then `pulumi destroy` (README,
    "Tearing down"; the destroy is refused until that `up` is applied, providers.teardown_guard).
    That `up` is an update of the server and the network that sets delete and rebuild protection
    false together (Hetzner requires them equal on a server), so the lock is gone before the
    destroy's delete; terraform-provider-hcloud also lifts the lock itself when it deletes a
    resource (docs/index.md, "Delete Protection"). Mocked engine and Hetzner, as above."""
    graph = _run(_config(ssh_key_file, cluster=cluster))
    assert _hetzner_protection(graph) == {
        "srv": (False, False),
        "private-network-network": (False, None),
        "w1": (None, None),
        "w2": (None, None),
    }
    assert [r.name for r in graph.registrations if r.protect] == []
