"""Where a run's CPU time goes on this machine (LAB ONLY: for the benchmarks).

A sampler reads every process's user + system time from /proc once a second while a run goes on
and keeps, per process, the last figure it saw minus the first (a process that starts during the
run counts from zero; one that ends counts up to its last sample, so up to a second of a
short-lived process's time is lost). Processes are grouped by what they are:

* ``engine``: the Pulumi CLI (``pulumi``), which plans and drives every resource;
* ``language_host``: ``pulumi-language-python`` and the program it runs (``__main__.py``);
* ``providers``: the dynamic providers' processes (``pulumi-resource-pulumi-python`` and the
  Python they start), where the program's SSH and API work runs;
* ``control_plane``: the lab's kube-apiserver, kine, kube-controller-manager, kube-scheduler;
* ``lab_hosts``: every process in another PID namespace than the sampler's (the lab hosts'
  systemd, sshd, shells, the k3s stand-in), and the ``systemd-nspawn`` supervisors;
* ``other``: the rest of the machine (other runs sharing it included).

Beside the groups: the machine's busy time from /proc/stat over the same window (every core),
so the share the groups explain and the machine's headroom (cores x wall time) can be compared.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_SECONDS = 1.0
CONTROL_PLANE = ("kube-apiserver", "kine", "kube-controller", "kube-scheduler")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cpu_seconds(stat: str) -> float:
    # Fields after the command (which may hold spaces) start after its closing parenthesis.
    fields = stat.rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS if len(fields) > 12 else 0.0


def _machine_busy_seconds() -> float:
    values = [int(v) for v in _read(Path("/proc/stat")).splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def classify(comm: str, cmdline: str, foreign_namespace: bool) -> str:
    """The group of one process (see the module docstring)."""
    if comm == "pulumi":
        return "engine"
    if "pulumi-resource-pulumi-python" in cmdline or "pulumi.dynamic" in cmdline:
        return "providers"
    if "pulumi-language-python" in cmdline or "__main__.py" in cmdline:
        return "language_host"
    if any(name in comm for name in CONTROL_PLANE):
        return "control_plane"
    if foreign_namespace or comm == "systemd-nspawn":
        return "lab_hosts"
    return "other"


class CpuProfile:
    """Samples every process's CPU time while open (a context manager); `report()` after."""

    def __init__(self) -> None:
        self.own_namespace = os.readlink("/proc/self/ns/pid")
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.group: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = self.ended = 0.0
        self.busy_start = self.busy_end = 0.0

    def _sample(self) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            stat = _read(entry / "stat")
            if not stat:
                continue
            seconds = _cpu_seconds(stat)
            if pid not in self.group:
                try:
                    namespace = os.readlink(entry / "ns" / "pid")
                except OSError:
                    continue
                comm = _read(entry / "comm").strip()
                cmdline = _read(entry / "cmdline").replace("\0", " ")
                self.group[pid] = classify(comm, cmdline, namespace != self.own_namespace)
                # Started before the profile: only what it spends from now on counts.
                self.first[pid] = seconds if not self.started else 0.0
            self.last[pid] = seconds

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample()

    def __enter__(self) -> CpuProfile:
        self._sample()
        self.started, self.busy_start = time.monotonic(), _machine_busy_seconds()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.ended, self.busy_end = time.monotonic(), _machine_busy_seconds()

    def report(self) -> dict[str, Any]:
        """CPU seconds per group, the machine's busy seconds and its capacity over the window."""
        groups: dict[str, float] = defaultdict(float)
        for pid, seconds in self.last.items():
            groups[self.group[pid]] += max(seconds - self.first.get(pid, 0.0), 0.0)
        wall = self.ended - self.started
        cores = os.cpu_count() or 1
        busy = self.busy_end - self.busy_start
        return {
            "wall_seconds": round(wall, 1),
            "cpu_seconds_by_group": {name: round(value, 1) for name, value in sorted(groups.items())},
            "machine_busy_cpu_seconds": round(busy, 1),
            "machine_capacity_cpu_seconds": round(wall * cores, 1),
            "machine_busy_share": round(busy / (wall * cores), 2) if wall else 0.0,
        }
