"""Commands, processes and mounts on this machine: what every other part of the lab runs
through (a command that fails raises :class:`LabError` naming it and its stderr)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lab.hosts.errors import LabError

log = logging.getLogger("lab.hosts")


def _run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    timeout: float | None = 120,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    args = [os.fspath(a) for a in argv]
    log.debug("run: %s", shlex.join(args))
    try:
        proc = subprocess.run(
            args,
            check=False,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as err:
        raise LabError(f"timed out after {timeout}s: {shlex.join(args)}") from err
    except FileNotFoundError as err:
        raise LabError(f"command not found: {args[0]}") from err
    if check and proc.returncode != 0:
        raise LabError(f"command failed ({proc.returncode}): {shlex.join(args)}\n{proc.stderr.strip()}")
    return proc


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return _run(argv, check=check)


def _ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    out = _ip("-j", *args, netns=netns).stdout.strip()
    return list(json.loads(out)) if out else []


def _nft(ruleset: str, netns: str | None = None) -> None:
    argv = (["ip", "netns", "exec", netns] if netns else []) + ["nft", "-f", "-"]
    _run(argv, input_text=ruleset)


def _sysctl(key: str, value: str, netns: str | None = None) -> None:
    argv = (["ip", "netns", "exec", netns] if netns else []) + ["sysctl", "-qw", f"{key}={value}"]
    _run(argv)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _container_leader(nspawn_pid: int) -> int | None:
    """PID of the container's init: a child of systemd-nspawn whose innermost NSpid is 1."""
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                if len(ids) > 1 and ids[-1] == "1":
                    return int(child)
    return None


def _mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first."""
    found: list[Path] = []
    prefix = os.fspath(path).rstrip("/")
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(Path(mount_point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _umount_all(path: Path) -> None:
    for _ in range(3):
        mounts = _mounts_under(path)
        if not mounts:
            return
        for mount_point in mounts:
            if _run(["umount", mount_point], check=False).returncode != 0:
                _run(["umount", "-l", mount_point], check=False)
    remaining = _mounts_under(path)
    if remaining:
        raise LabError(f"could not unmount {', '.join(map(str, remaining))}")


def _safe_rmtree(path: Path) -> None:
    """Remove a tree only when nothing is mounted inside it (never follow a bind of /dev or /proc)."""
    if not path.exists():
        return
    _umount_all(path)
    shutil.rmtree(path)


def _terminate(pid: int, timeout: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
