"""Logins shared by the operations of one provider process, so the SSH work of a run
grows with the hosts it touches, not with the steps it takes on each.

A run touches a host from several resources: a joining worker's probe, firewall,
join and disk probe; the server from every join of the process; a recorded
worker from its join's diff and its firewall update. Each opening its own
connection costs the host a handshake (and a slot under sshd's MaxStartups) per
step. Here the first of them logs in and the others reuse that connection:
SSH multiplexes sessions over one connection, as OpenSSH's ControlMaster does.

Rules that keep a shared login as trustworthy as a fresh one:
- A connection is shared only between callers that would log in the same way:
  the same address, port, user and private key, and a recorded host key equal to
  the key that connection verified. A caller with no recorded key (first contact)
  always logs in afresh; its connection is shared afterwards under the key it saw.
  So does a caller that reads who the host is (`login_anew`: the host probe, on
  create and on refresh): a host reinstalled since shows its new key there.
- Only call sites that ask for it share (`open_session(..., shared=True)`): a
  check of whether a key still logs in, or a wait for a host to go away, needs a
  login of its own.
- A connection idle for IDLE_PROBE_SECONDS or more is asked to run `true` before
  it is handed out (bounded by the caller's connect deadline); one that fails is
  closed and a fresh login made instead. Nothing the caller asked for has run on it
  yet, so nothing is ever sent twice.
- At most USERS_PER_CONNECTION callers at once on one connection, well under
  OpenSSH's default MaxSessions (10) for the few sessions each opens at a time.
- A connection nobody used for IDLE_CLOSE_SECONDS is closed.

The pool belongs to one event loop (asyncssh connections are bound to the loop that
made them): providers.base runs every operation of a provider process on one loop,
which has a pool. Anywhere else (asyncio.run in the operator API, tests), no pool is
active and `shared=True` opens and closes a connection as before.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncssh  # loaded on first use, as in remote_access.ssh


IDLE_PROBE_SECONDS = 2.0
IDLE_CLOSE_SECONDS = 120.0
USERS_PER_CONNECTION = 4


@dataclass(frozen=True)
class LoginKey:
    """What makes two logins the same: where, as whom, with which private key."""

    address: str
    port: int
    user: str
    private_key_sha256: str

    @classmethod
    def of(cls, address: str, port: int, user: str, private_key: str) -> LoginKey:
        return cls(address, port, user, hashlib.sha256(private_key.encode()).hexdigest())


@dataclass(eq=False)
class SharedConnection:
    """One open, authenticated connection and who is using it."""

    connection: asyncssh.SSHClientConnection
    host_key: str
    users: int = 0
    idle_since: float = field(default_factory=time.monotonic)

    def usable_for(self, recorded_host_key: str) -> bool:
        return (
            not self.connection.is_closed() and self.host_key == recorded_host_key and self.users < USERS_PER_CONNECTION
        )


Connect = Callable[[], Awaitable[tuple["asyncssh.SSHClientConnection", str]]]


class SessionPool:
    """The shared connections of one event loop."""

    def __init__(self) -> None:
        self._connections: dict[LoginKey, list[SharedConnection]] = {}
        self._locks: dict[LoginKey, asyncio.Lock] = {}

    async def lease(
        self,
        key: LoginKey,
        recorded_host_key: str | None,
        connect: Connect,
        probe_seconds: float,
        *,
        login_anew: bool = False,
    ) -> SharedConnection:
        """A connection for one caller: a shared one that logs in as `key` pinned to
        `recorded_host_key`, or a new one from `connect` (which the pool keeps). With
        `login_anew`, always a new one (the caller's purpose is to see who answers now)."""
        # One caller at a time per login: callers that arrive together share the first login.
        async with self._locks.setdefault(key, asyncio.Lock()):
            if recorded_host_key is not None and not login_anew:
                for shared in list(self._connections.get(key, [])):
                    if not shared.usable_for(recorded_host_key):
                        if shared.connection.is_closed():
                            self._forget(key, shared)
                        continue
                    if shared.users == 0 and not await self._answers(shared, probe_seconds):
                        self._forget(key, shared)
                        shared.connection.close()
                        continue
                    shared.users += 1
                    return shared
            connection, host_key = await connect()
            shared = SharedConnection(connection, host_key, users=1)
            self._connections.setdefault(key, []).append(shared)
            return shared

    def give_back(self, key: LoginKey, shared: SharedConnection) -> None:
        """The caller is done with `shared`; it stays open for the next one a while."""
        shared.users -= 1
        shared.idle_since = time.monotonic()
        if shared.connection.is_closed():
            self._forget(key, shared)
            return
        asyncio.get_running_loop().call_later(IDLE_CLOSE_SECONDS, self._close_if_idle, key, shared)

    def _close_if_idle(self, key: LoginKey, shared: SharedConnection) -> None:
        if shared.users == 0 and time.monotonic() - shared.idle_since >= IDLE_CLOSE_SECONDS - 0.5:
            self._forget(key, shared)
            shared.connection.close()

    def _forget(self, key: LoginKey, shared: SharedConnection) -> None:
        kept = self._connections.get(key, [])
        if shared in kept:
            kept.remove(shared)

    @staticmethod
    async def _answers(shared: SharedConnection, seconds: float) -> bool:
        """Whether a connection idle a while still reaches its host (a host that went away
        without closing it leaves it open on this side)."""
        import asyncssh  # noqa: PLC0415 - loaded on first use, as in remote_access.ssh

        if time.monotonic() - shared.idle_since < IDLE_PROBE_SECONDS:
            return True
        try:
            async with asyncio.timeout(seconds):
                result = await shared.connection.run("true", check=False)
        except (TimeoutError, asyncssh.Error, OSError):
            return False
        return result.exit_status == 0

    def close_all(self) -> None:
        """Close every connection (when the loop that owns them ends)."""
        for shared_list in self._connections.values():
            for shared in shared_list:
                shared.connection.close()
        self._connections.clear()


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SessionPool] = weakref.WeakKeyDictionary()


def share_logins_on(loop: asyncio.AbstractEventLoop) -> SessionPool:
    """Give `loop` a pool: `open_session(..., shared=True)` on it shares connections."""
    return _POOLS.setdefault(loop, SessionPool())


def active_pool() -> SessionPool | None:
    """The running loop's pool, if it has one."""
    try:
        return _POOLS.get(asyncio.get_running_loop())
    except RuntimeError:
        return None
