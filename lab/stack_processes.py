"""The processes a lab stack's runs started, found by the stack's directory, and ended. LAB ONLY:
used by the lab tests and the test suite's end; the product never imports it.

A run of a stack in a directory (lab/stack_harness.LabStack) starts the Pulumi CLI, its
language host, the program, the dynamic provider processes (and the shell scripts that launch
them), plugins such as the Kubernetes provider, and the program's forward to the Kubernetes API.
Each of them either works in the stack's project copy (the CLI starts its plugins there, the
forward runs from the copy), names the directory on its command line, or carries the stack's
Pulumi home or state backend in its environment (`PULUMI_HOME`, `PULUMI_BACKEND_URL`). That is
how they are told apart from every other process on the machine, including the runs of other
test sessions beside this one, whose stacks live in directories of their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

# Environment variables whose value places a process in a stack: what LabStack gives its runs.
STACK_ENVIRONMENT = ("PULUMI_HOME", "PULUMI_BACKEND_URL")


@dataclass(frozen=True)
class StackProcess:
    """A running process that belongs to a stack directory, and how it was told."""

    pid: int
    name: str
    command: str
    belongs_by: str  # "working directory", "command line" or "environment"

    def __str__(self) -> str:
        return f"{self.pid} {self.name} ({self.belongs_by}): {self.command[:300]}"


def _names(directory: Path) -> re.Pattern[str]:
    # The directory, or a path inside it, anywhere in a text: not followed by another character
    # of a file name, so /tmp/pytest-1 never matches /tmp/pytest-12.
    return re.compile(re.escape(str(directory)) + r"(?![\w.-])")


def _ancestors(pid: int) -> set[int]:
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def _belongs_by(pid: int, directory: Path, pattern: re.Pattern[str]) -> tuple[str, str] | None:
    """How process `pid` belongs to `directory` and its command line, or None. Processes whose
    files cannot be read (gone meanwhile, another user's, a zombie) are not taken."""
    proc = Path(f"/proc/{pid}")
    try:
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None  # a kernel thread or a zombie
    command = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    with contextlib.suppress(OSError):
        if Path(os.readlink(proc / "cwd")).is_relative_to(directory):
            return "working directory", command
    if pattern.search(command):
        return "command line", command
    with contextlib.suppress(OSError):
        for entry in (proc / "environ").read_bytes().split(b"\0"):
            key, _, value = entry.decode(errors="replace").partition("=")
            if key in STACK_ENVIRONMENT and pattern.search(value):
                return "environment", command
    return None


def processes_under(directory: Path) -> list[StackProcess]:
    """Every running process that belongs to `directory` (see the module's docstring), never this
    process or one of its ancestors (a test session running from inside the directory)."""
    directory = directory.resolve()
    pattern = _names(directory)
    spared = _ancestors(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        belongs = _belongs_by(int(entry.name), directory, pattern)
        if belongs is None:
            continue
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        found.append(StackProcess(int(entry.name), name, belongs[1], belongs[0]))
    return sorted(found, key=lambda process: process.pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


def _signal(processes: list[StackProcess], sig: signal.Signals) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)


def _still_running(processes: list[StackProcess], wait_seconds: float) -> list[StackProcess]:
    """Those of `processes` still running after up to `wait_seconds` (less once all ended)."""
    deadline = time.monotonic() + wait_seconds
    while (running := [p for p in processes if _alive(p.pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return running


def end_processes(processes: list[StackProcess], grace_seconds: float = 5.0) -> list[StackProcess]:
    """End `processes`: SIGTERM, then SIGKILL for those still running after `grace_seconds`.
    Returns those that still run after both (none, unless the kernel holds one)."""
    _signal(processes, signal.SIGTERM)
    stubborn = _still_running(processes, grace_seconds)
    _signal(stubborn, signal.SIGKILL)
    return _still_running(stubborn, 5.0)
