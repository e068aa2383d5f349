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

import argparse
import json
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_SECONDS = 1.0
#: The speed probe's work: about 2 CPU seconds of one core on the lab's machine on a good day.
SPEED_PROBE_ROUNDS = 3_000_000
#: How many commands the CI profile lists, the costliest first.
COMMANDS_REPORTED = 40
CONTROL_PLANE = ("kube-apiserver", "kine", "kube-controller", "kube-scheduler")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _processes() -> Iterator[tuple[Path, int, str]]:
    """Each live process's /proc directory, pid and stat line (one that ended while read is skipped)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _read(entry / "stat")):
            yield entry, int(entry.name), stat


def _group_of(entry: Path, own_namespace: str) -> str | None:
    """The group of the process at `entry`, or None when it ended before its namespace was read."""
    try:
        namespace = os.readlink(entry / "ns" / "pid")
    except OSError:
        return None
    comm = _read(entry / "comm").strip()
    cmdline = _read(entry / "cmdline").replace("\0", " ")
    return classify(comm, cmdline, namespace != own_namespace)


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


def command_label(comm: str, cmdline: str) -> str:
    """What a process is, for the per-command list: its comm, and for Python what it runs
    (`python -m pip`, the program, a dynamic provider, pytest), all of which are "python"."""
    if not comm.startswith("python"):
        return comm
    words = cmdline.split()
    if "pulumi-language-python-exec" in cmdline:
        return "python: the Pulumi program"
    if "pulumi.dynamic" in words:
        return "python: dynamic providers"
    if "-m" in words[:-1]:
        return f"python -m {words[words.index('-m') + 1]}"
    scripts = [Path(word).name for word in words[1:] if not word.startswith("-")]
    return f"{comm} {scripts[0]}" if scripts else comm


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
        for entry, pid, stat in _processes():
            seconds = _cpu_seconds(stat)
            if pid not in self.group:
                group = _group_of(entry, self.own_namespace)
                if group is None:
                    continue
                self.group[pid] = group
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


# ---- The CI profile: CPU seconds per lab set-up step and per test module ---------------------
#
# `scripts/test.sh` with HK3S_CPU_PROFILE=FILE runs `python -m lab.cpu_profile ci` beside the
# whole run. Who spent a process's CPU time is read from the process itself:
#
# * ACCOUNT_VAR in its environment (/proc/PID/environ: what it was started with), else in its
#   nearest ancestor's that has it (walking PPid, which /proc gives in this PID namespace even
#   for a lab host's processes, up through the host's init to its systemd-nspawn). The lab
#   set-up exports "setup:<step>" for each step, the static checks "static checks", and the
#   pytest plugin (lab.cpu_profile_plugin) sets "tests:<worker>" in each pytest process before
#   any test starts, so everything a test starts inherits it: its Pulumi engine and provider
#   processes, the control plane, the hosts' detached supervisors and so the hosts. A process
#   whose environment was replaced whole and whose ancestors hold no account (or which was
#   re-parented to init before it was first seen) is unattributed, counted by its group.
# * A test process's account is turned into a test module through the plugin's events: each
#   worker appends (time, account, pid, module) when it starts a test of another module. With
#   `--dist loadfile` a worker runs one module at a time, so a process started by worker gw1 is
#   charged to the module gw1 was running when the process was first seen (a process that
#   outlives its module stays with the module that started it); the pytest worker's own time
#   goes, sample by sample, to the module it is running then. Module-scoped fixtures' set-up and
#   teardown run inside their module's first and last test, so they count there; a
#   session-scoped fixture is charged to the module whose test first needed it.
# * Each process's time is user + system of itself and of its children it has waited for
#   (utime + stime + cutime + cstime), so a short-lived command (an ssh, a kubectl) that starts
#   and ends between two samples is still counted, in its parent's account. A child that was
#   seen itself is not counted twice: when it is gone, what was counted for it is taken off its
#   parent's next growth of children time.
# * Unattributed: the time before a tracked process was first seen if it was started between
#   two samples and outlived its parent's interest (re-parented to init), the sampler itself
#   (reported apart), and everything else on the machine ("other" runs included), by group.

ACCOUNT_VAR = "HK3S_CPU_ACCOUNT"
EVENTS_VAR = "HK3S_CPU_PROFILE_EVENTS"
CI_SAMPLE_SECONDS = 2.0


def _times(stat: str) -> tuple[float, float, int, int]:
    """(own CPU seconds, waited-for children's CPU seconds, ppid, start time in ticks)."""
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20:
        return 0.0, 0.0, 0, 0
    own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    children = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    return own, children, int(fields[1]), int(fields[19])


def _environ_account(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = (ACCOUNT_VAR + "=").encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


class ModuleTimeline:
    """Which test module each test process (account "tests:<worker>") was running, when."""

    def __init__(self) -> None:
        self.changes: dict[str, list[tuple[float, str]]] = defaultdict(list)
        self.worker_pids: dict[int, str] = {}

    def add(self, at: float, account: str, pid: int, module: str) -> None:
        self.changes[account].append((at, module))
        self.changes[account].sort()
        self.worker_pids[pid] = account

    def module_at(self, account: str, at: float) -> str | None:
        current = None
        for when, module in self.changes.get(account, ()):
            if when > at:
                break
            current = module
        return current

    def read_events(self, path: Path, offset: int) -> int:
        """Adds the events appended to PATH since OFFSET; returns the new offset."""
        try:
            with path.open("rb") as events:
                events.seek(offset)
                data = events.read()
        except OSError:
            return offset
        complete = data.rpartition(b"\n")[0]
        for line in complete.splitlines():
            at, account, pid, module = line.decode().split("\t")
            self.add(float(at), account, int(pid), module)
        return offset + len(complete) + (1 if complete else 0)


def charge_key(account: str | None, group: str, timeline: ModuleTimeline, first_seen: float) -> tuple[str, str]:
    """(what the process's time is charged to, its group): "setup:<step>", "static checks",
    "module:<path>", "tests:<worker> (between modules)" or "unattributed"."""
    if account is None:
        return "unattributed", group
    if account.startswith("tests:"):
        module = timeline.module_at(account, first_seen)
        return (f"module:{module}" if module else f"{account} (before its first module)"), group
    return account, group


class Accountant:
    """Per-sample bookkeeping of every process's CPU time, charged by `charge_key` (pure logic:
    fed with /proc snapshots by CiProfile, with made-up ones by the unit tests)."""

    def __init__(self, timeline: ModuleTimeline, profiler_pid: int) -> None:
        self.timeline = timeline
        self.profiler_pid = profiler_pid
        self.started = False
        # (pid, start ticks) -> state
        self.own: dict[tuple[int, int], float] = {}
        self.children: dict[tuple[int, int], float] = {}
        self.ppid: dict[tuple[int, int], int] = {}
        self.last_total: dict[tuple[int, int], float] = {}
        self.key: dict[tuple[int, int], tuple[str, str]] = {}
        self.counted: dict[tuple[int, int], float] = defaultdict(float)
        self.owed: dict[tuple[int, int], float] = defaultdict(float)
        self.totals: dict[tuple[str, str], float] = defaultdict(float)
        # What each process runs (its comm); a child's time that reaches the profile only
        # through its parent's waited-for children counts under the parent's command.
        self.commands: dict[tuple[int, int], str] = {}
        self.by_command: dict[str, float] = defaultdict(float)
        self.profiler_seconds = 0.0

    def _charge(self, ident: tuple[int, int], seconds: float, at: float) -> None:
        if seconds <= 0:
            return
        self.counted[ident] += seconds
        if ident[0] == self.profiler_pid:
            self.profiler_seconds += seconds
            return
        worker = self.timeline.worker_pids.get(ident[0])
        # A pytest process itself is charged to the module it runs now.
        key = self.key[ident] if worker is None else charge_key(worker, self.key[ident][1], self.timeline, at)
        self.totals[key] += seconds
        self.by_command[self.commands.get(ident, "?")] += seconds

    def sample(self, at: float, processes: Mapping[tuple[int, int], tuple[float, float, int, str | None, str]]) -> None:
        """PROCESSES: (pid, start ticks) -> (own s, children s, ppid, account in its environment, group)."""
        by_pid = {ident[0]: ident for ident in processes}
        # Children before parents (a child starts after its parent), so what a child still owes
        # passes on to its parent in the same sample.
        gone = sorted((i for i in self.own if i not in processes), key=lambda i: -i[1])
        parents = {**{i[0]: i for i in gone}, **by_pid}
        for ident in gone:
            # Gone: its parent's children time has grown (or will) by its whole time, of which
            # all it had at its last sample is owed back (counted here already, or spent before
            # the profile began), and so is what it still owed for its own children that ended
            # after its last sample (their time is in its final total, counted already); only
            # the rest, spent after its last sample, is new. An orphan is reaped by init (or by
            # a subreaper, which this does not follow: its last-seen time is then counted twice).
            parent = parents.get(self.ppid.get(ident, 0)) or by_pid.get(1)
            owed = self.last_total[ident] + self.owed.pop(ident, 0.0)
            if parent is not None:
                self.owed[parent] += owed
            del self.own[ident]
        for ident, (own, children, ppid, _environ, group) in processes.items():
            if ident not in self.key:
                self.key[ident] = charge_key(self._account(ident, processes, by_pid), group, self.timeline, at)
                if not self.started:
                    # Running before the profile: only what it spends from now on counts.
                    self.own[ident], self.children[ident] = own, children
                else:
                    self.own[ident], self.children[ident] = 0.0, 0.0
            self._charge(ident, own - self.own[ident], at)
            grown = max(children - self.children[ident], 0.0)
            owed = self.owed.pop(ident, 0.0)
            offset = min(grown, owed)
            if owed > offset:
                self.owed[ident] = owed - offset
            self._charge(ident, grown - offset, at)
            self.own[ident], self.children[ident] = own, children
            self.last_total[ident] = own + children
            self.ppid[ident] = ppid
        self.started = True

    def _account(
        self,
        ident: tuple[int, int],
        processes: Mapping[tuple[int, int], tuple[float, float, int, str | None, str]],
        by_pid: dict[int, tuple[int, int]],
    ) -> str | None:
        seen: set[int] = set()
        current: tuple[int, int] | None = ident
        while current is not None and current[0] not in seen:
            seen.add(current[0])
            account = processes[current][3]
            worker = self.timeline.worker_pids.get(current[0])
            if worker is not None:
                return worker
            if account is not None:
                return account
            current = by_pid.get(processes[current][2])
        return None

    def report(self) -> dict[str, Any]:
        setup: dict[str, float] = defaultdict(float)
        modules: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        rest: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for (charged, group), seconds in self.totals.items():
            if charged.startswith("setup:"):
                setup[charged.removeprefix("setup:")] += seconds
            elif charged.startswith("module:"):
                modules[charged.removeprefix("module:")][group] += seconds
            else:
                rest[charged][group] += seconds

        def rounded(values: dict[str, float]) -> dict[str, float]:
            return {name: round(value, 1) for name, value in sorted(values.items(), key=lambda kv: -kv[1])}

        module_totals = {name: sum(groups.values()) for name, groups in modules.items()}
        return {
            "lab_setup_cpu_seconds": rounded(setup),
            "lab_setup_cpu_seconds_total": round(sum(setup.values()), 1),
            "test_modules_cpu_seconds": rounded(module_totals),
            "test_modules_cpu_seconds_total": round(sum(module_totals.values()), 1),
            "test_modules_cpu_seconds_by_group": {
                name: rounded(modules[name]) for name in sorted(modules, key=lambda n: -module_totals[n])
            },
            "other_accounts_cpu_seconds_by_group": {name: rounded(groups) for name, groups in sorted(rest.items())},
            "profiler_cpu_seconds": round(self.profiler_seconds, 1),
            "cpu_seconds_by_command": dict(list(rounded(self.by_command).items())[:COMMANDS_REPORTED]),
        }


class CiProfile:
    """Samples /proc every CI_SAMPLE_SECONDS into an Accountant until stopped."""

    def __init__(self, events: Path) -> None:
        self.events = events
        self.offset = 0
        self.timeline = ModuleTimeline()
        self.accountant = Accountant(self.timeline, os.getpid())
        self.own_namespace = os.readlink("/proc/self/ns/pid")
        self.known: dict[tuple[int, int], tuple[str | None, str]] = {}
        self.started = self.busy_start = 0.0

    def sample(self) -> None:
        self.offset = self.timeline.read_events(self.events, self.offset)
        snapshot: dict[tuple[int, int], tuple[float, float, int, str | None, str]] = {}
        for entry, pid, stat in _processes():
            own, children, ppid, start = _times(stat)
            ident = (pid, start)
            if ident not in self.known:
                group = _group_of(entry, self.own_namespace)
                if group is None:
                    continue
                self.known[ident] = (_environ_account(pid), group)
                self.accountant.commands[ident] = command_label(
                    _read(entry / "comm").strip(), _read(entry / "cmdline").replace("\0", " ")
                )
            account, group = self.known[ident]
            snapshot[ident] = (own, children, ppid, account, group)
        self.accountant.sample(time.monotonic(), snapshot)

    def run(self, stop: threading.Event) -> dict[str, Any]:
        self.sample()
        self.started, self.busy_start = time.monotonic(), _machine_busy_seconds()
        while not stop.wait(CI_SAMPLE_SECONDS):
            self.sample()
        self.sample()
        wall = time.monotonic() - self.started
        busy = _machine_busy_seconds() - self.busy_start
        cores = os.cpu_count() or 1
        report = self.accountant.report()
        counted = sum(self.accountant.totals.values()) + self.accountant.profiler_seconds
        return {
            "wall_seconds": round(wall, 1),
            "cores": cores,
            "machine_busy_cpu_seconds": round(busy, 1),
            "machine_capacity_cpu_seconds": round(wall * cores, 1),
            "machine_busy_share": round(busy / (wall * cores), 2) if wall else 0.0,
            "counted_cpu_seconds": round(counted, 1),
            **report,
        }


def speed_probe_seconds(rounds: int = SPEED_PROBE_ROUNDS) -> float:
    """The CPU seconds one core takes for a fixed piece of pure-Python work (hashing and integer
    arithmetic). Wall times of runs on shared machines are only comparable with the machine's speed
    beside them: the same cold run took 3269 s one day and 4739 s three sessions later on the
    "same" 2-core machine."""
    started = time.process_time()
    value = 0
    for index in range(rounds):
        value = (value * 31 + hash((index, value & 0xFFFF))) & 0xFFFFFFFF
    return round(time.process_time() - started, 3)


def main(argv: list[str] | None = None) -> None:
    """`python -m lab.cpu_profile ci --out FILE --events FILE`: profiles until SIGTERM or SIGINT,
    then writes the report to FILE."""
    parser = argparse.ArgumentParser(prog="python -m lab.cpu_profile")
    parser.add_argument("mode", choices=["ci"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--events", type=Path, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    report = CiProfile(args.events).run(stop)
    # After the run (the sampler must start at once), when the machine has quieted down.
    report["speed_probe_cpu_seconds"] = speed_probe_seconds()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
