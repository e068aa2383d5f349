"""Secrets encrypted at rest. k3s turns secrets-encryption on at any start with the flag
(deps.go genEncryptionConfigAndState writes the config when it is missing); Secrets stored before
stay unencrypted until rewritten (`k3s secrets-encrypt rotate-keys`). The server provider's check
decides it (no host involved): on for a server k3s starts here for the first time, and for one
already running only when the stack allows a restart. `status --check` reads what k3s reports
(`k3s secrets-encrypt status`), never the config's line."""

from __future__ import annotations

from node_operations.health import encrypted_since, judge
from providers.k3s_server import K3sServerProvider

SETTINGS = {"node": "srv", "k3s_version": "v1.35.2+k3s1", "secrets_encryption": None}


def test_a_new_server_starts_with_secrets_encryption() -> None:
    checked = K3sServerProvider().check({}, dict(SETTINGS))
    assert checked.inputs["secrets_encryption"] is True


def test_a_server_that_started_without_it_keeps_running_as_it_started() -> None:
    # An earlier release's server: its recorded inputs have no such key at all.
    earlier = {"node": "srv", "k3s_version": "v1.35.2+k3s1"}
    checked = K3sServerProvider().check(earlier, dict(SETTINGS))
    assert checked.inputs["secrets_encryption"] is None
    assert not K3sServerProvider().diff("srv-k3s", earlier, checked.inputs).changes
    encrypted = {**earlier, "secrets_encryption": True}
    assert K3sServerProvider().check(encrypted, dict(SETTINGS)).inputs["secrets_encryption"] is True


def test_a_running_server_gets_it_when_the_stack_allows_a_restart() -> None:
    earlier = {"node": "srv", "k3s_version": "v1.35.2+k3s1", "approve_restart": False}
    checked = K3sServerProvider().check(earlier, {**SETTINGS, "approve_restart": True})
    assert checked.inputs["secrets_encryption"] is True
    assert K3sServerProvider().diff("srv-k3s", earlier, checked.inputs).changes


def test_status_names_a_server_without_it_and_what_to_do() -> None:
    facts = {"unit": "k3s", "active": "active", "secrets_encryption": "no"}
    warnings = judge("srv", facts).warnings
    assert len(warnings) == 1 and warnings[0].startswith("srv: Kubernetes Secrets are stored unencrypted")
    assert "k3s secrets-encrypt status: Disabled" in warnings[0]
    assert "approve_server_restart: true" in warnings[0] and "rotate-keys" in warnings[0]
    assert judge("srv", {**facts, "secrets_encryption": "yes"}).warnings == ()
    assert judge("w1", {"unit": "k3s-agent", "active": "active"}).warnings == ()


def test_secrets_stored_before_encryption_began_are_named_until_reencrypted() -> None:
    """k3s writes its CA and its encryption config in one start: a config written later means the
    server ran without encryption, and stage `start` means nothing re-encrypted since."""
    first = {"unit": "k3s", "active": "active", "secrets_encryption": "yes", "cluster_began": "1700000000"}
    from_the_start = {**first, "secrets_encryption_stage": "start", "secrets_encryption_began": "1700000002"}
    assert encrypted_since(from_the_start) is None and judge("srv", from_the_start).warnings == ()
    late = {**from_the_start, "secrets_encryption_began": "1700086400"}
    assert encrypted_since(late) == 1700086400
    (warning,) = judge("srv", late).warnings
    assert "stored before secrets-encryption was turned on (2023-11-15 22:13 UTC) are still unencrypted" in warning
    assert "rotate-keys" in warning
    reencrypted = {**late, "secrets_encryption_stage": "reencrypt_finished"}
    assert encrypted_since(reencrypted) is None and judge("srv", reencrypted).warnings == ()
