"""Logins shared within one event loop (remote_access/session_pool.py), against a real sshd
on loopback (tests/loopback_sshd.py); connections are counted by the SSH layer's own
counter of connection attempts, which the sshd tests of tests/remote_access/test_ssh_retry.py
check against a real sshd."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from providers.base import run_operation
from remote_access import session_pool
from remote_access.ssh import CONNECT_STATS, HostKeyChangedError, SshTarget, open_session
from tests.loopback_sshd import LoopbackSshd

T = TypeVar("T")


def _target(sshd: LoopbackSshd, recorded: str | None) -> SshTarget:
    return SshTarget(
        node="worker-1",
        address="127.0.0.1",
        port=sshd.port,
        private_key=sshd.client_private_key,
        recorded_host_key=recorded,
        connect_timeout=5.0,
    )


def _on_sharing_loop(body: Callable[[], Awaitable[T]]) -> T:
    """Run `body` on a fresh loop that shares logins, closing its connections afterwards."""
    loop = asyncio.new_event_loop()
    pool = session_pool.share_logins_on(loop)
    try:
        return loop.run_until_complete(body())
    finally:
        pool.close_all()
        loop.run_until_complete(asyncio.sleep(0.05))
        loop.close()


async def _echo(target: SshTarget, text: str, *, shared: bool, login_anew: bool = False) -> str:
    async with open_session(target, shared=shared, login_anew=login_anew) as session:
        return (await session.run(["echo", text], deadline=10)).stdout.strip()


def test_shared_sessions_pinned_to_the_same_key_use_one_connection(sshd: LoopbackSshd) -> None:
    pinned = _target(sshd, sshd.host_key_line)

    async def body() -> list[str]:
        first = await _echo(pinned, "one", shared=True)
        # Two callers at once, then one after the others: the same connection for all.
        both = await asyncio.gather(_echo(pinned, "two", shared=True), _echo(pinned, "three", shared=True))
        return [first, *both, await _echo(pinned, "four", shared=True)]

    before = CONNECT_STATS.connections
    assert _on_sharing_loop(body) == ["one", "two", "three", "four"]
    assert CONNECT_STATS.connections - before == 1


def test_first_contact_and_a_fresh_look_log_in_anew_and_leave_the_login_for_pinned_callers(
    sshd: LoopbackSshd,
) -> None:
    unpinned, pinned = _target(sshd, None), _target(sshd, sshd.host_key_line)

    async def body() -> None:
        await _echo(unpinned, "first contact", shared=True)
        await _echo(unpinned, "first contact again", shared=True)
        await _echo(pinned, "probe", shared=True, login_anew=True)
        await _echo(pinned, "join", shared=True)

    before = CONNECT_STATS.connections
    _on_sharing_loop(body)
    assert CONNECT_STATS.connections - before == 3  # two unpinned logins, one fresh look; the join reuses


def test_a_caller_pinned_to_another_key_never_gets_the_shared_login(sshd: LoopbackSshd) -> None:
    pinned = _target(sshd, sshd.host_key_line)
    other = _target(sshd, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBfBzt6hGRTzkk7oL8Es3BDuEOsnB7Ui0uxe2Xe5dqQe")

    async def body() -> None:
        await _echo(pinned, "pinned", shared=True)
        with pytest.raises(HostKeyChangedError):
            await _echo(other, "other", shared=True)

    _on_sharing_loop(body)


def test_a_login_the_host_closed_is_replaced(sshd: LoopbackSshd) -> None:
    pinned = _target(sshd, sshd.host_key_line)
    pool_of: list[session_pool.SessionPool] = []

    async def body() -> str:
        await _echo(pinned, "before", shared=True)
        pool = session_pool.active_pool()
        assert pool is not None
        pool_of.append(pool)
        for shared in [s for group in pool._connections.values() for s in group]:
            shared.connection.abort()  # as when the host goes away
        await asyncio.sleep(0.05)
        return await _echo(pinned, "after", shared=True)

    before = CONNECT_STATS.connections
    assert _on_sharing_loop(body) == "after"
    assert CONNECT_STATS.connections - before == 2


def test_without_a_sharing_loop_each_session_is_its_own_connection(sshd: LoopbackSshd) -> None:
    pinned = _target(sshd, sshd.host_key_line)

    async def body() -> None:
        await _echo(pinned, "one", shared=True)
        await _echo(pinned, "two", shared=True)

    before = CONNECT_STATS.connections
    asyncio.run(body())
    assert CONNECT_STATS.connections - before == 2


CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="none")


def test_operations_share_one_loop_keep_their_callers_context_and_raise_their_errors() -> None:
    async def loop_and_caller() -> tuple[asyncio.AbstractEventLoop, str]:
        return asyncio.get_running_loop(), CALLER.get()

    async def fails() -> None:
        raise ValueError("the operation's own error")

    CALLER.set("provider thread")
    first_loop, seen = run_operation(loop_and_caller())
    second_loop, _ = run_operation(loop_and_caller())
    assert first_loop is second_loop and seen == "provider thread"
    assert session_pool.share_logins_on(first_loop) is not None
    with pytest.raises(ValueError, match="the operation's own error"):
        run_operation(fails())
