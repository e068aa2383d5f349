"""Secrets encrypted at rest from the server's first start, never switched on later: k3s
documents "Starting K3s without encryption and enabling it at a later time is currently not
supported" (docs.k3s.io/cli/secrets-encrypt). The server provider's check decides it (no host
involved), and `status --check` names a server that runs without it."""

from __future__ import annotations

from node_operations.health import judge
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


def test_status_names_a_server_without_it_and_what_to_do() -> None:
    facts = {"unit": "k3s", "active": "active", "secrets_encryption": "no"}
    warnings = judge("srv", facts).warnings
    assert len(warnings) == 1 and warnings[0].startswith("srv: Kubernetes Secrets are stored unencrypted")
    assert "does not support turning it on later" in warnings[0]
    assert judge("srv", {**facts, "secrets_encryption": "yes"}).warnings == ()
    assert judge("w1", {"unit": "k3s-agent", "active": "active"}).warnings == ()
