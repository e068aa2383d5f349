"""Who holds a stack: the Pulumi lock files of a local (file://) backend (those of an S3
backend: operator_api.s3_backend), and the operator lock this API takes around a whole
change (config edit and run).

The file backend writes one JSON file per running update under
``<backend>/.pulumi/locks/<org>/<project>/<stack>/`` with the CLI's pid and host.
A run killed with SIGKILL leaves its file behind, and every later run refuses
until it is gone. A lock is *stale* only when it was written on this host by a
process that no longer runs; a live process or another host means the stack is
busy, and this API never removes such a lock.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import getpass
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

from remote_access.api_forward import process_alive, process_parent_and_name
from remote_access.private_dir import UnsafeDirectoryError, private_directory

from .errors import LockHolder, StackBusyError, StackError, shown

LockState = Literal["live", "stale", "foreign"]


def backend_directory(backend_url: str) -> Path | None:
    """The directory of a `file://` backend URL (`file:///abs`, `file://~/dir`); None for any other backend."""
    if not backend_url.startswith("file://"):
        return None
    return Path(unquote(backend_url.removeprefix("file://").partition("?")[0])).expanduser()


def keep_state_private(backend: Path) -> None:
    """Make a `file://` backend's directory 0700 when the program makes it: the state holds
    every host's pinned key and the login key (encrypted) and the whole cluster's layout, none
    of it for other users of the machine. The default directory, made 0755 by earlier releases,
    is tightened; a directory the user chose and made is left as it is (it may be a team's)."""
    if backend.resolve() == (Path.home() / ".hk3s-state").resolve():
        try:
            private_directory(backend, tighten=True)
        except UnsafeDirectoryError as error:
            raise StackError(str(error)) from None
    elif not backend.exists():
        backend.mkdir(mode=0o700, parents=True)


def pulumi_lock_files(backend: Path, project: str, stack: str) -> list[Path]:
    """Lock files of one stack (project-scoped layout and the older unscoped one)."""
    locks = backend / ".pulumi" / "locks"
    found = [*locks.glob(f"*/{project}/{stack}/*.json"), *locks.glob(f"{stack}/*.json")]
    return sorted(path for path in found if path.is_file())


def _process_alive(pid: int, *, operation: bool = False) -> bool:
    """Whether the process that wrote a lock still runs: a Pulumi CLI, or, for the lock of an
    operation of this API (operator_api.backend_lock), whatever program embeds the API (its pid
    alive is enough: such a lock is judged only under the operator lock its holder keeps)."""
    if not process_alive(pid):
        return False
    # A recycled pid that now belongs to something else is not the run that locked. Its name
    # comes from /proc on Linux, from ps on macOS; a system that tells neither keeps the lock live.
    found = process_parent_and_name(pid)
    return found is None or operation or "pulumi" in found[1]


@dataclass(frozen=True)
class PulumiLock:
    """One lock file and what it says."""

    path: Path
    holder: LockHolder
    operation: str = ""  # the action of an operation of this API that wrote it; "" for a Pulumi run

    @property
    def state(self) -> LockState:
        if self.holder.hostname != socket.gethostname():
            return "foreign"
        if self.holder.pid is not None and _process_alive(self.holder.pid, operation=bool(self.operation)):
            return "live"
        return "stale"


def read_pulumi_locks(backend: Path, project: str, stack: str) -> list[PulumiLock]:
    locks = []
    for path in pulumi_lock_files(backend, project, stack):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            # Unreadable: treat as held by someone unknown rather than delete it.
            data = {"hostname": "unknown host"}
        holder = LockHolder(
            user=str(data.get("username", "?")),
            hostname=str(data.get("hostname", "?")),
            pid=int(data["pid"]) if isinstance(data.get("pid"), int) else None,
            since=str(data.get("timestamp", "")) + (f", {data['action']}" if data.get("action") else ""),
            path=str(path),
        )
        locks.append(PulumiLock(path, holder, str(data.get("action") or "")))
    return locks


class OperatorLock:
    """An exclusive `flock` per stack for callers of this API, held across the config
    edit and the run. The kernel drops it when the holder dies, so it never goes stale."""

    def __init__(self, backend: Path, project: str, stack: str) -> None:
        self.path = backend / ".hk3s-operator" / project / f"{stack}.lock"
        self.stack = stack

    @contextlib.contextmanager
    def hold(self, action: str) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StackBusyError(self.stack, [self._holder(fd)], "another operator call is running") from None
            record = {
                "pid": os.getpid(),
                "username": getpass.getuser(),
                "hostname": socket.gethostname(),
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "action": action,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @staticmethod
    def _holder(fd: int) -> LockHolder:
        data: dict[str, object] = {}
        for _ in range(40):  # the holder writes its record just after it takes the lock
            try:
                data = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                data = {}
            if data.get("pid"):
                break
            time.sleep(0.05)
        action = f", {data['action']}" if data.get("action") else ""
        pid = data.get("pid")
        return LockHolder(
            user=str(data.get("username", "?")),
            hostname=str(data.get("hostname", "?")),
            pid=pid if isinstance(pid, int) else None,
            since=str(data.get("timestamp", "")) + action,
        )


def lock_age(since: str, now: float | None = None) -> float | None:
    """Seconds since a lock's timestamp (Go's RFC 3339, nanoseconds and all); None when unreadable."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", since.strip())
    if match is None:
        return None
    fraction = (match[2] or "")[:7]  # Python reads at most microseconds
    zone = "+00:00" if match[3] in (None, "Z") else match[3]
    try:
        stamp = datetime.datetime.fromisoformat(f"{match[1]}{fraction}{zone}")
    except ValueError:
        return None
    return (now if now is not None else time.time()) - stamp.timestamp()


def describe_age(seconds: float | None) -> str:
    if seconds is None:
        return "of unknown age"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s old"
    if seconds < 7200:
        return f"{seconds // 60} min old"
    return f"{seconds // 3600} h old"


@dataclass(frozen=True)
class UnlockReport:
    """The stack's Pulumi locks as `unlock` found them: each holder, its age in seconds (None
    when the timestamp is unreadable), and the ones removed (none without a confirmation)."""

    stack: str
    holders: list[LockHolder]
    ages: list[float | None]
    removed: list[LockHolder]

    def lines(self) -> list[str]:
        if not self.holders:
            return [f"stack {self.stack} is not locked"]
        return [
            f"{'removed' if holder in self.removed else 'locked by'} {holder}, {describe_age(age)}"
            + (f" ({shown(holder.path)})" if holder.path else "")
            for holder, age in zip(self.holders, self.ages, strict=True)
        ]
