"""ProjectSshKey's provider against the lab's Hetzner API stand-in (a real HTTP server, Hetzner's
own `hcloud` library in between).

Hetzner's API reference ("SSH Keys: Create an SSH key"): a project holds one key per fingerprint
and per name; a second is answered 409 `uniqueness_error` ("SSH key with the same fingerprint
already exists" / "SSH key name is already used"). terraform-provider-hcloud's hcloud_ssh_key
(internal/sshkey/resource.go) replaces a key only for a new `public_key` and updates `name` and
`labels` in place. Two stacks of one project with one deploy key may both find no key at preview
and both upload it in their first runs: the one Hetzner refuses takes the winner's key, by its
fingerprint and only when its public key is exactly this one, and never changes or deletes it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from components.hetzner_ssh_key import hetzner_fingerprint
from lab.hcloud_standin import HcloudStandin, running_standin
from providers.project_ssh_key import ProjectSshKeyInputs, ProjectSshKeyProvider
from remote_access.hetzner_api import HetznerApiError

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyDummyDummyDummyDummyDummyDummyDumm deploy@ci"
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOthe x"


@pytest.fixture
def standin() -> Iterator[HcloudStandin]:
    with running_standin() as running:
        yield running


def _props(standin: HcloudStandin, stack: str, name: str = "shop-aabbccddeeff") -> dict[str, Any]:
    return ProjectSshKeyInputs(
        name=name,
        public_key=PUBLIC_KEY,
        fingerprint=hetzner_fingerprint(PUBLIC_KEY),
        labels={"hk3s-owner": f"hk3s.{stack}", "hk3s-cluster": "shop", "hk3s-stack-id": f"id-of-{stack}"},
        hcloud_token=standin.token,
        hcloud_endpoint=standin.url,
    ).props()


def test_two_first_runs_at_once_share_one_key(standin: HcloudStandin) -> None:
    """dev and staging upload at the same moment (a barrier): one upload wins, the other is
    refused with uniqueness_error and takes the winner's key; deleting the taker leaves the key,
    deleting the uploader removes it."""
    results: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def upload(stack: str) -> None:
        barrier.wait()
        results[stack] = ProjectSshKeyProvider().create(_props(standin, stack))

    threads = [threading.Thread(target=upload, args=(stack,)) for stack in ("dev", "staging")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert set(results) == {"dev", "staging"}
    (held,) = standin.ssh_keys.values()
    assert {results[s].id for s in results} == {str(held.id)}
    owners = {stack: results[stack].outs["owned"] for stack in results}
    assert sorted(owners.values()) == [False, True], owners
    taker = next(stack for stack, owned in owners.items() if not owned)
    uploader = next(stack for stack, owned in owners.items() if owned)
    assert held.labels["hk3s-owner"] == f"hk3s.{uploader}"
    # The taker's later changes never reach the key it does not own.
    ProjectSshKeyProvider().update(
        str(held.id), results[taker].outs, {**_props(standin, taker, name="renamed"), "labels": {}}
    )
    ProjectSshKeyProvider().delete(str(held.id), results[taker].outs)
    assert standin.ssh_keys[held.id].name == "shop-aabbccddeeff"
    assert standin.ssh_keys[held.id].labels["hk3s-owner"] == f"hk3s.{uploader}"
    # The uploader renames it in place (a renamed cluster) and deletes it with the resource.
    ProjectSshKeyProvider().update(str(held.id), results[uploader].outs, _props(standin, uploader, name="shop2-aabb"))
    assert standin.ssh_keys[held.id].name == "shop2-aabb"
    ProjectSshKeyProvider().delete(str(held.id), results[uploader].outs)
    assert standin.ssh_keys == {}


def test_an_upload_whose_state_was_never_written_is_this_stacks_own(standin: HcloudStandin) -> None:
    """A run's upload succeeded but the run ended (killed, the machine down) before Pulumi wrote
    the key to the state: the next run's create is refused (409 `uniqueness_error`) and finds the
    key by its fingerprint. Its stack-id label is this stack's, so the key is this stack's own
    (`owned`): later runs rename and relabel it, and the teardown deletes it rather than leave it in
    the project. Against the lab's Hetzner API stand-in (Hetzner cannot be reached from here)."""
    # Uploaded by that run under the cluster's earlier name (renamed since).
    earlier = _props(standin, "dev", name="old-aabbccddeeff")
    standin.add_ssh_key(earlier["name"], PUBLIC_KEY, labels={**earlier["labels"], "hk3s-cluster": "old"})
    created = ProjectSshKeyProvider().create(_props(standin, "dev"))
    (held,) = standin.ssh_keys.values()
    assert created.id == str(held.id)
    assert created.outs is not None and created.outs["owned"] is True
    assert (held.name, held.labels) == ("shop-aabbccddeeff", _props(standin, "dev")["labels"])
    ProjectSshKeyProvider().delete(created.id, created.outs)
    assert standin.ssh_keys == {}


def test_a_renamed_stack_keeps_its_key(standin: HcloudStandin) -> None:
    """`pulumi stack rename dev prod` keeps the state (the key's `owned` with it) and the stack-id
    label; only the owner label, which names the stack, changes: the update relabels the key in
    place and the teardown still deletes it. Against the lab's Hetzner API stand-in."""
    created = ProjectSshKeyProvider().create(_props(standin, "dev"))
    assert created.outs is not None
    (held,) = standin.ssh_keys.values()
    renamed = {**_props(standin, "prod"), "labels": {**created.outs["labels"], "hk3s-owner": "hk3s.prod"}}
    updated = ProjectSshKeyProvider().update(created.id, created.outs, renamed)
    assert updated.outs is not None and updated.outs["owned"] is True
    assert standin.ssh_keys[held.id].labels["hk3s-owner"] == "hk3s.prod"
    assert standin.ssh_keys[held.id].labels["hk3s-stack-id"] == "id-of-dev"
    ProjectSshKeyProvider().delete(created.id, updated.outs)
    assert standin.ssh_keys == {}


def test_a_key_with_the_fingerprint_but_another_public_key_is_not_taken(standin: HcloudStandin) -> None:
    standin.add_ssh_key("forged", OTHER_KEY, fingerprint=hetzner_fingerprint(PUBLIC_KEY))
    with pytest.raises(HetznerApiError, match=r"'forged' has its fingerprint .* but another public key"):
        ProjectSshKeyProvider().create(_props(standin, "dev"))
    assert [key.name for key in standin.ssh_keys.values()] == ["forged"]


def test_a_name_another_key_holds_is_refused_naming_it(standin: HcloudStandin) -> None:
    standin.add_ssh_key("shop-aabbccddeeff", OTHER_KEY)
    with pytest.raises(HetznerApiError, match=r"SSH key name is already used.*the name is another key's"):
        ProjectSshKeyProvider().create(_props(standin, "dev"))


def test_a_new_public_key_replaces_and_a_new_name_updates() -> None:
    olds = {"name": "a", "public_key": PUBLIC_KEY, "labels": {"x": "1"}, "owned": True}
    renamed = ProjectSshKeyProvider().diff("1", olds, {**olds, "name": "b"})
    assert renamed.changes and not renamed.replaces
    rotated = ProjectSshKeyProvider().diff("1", olds, {**olds, "public_key": OTHER_KEY})
    assert rotated.replaces == ["public_key"] and rotated.delete_before_replace is False
