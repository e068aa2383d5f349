"""Editing Pulumi.<env>.yaml through the API: validated by the program's own settings
models before anything is written; comments kept. No Pulumi CLI is involved: every
rejection here happens before the API touches a stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_settings import load_settings
from operator_api import (
    REPO,
    ClusterStack,
    DuplicateWorkerError,
    SettingsRejectedError,
    StackDocument,
    StackError,
    UnknownWorkerError,
)
from tests.components.test_example_stacks import existing_host_example
from tests.conftest import example_text


@pytest.mark.parametrize("env", ["dev", "staging"])
def test_example_stack_files_validate(env: str, ssh_key_file: Path) -> None:
    document = StackDocument(example_text(env, ssh_key_file))
    settings = document.validate()
    assert settings.cluster.name == env and settings.workers
    # The raw file (not only our reading of it) passes the program's loader too.
    assert load_settings(document.settings_input()) == settings


def test_staging_does_not_share_dev_names_or_networks(ssh_key_file: Path) -> None:
    dev = StackDocument(example_text("dev", ssh_key_file)).validate()
    staging = StackDocument(example_text("staging", ssh_key_file)).validate()
    assert dev.cluster.name != staging.cluster.name
    assert not {w.name for w in dev.workers} & {w.name for w in staging.workers}
    assert dev.network.private_network_cidr != staging.network.private_network_cidr


def test_an_untouched_file_renders_byte_identical() -> None:
    for env in ("dev", "staging"):
        text = (REPO / f"Pulumi.{env}.yaml").read_text()
        assert StackDocument(text).render() == text


def test_adding_a_worker_keeps_comments_and_validates(ssh_key_file: Path) -> None:
    document = StackDocument(example_text("dev", ssh_key_file))
    document.add_worker({"name": "dev-metal-2", "kind": "existing", "address": "198.51.100.21", "holds_copies": False})
    text = document.render()
    assert "# a Hetzner server the program creates" in text
    # The example's commented existing host stays as it was, a comment.
    assert "# An existing host (bare metal, another provider), given by address" in text
    assert "    # - name: dev-metal-1\n" in text
    settings = document.validate()
    assert settings.workers[-1].name == "dev-metal-2" and settings.workers[-1].holds_copies is False
    # What was written reads back the same.
    assert StackDocument(text).validate() == settings


def test_fence_unfence_and_remove_edit_the_fence_map(ssh_key_file: Path) -> None:
    document = StackDocument(example_text("dev", ssh_key_file))
    document.set_fence("dev-worker-2", powered_off=True, accept_stale_data=False)
    fences = document.validate().fences
    assert fences["dev-worker-2"].powered_off is True and fences["dev-worker-2"].accept_stale_data is False
    document.remove_fence("dev-worker-2")
    assert "hk3s:fences" not in document.render()
    document.set_fence("dev-worker-2", powered_off=True, accept_stale_data=True)
    document.remove_worker("dev-worker-2")  # its fence goes with it
    settings = document.validate()
    assert "dev-worker-2" not in {w.name for w in settings.workers} and settings.fences == {}


def test_giving_up_a_fenced_worker_keeps_its_fence_with_force_remove(ssh_key_file: Path) -> None:
    document = StackDocument(example_text("dev", ssh_key_file))
    with pytest.raises(SettingsRejectedError) as refused:
        document.remove_worker("dev-worker-2", force=True)
    assert refused.value.keys == ["hk3s:fences.dev-worker-2"] and "Fence it first" in str(refused.value)
    assert "dev-worker-2" in {w.name for w in document.validate().workers}  # nothing changed
    document.set_fence("dev-worker-2", powered_off=True, accept_stale_data=False)
    document.remove_worker("dev-worker-2", force=True)
    settings = document.validate()
    assert "dev-worker-2" not in {w.name for w in settings.workers}
    assert settings.fences["dev-worker-2"].force_remove and settings.fences["dev-worker-2"].powered_off
    assert settings.forced_removals() == ["dev-worker-2"] and settings.fenced_workers() == []


def _bytes(project: Path) -> bytes:
    return (project / "Pulumi.dev.yaml").read_bytes()


def test_bad_address_names_the_setting_and_changes_nothing(api: ClusterStack, project: Path) -> None:
    before = _bytes(project)
    with pytest.raises(SettingsRejectedError) as caught:
        api.add_worker("dev-metal-2", address="198.51.100.300")
    assert caught.value.keys == ["hk3s:workers[2].address"]
    assert "not an IPv4 address" in str(caught.value) and "stack config is unchanged" in str(caught.value)
    assert _bytes(project) == before


def test_existing_worker_without_address_is_refused(api: ClusterStack, project: Path) -> None:
    before = _bytes(project)
    with pytest.raises(SettingsRejectedError) as caught:
        api.add_worker("dev-metal-2")
    assert caught.value.keys == ["hk3s:workers[2].address"] and "has no address" in str(caught.value)
    assert _bytes(project) == before


def test_every_problem_is_listed_not_only_the_first(api: ClusterStack, project: Path) -> None:
    with pytest.raises(SettingsRejectedError) as caught:
        api.add_worker("Bad_Name", address="198.51.100.20", labels={"kubernetes.io/role": "x"})
    keys = caught.value.keys
    assert "hk3s:workers[2].name" in keys and "hk3s:workers[2].labels" in keys, keys
    # With the example's existing host uncommented, its address is taken: reported by the
    # cross-field rules once the fields parse.
    metal = existing_host_example("dev")
    document = StackDocument((project / "Pulumi.dev.yaml").read_text())
    document.add_worker(metal)
    (project / "Pulumi.dev.yaml").write_text(document.render())
    with pytest.raises(SettingsRejectedError) as clash:
        api.add_worker("dev-metal-2", address=metal["address"])
    assert clash.value.keys == ["hk3s:workers[3].address"] and "already the address" in str(clash.value)


@pytest.mark.parametrize("name", ["dev-worker-1", "dev-server"])
def test_duplicate_names_are_refused(api: ClusterStack, project: Path, name: str) -> None:
    before = _bytes(project)
    with pytest.raises(DuplicateWorkerError) as caught:
        api.add_worker(name, address="198.51.100.21")
    assert caught.value.keys == (["hk3s:workers[0].name"] if name == "dev-worker-1" else ["hk3s:server.name"])
    assert _bytes(project) == before


def test_unknown_workers_are_refused(api: ClusterStack, project: Path) -> None:
    before = _bytes(project)
    with pytest.raises(UnknownWorkerError) as removed:
        api.remove_worker("dev-worker-9")
    assert removed.value.keys == ["hk3s:workers"] and "(workers: dev-worker-1, dev-worker-2)" in str(removed.value)
    with pytest.raises(UnknownWorkerError) as fenced:
        api.fence("dev-worker-9", powered_off=True)
    assert fenced.value.keys == ["hk3s:fences.dev-worker-9"]
    with pytest.raises(SettingsRejectedError, match="is not fenced"):
        api.unfence("dev-worker-1")
    with pytest.raises(UnknownWorkerError):
        api.fence("dev-server")  # the server is no worker
    assert _bytes(project) == before


def test_a_missing_stack_file_is_reported(project: Path, backend: Path) -> None:
    api = ClusterStack("prod", project_dir=project, env_vars={"PULUMI_BACKEND_URL": backend.as_uri()})
    with pytest.raises(StackError, match=r"Pulumi.prod.yaml does not exist: copy Pulumi.dev.yaml"):
        api.add_worker("w", address="198.51.100.21")
    assert not (project / "Pulumi.prod.yaml").exists()


def test_a_pools_worker_is_fenced_by_name_and_removed_through_its_pools_count(ssh_key_file: Path) -> None:
    document = StackDocument(example_text("dev", ssh_key_file))
    # The example's pool "batch" makes batch-1 and batch-2.
    assert set(document.pool_workers()) == {"batch-1", "batch-2"}
    document.set_fence("batch-2", powered_off=True, accept_stale_data=False)
    assert document.validate().fences["batch-2"].powered_off is True
    before = document.render()
    with pytest.raises(SettingsRejectedError) as caught:
        document.remove_worker("batch-2")
    assert caught.value.keys == ["hk3s:worker_pools[0].count"]
    assert "batch-2 is worker 2 of pool batch, which keeps 2 workers: lower count to 1" in str(caught.value)
    assert "or add 2 to its retire list" in str(caught.value)
    assert document.render() == before
    with pytest.raises(UnknownWorkerError) as unknown:
        document.remove_worker("batch-3")
    assert "there is no worker named 'batch-3'" in str(unknown.value)
