"""Keeps one lab host (a systemd-nspawn container) running.

Started detached by ``lab.hosts`` (standard library only).  It runs
systemd-nspawn, starts it again when the container asks for a reboot
(nspawn exits 133, or the container's init changes under the same nspawn),
and stops it on request:

* SIGTERM: orderly shutdown (nspawn forwards SIGRTMIN+3 to the container's
  init), hard stop after the grace period.
* SIGUSR1: hard power off (SIGKILL to the container's init, which ends its
  whole PID namespace).

Usage: supervisor.py HOST_DIR GRACE_SECONDS -- NSPAWN_ARGV...

HOST_DIR receives ``supervisor.pid``, ``nspawn.pid`` and ``boots`` (count of
container starts). When HOST_DIR holds ``cgroups`` (a pod-capable host: one cgroup
directory per line), the supervisor first moves itself into each, so nspawn and the
container start inside the host's own subtree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REBOOT_EXIT = 133


def container_leader(nspawn_pid: int) -> int | None:
    """PID (in our namespace) of the container's init: a child of nspawn whose NSpid ends in 1."""
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


class Supervisor:
    def __init__(self, host_dir: Path, grace: float, argv: list[str]) -> None:
        self.host_dir = host_dir
        self.grace = grace
        self.argv = argv
        self.stop_mode: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def _on_term(self, _signum: int, _frame: object) -> None:
        self.stop_mode = "graceful"
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def _on_usr1(self, _signum: int, _frame: object) -> None:
        self.stop_mode = "hard"
        self._kill_container()

    def _kill_container(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        leader = container_leader(self.proc.pid)
        if leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader, signal.SIGKILL)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def _write(self, name: str, value: str) -> None:
        tmp = self.host_dir / f".{name}.tmp"
        tmp.write_text(value)
        os.replace(tmp, self.host_dir / name)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cgroups = self.host_dir / "cgroups"
        if cgroups.exists():
            for directory in cgroups.read_text().split():
                Path(directory, "cgroup.procs").write_text(str(os.getpid()))
        self._write("supervisor.pid", str(os.getpid()))
        boots_file = self.host_dir / "boots"
        rc = 0
        try:
            while self.stop_mode is None:
                boots = int(boots_file.read_text()) if boots_file.exists() else 0
                self._write("boots", str(boots + 1))
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)
                self._write("nspawn.pid", str(self.proc.pid))
                deadline: float | None = None
                while True:
                    try:
                        rc = self.proc.wait(timeout=0.5)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if self.stop_mode is not None and deadline is None:
                        deadline = time.monotonic() + (self.grace if self.stop_mode == "graceful" else 5.0)
                    if deadline is not None and time.monotonic() > deadline:
                        self._kill_container()
                        deadline = time.monotonic() + 5.0
                        if self.proc.poll() is None:
                            with contextlib.suppress(ProcessLookupError):
                                self.proc.kill()
                print(f"supervisor: systemd-nspawn exited with {rc}", file=sys.stderr, flush=True)
                if rc != REBOOT_EXIT:
                    break
                time.sleep(0.2)
        finally:
            for name in ("nspawn.pid", "supervisor.pid"):
                with contextlib.suppress(FileNotFoundError):
                    (self.host_dir / name).unlink()
        return rc


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    return Supervisor(Path(argv[1]), float(argv[2]), argv[4:]).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
