"""The stack's lock in its backend, held by an operation that makes no Pulumi run of its own (a
reboot, a workload start, a Hetzner worker powered on before its unfence).

Such an operation changes the cluster as a run does, and must keep apart from any run or other
operation on any machine that shares the state: two operators in two places must not reboot two
workers at once. The operator lock (operator_api.locks.OperatorLock) keeps callers apart on one
machine only. So the operation takes the very lock a `pulumi up` takes, in the backend, the way
Pulumi's DIY backend takes it (pulumi pkg/backend/diy/lock.go, Lock): it writes
`.pulumi/locks/<org>/<project>/<stack>/<uuid>.json` holding its pid, user, host and start time,
lists the folder again, and backs off, its own object removed, when another lock is there. A
`pulumi up` anywhere then refuses while the operation runs ("the stack is currently locked"),
naming it, and another operation is refused naming the holder (StackBusyError). Its object goes
when the operation ends; one left by a process killed on another machine is removed only on an
operator's word (`unlock`), as a run's is.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from .errors import StackBusyError
from .locks import read_pulumi_locks
from .s3_backend import S3Backend

# The organization of a DIY backend's project-scoped layout (`.pulumi/stacks/<org>/<project>/...`).
DIY_ORGANIZATION = "organization"


def lock_content(action: str) -> bytes:
    """What Pulumi writes into a lock (its lockContent: pid, username, hostname, timestamp in RFC
    3339), and the action, which Pulumi ignores when it reads the lock."""
    record = {
        "pid": os.getpid(),
        "username": getpass.getuser(),
        "hostname": socket.gethostname(),
        "timestamp": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "action": action,
    }
    return json.dumps(record).encode()


def _stack_lock_folder(stack_keys: list[str], project: str, stack: str) -> str:
    """The stack's lock folder, as the backend lays out its stacks: project-scoped
    (`.pulumi/locks/<org>/<project>/<stack>/`, Pulumi's layout since 3.61), or, for a backend still
    in the older layout (`.pulumi/stacks/<stack>.json`, and no project-scoped stack), `.pulumi/locks/<stack>/`."""
    for key in stack_keys:
        parts = key.split("/")
        if len(parts) == 5 and parts[3] == project and parts[4] in (f"{stack}.json", f"{stack}.json.gz"):
            return f".pulumi/locks/{parts[2]}/{project}/{stack}/"
    if {f".pulumi/stacks/{stack}.json", f".pulumi/stacks/{stack}.json.gz"} & set(stack_keys):
        return f".pulumi/locks/{stack}/"
    return f".pulumi/locks/{DIY_ORGANIZATION}/{project}/{stack}/"


@contextlib.contextmanager
def hold_s3_lock(s3: S3Backend, project: str, stack: str, action: str) -> Iterator[None]:
    """The stack's lock object in the bucket, held while the block runs (see the module docstring)."""
    folder = _stack_lock_folder(s3.list_keys(".pulumi/stacks/"), project, stack)
    key = f"{folder}{uuid.uuid4()}.json"
    s3.put(key, lock_content(action))
    try:
        others = [holder for holder in s3.locks(project, stack) if not holder.path.endswith(f"/{key}")]
        if others:
            raise StackBusyError(
                stack,
                others,
                "held by a Pulumi run or another operation in the bucket; if that run is dead (a runner that "
                f"went down), `scripts/hk3s --stack {stack} unlock` shows the lock and removes it on your word",
            )
        yield
    finally:
        s3.delete(key)


@contextlib.contextmanager
def hold_file_lock(backend: Path, project: str, stack: str, action: str) -> Iterator[None]:
    """The stack's lock file in a `file://` backend, held while the block runs."""
    stacks = backend / ".pulumi" / "stacks"
    keys = [str(path.relative_to(backend)) for path in stacks.rglob("*.json*")] if stacks.exists() else []
    path = backend / _stack_lock_folder(keys, project, stack) / f"{uuid.uuid4()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(descriptor, lock_content(action))
    finally:
        os.close(descriptor)
    try:
        others = [lock.holder for lock in read_pulumi_locks(backend, project, stack) if lock.path != path]
        if others:
            raise StackBusyError(stack, others, "held by a Pulumi run or another operation")
        yield
    finally:
        path.unlink(missing_ok=True)
