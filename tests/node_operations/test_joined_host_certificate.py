"""Whether a joined worker's agent can still authenticate, by its client certificate's end as the
host reads it (node_operations/join_host.py): an expired or missing certificate is a reason to join
again; one still valid, or one the host cannot read, says nothing."""

from __future__ import annotations

from node_operations.join_host import AGENT_CLIENT_CERT, _client_cert_dead

NOW = 1_800_000_000


def test_an_expired_certificate_names_its_end_and_why_only_a_rejoin_helps() -> None:
    reason = _client_cert_dead(str(NOW - 86_400), str(NOW))
    assert reason is not None and reason.startswith(f"its agent's client certificate {AGENT_CLIENT_CERT} expired at")
    assert "2027-01-14" in reason and "its join token is spent" in reason


def test_a_missing_certificate_is_a_reason_to_join_again() -> None:
    reason = _client_cert_dead("missing", str(NOW))
    assert reason is not None and "is missing" in reason


def test_a_valid_or_unreadable_certificate_says_nothing() -> None:
    assert _client_cert_dead(str(NOW + 86_400), str(NOW)) is None
    assert _client_cert_dead("-", str(NOW)) is None
