"""A refusal's message ends with the docs page (and section) that explains it.

The link is chosen centrally: by the refusal's code (`node_operations.refusal.tagged`), by the
setting's key for a refused configuration (`cluster_settings.SettingsError`, the operator API's
`SettingsRejectedError`), and by the error's type for the operator API's other errors. Every
target must be a page of docs/ with that heading, as GitHub anchors it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_settings import SettingProblem
from cluster_settings.loading import SettingsError, load_settings
from node_operations import doc_links
from node_operations.fence import FenceRefusedError
from node_operations.refusal import REFUSAL_CODES, refusal_code, tagged, untagged
from operator_api import errors
from tests.test_docs import anchors

REPO = Path(__file__).resolve().parents[2]


def _targets() -> dict[str, str]:
    found = {f"refusal {code}": doc_links.REFUSAL_PAGES[code] for code in REFUSAL_CODES}
    found |= {f"setting {prefix}": link for prefix, link in doc_links.SETTING_PAGES.items()}
    found["setting (any other)"] = doc_links.setting_link("hk3s:nothing_here")
    for error in _stack_errors(errors.StackError):
        found[f"error {error.__name__}"] = error.docs
    return found


def _stack_errors(base: type[errors.StackError]) -> list[type[errors.StackError]]:
    result = [base]
    for sub in base.__subclasses__():
        result += _stack_errors(sub)
    return result


def test_every_refusal_code_has_a_page() -> None:
    assert set(doc_links.REFUSAL_PAGES) == set(REFUSAL_CODES)


@pytest.mark.parametrize("name", sorted(_targets()))
def test_every_link_target_is_a_page_with_that_heading(name: str) -> None:
    link = _targets()[name]
    page, _, anchor = link.partition("#")
    assert page.startswith("docs/") and anchor, f"{name}: {link!r} names no page and section"
    path = REPO / page
    assert path.is_file(), f"{name}: {page} does not exist"
    assert anchor in anchors(path), f"{name}: {page} has no heading #{anchor}"


def test_a_refusal_ends_with_its_page_before_its_code() -> None:
    message = tagged("w1: removing the worker is refused: does not answer over SSH", "removal")
    assert refusal_code(message) == "removal"
    assert untagged(message).endswith("See docs/reboots-removal-upgrades.md#removing-a-worker.")


def test_a_fence_refusal_names_the_fencing_page() -> None:
    error = FenceRefusedError("w1", "w1 has been NotReady for only 12 s")
    assert refusal_code(str(error)) == "fence"
    assert untagged(str(error)).rstrip().endswith("See docs/fencing.md#fencing-a-worker-that-is-down.")


def test_a_refused_setting_names_the_page_of_its_key(ssh_key_file: Path) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(
            {
                "cluster": {"k3s_version": "v1.36.1+k3s1"},
                "server": {"name": "srv", "kind": "existing", "address": "198.51.100.10"},
                "ssh": {"private_key_file": str(ssh_key_file)},
                "network": {"mode": "sideways"},
            }
        )
    text = untagged(str(refused.value)).rstrip()
    assert text.splitlines()[-1] == "See docs/network-and-firewalls.md#how-the-nodes-talk-to-each-other-hk3snetwork."


def test_the_longest_prefix_wins_and_every_key_gets_a_page() -> None:
    assert doc_links.setting_link("hk3s:ssh.host_keys.w1") == "docs/security.md#host-keys-known-before-the-first-login"
    assert doc_links.setting_link("hk3s:ssh.user") == "docs/configuration.md#hk3sssh"
    assert doc_links.setting_link("hk3s:workers[2].address") == "docs/configuration.md#hk3sworkers"


def test_the_operator_apis_errors_end_with_their_page() -> None:
    busy = errors.StackBusyError("staging", [errors.LockHolder("root", "ops-1", 4711, "")])
    assert str(busy).endswith(f"See {errors.StackBusyError.docs}.")
    rejected = errors.SettingsRejectedError([SettingProblem("hk3s:fences.w9", "there is no worker named 'w9'")])
    assert str(rejected).splitlines()[-1] == "See docs/fencing.md#fencing-a-worker-that-is-down."
    refused = errors.RefusedError("up was refused", reason="teardown")
    assert str(refused).endswith("See docs/teardown.md#tearing-down.")


def test_a_message_that_names_its_page_already_gets_no_second_link() -> None:
    text = tagged("refused. See docs/fencing.md#fencing-a-worker-that-is-down.", "fence")
    assert untagged(text).count("See docs/") == 1
