"""The join reports what became of its token truthfully: "deleted" only when the server
deleted it; a failed deletion says the token stays valid until it expires and how to delete
it. (A stand-in for the server's API answers the one call: the delete itself is exercised
against the real API server in tests/lab/test_join_failures.py.)"""

from __future__ import annotations

import asyncio

from node_operations.join import Joiner
from remote_access.kube import JoinToken
from remote_access.ssh import SshError


class _Cluster:
    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.deleted: list[str] = []

    async def delete_token(self, token_id: str) -> None:
        if self.fails:
            raise SshError("server", "the Kubernetes API did not answer within 30s")
        self.deleted.append(token_id)


def _joiner(cluster: _Cluster, lines: list[str]) -> Joiner:
    joiner = Joiner.__new__(Joiner)
    joiner.cluster = cluster  # type: ignore[assignment]
    joiner.progress = lines.append
    return joiner


def test_a_deleted_token_is_reported_deleted() -> None:
    lines: list[str] = []
    asyncio.run(
        _joiner(_Cluster(fails=False), lines)._forget_token(
            JoinToken("abc123", "abc123.VALUEs3cr3t"), "525s", registered=True
        )
    )
    assert lines == ["join token abc123 deleted (the agent keeps it, dead)"]


def test_a_token_the_server_did_not_delete_is_never_reported_deleted() -> None:
    lines: list[str] = []
    asyncio.run(
        _joiner(_Cluster(fails=True), lines)._forget_token(
            JoinToken("abc123", "abc123.VALUEs3cr3t"), "525s", registered=True
        )
    )
    assert len(lines) == 1 and "deleted (the agent" not in lines[0]
    assert lines[0].startswith("join token abc123 could NOT be deleted (server: the Kubernetes API did not answer")
    assert "valid until it expires (525s after it was made)" in lines[0]
    assert "kubectl -n kube-system delete secret bootstrap-token-abc123" in lines[0]
    assert "VALUEs3cr3t" not in lines[0]
