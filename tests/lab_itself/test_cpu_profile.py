"""The benchmarks' CPU profile (lab/cpu_profile.py) on this machine's real processes: a busy
child is counted in full and in its group, and the groups follow what each process is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cpu_profile import (
    ACCOUNT_VAR,
    EVENTS_VAR,
    Accountant,
    CpuProfile,
    ModuleTimeline,
    classify,
    command_label,
    speed_probe_seconds,
)

# 1.5 s of CPU, then alive past the next sample: a process is counted up to its last sample.
BUSY = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass\ntime.sleep(2.5)\n"


def test_a_busy_child_started_during_the_window_is_counted_in_its_group() -> None:
    with CpuProfile() as profile:
        subprocess.run([sys.executable, "-c", BUSY], check=True)
    report = profile.report()
    # The child burnt 1.5 s of CPU; it ran in this PID namespace and is none of the named parts.
    assert report["cpu_seconds_by_group"]["other"] >= 1.4, report
    assert report["machine_busy_cpu_seconds"] >= 1.4, report
    assert report["machine_capacity_cpu_seconds"] >= report["wall_seconds"], report


def test_processes_are_grouped_by_what_they_are() -> None:
    assert classify("pulumi", "/cache/bin/pulumi up --yes", False) == "engine"
    assert classify("python3", "python3 -m pulumi.dynamic", False) == "providers"
    assert classify("pulumi-resourc", "pulumi-resource-pulumi-python 127.0.0.1:1", False) == "providers"
    assert classify("python3", "python3 /repo/__main__.py", False) == "language_host"
    assert classify("kube-apiserver", "kube-apiserver --etcd-servers=x", False) == "control_plane"
    assert classify("sshd", "sshd: root@notty", True) == "lab_hosts"
    assert classify("systemd-nspawn", "systemd-nspawn --boot", False) == "lab_hosts"
    assert classify("bash", "bash", False) == "other"


def test_the_speed_probe_counts_cpu_time_that_grows_with_its_work() -> None:
    small, large = speed_probe_seconds(100_000), speed_probe_seconds(800_000)
    assert 0 < small < large


def test_the_per_command_list_tells_pythons_apart_by_what_they_run() -> None:
    assert command_label("python", "/repo/venv/bin/python -m pip list -v --format json") == "python -m pip"
    assert command_label("python", "/p/venv/bin/python -u -m pulumi.dynamic 127.0.0.1:1") == "python: dynamic providers"
    program = "/repo/venv/bin/python /cache/bin/pulumi-language-python-exec --monitor 127.0.0.1:2 /repo"
    assert command_label("python", program) == "python: the Pulumi program"
    assert command_label("python3", "/usr/bin/python3 /usr/bin/cloud-init status") == "python3 cloud-init"
    assert command_label("kubectl", "kubectl get nodes -o json") == "kubectl"


# ---- The CI profile's attribution (lab/cpu_profile.py's Accountant), on made-up /proc snapshots.
# A snapshot maps (pid, start ticks) -> (own CPU s, waited-for children's CPU s, ppid, the
# HK3S_CPU_ACCOUNT its environment holds, group), as CiProfile reads it from /proc.


def _timeline() -> ModuleTimeline:
    timeline = ModuleTimeline()
    timeline.add(10.0, "tests:gw0", 100, "tests/lab/test_a.py")
    timeline.add(10.0, "tests:gw1", 200, "tests/lab/test_b.py")
    timeline.add(50.0, "tests:gw1", 200, "tests/lab/test_c.py")
    return timeline


def test_a_lab_host_is_charged_to_the_module_whose_worker_started_it_even_after_that_worker_moves_on() -> None:
    accountant = Accountant(_timeline(), profiler_pid=1)

    # gw1 (pid 200, no account in its own environment: pytest sets it at run time) started a
    # detached host supervisor (re-parented to init, but it inherited the account), whose
    # systemd-nspawn runs the host's init and its sshd (in the host's PID namespace, whose
    # environment nspawn replaced).
    def snapshot(sshd: float, worker: float) -> dict:
        return {
            (1, 1): (0.0, 0.0, 0, None, "other"),
            (200, 5): (worker, 0.0, 1, None, "other"),
            (300, 20): (0.1, 0.0, 1, "tests:gw1", "other"),
            (301, 21): (0.2, 0.0, 300, "tests:gw1", "lab_hosts"),
            (302, 22): (0.5, 0.0, 301, None, "lab_hosts"),
            (303, 23): (sshd, 0.0, 302, None, "lab_hosts"),
        }

    accountant.sample(5.0, {(1, 1): (0.0, 0.0, 0, None, "other"), (200, 5): (1.0, 0.0, 1, None, "other")})
    accountant.sample(20.0, snapshot(sshd=1.0, worker=3.0))
    accountant.sample(60.0, snapshot(sshd=4.0, worker=10.0))
    report = accountant.report()
    by_group = report["test_modules_cpu_seconds_by_group"]
    # The host's processes: started while gw1 ran test_b, so all their time is test_b's.
    assert by_group["tests/lab/test_b.py"]["lab_hosts"] == pytest.approx(0.2 + 0.5 + 4.0)
    # The worker's own time goes to the module it ran at each sample: 2 s to test_b, 7 s to test_c.
    assert by_group["tests/lab/test_b.py"]["other"] == pytest.approx(2.0 + 0.1)
    assert by_group["tests/lab/test_c.py"]["other"] == pytest.approx(7.0)
    assert "tests/lab/test_a.py" not in by_group


def test_a_short_lived_child_is_counted_once_through_its_parent() -> None:
    accountant = Accountant(_timeline(), profiler_pid=1)
    worker = (100, 5)
    accountant.sample(11.0, {worker: (0.0, 0.0, 1, None, "other")})
    # An ssh seen at one sample with 0.3 s ...
    accountant.sample(12.0, {worker: (0.0, 0.0, 1, None, "other"), (400, 30): (0.3, 0.0, 100, "tests:gw0", "other")})
    # ... has ended by the next, with 0.5 s in all; a kubectl started and ended between the two
    # samples with 0.7 s: the worker has waited for both (children time +1.2 s).
    accountant.sample(13.0, {worker: (0.0, 1.2, 1, None, "other")})
    report = accountant.report()
    assert report["test_modules_cpu_seconds"]["tests/lab/test_a.py"] == pytest.approx(1.2)
    # Both children's time reached the profile through the worker: it counts under the worker's
    # command (unknown here: made-up snapshots name none).
    assert report["cpu_seconds_by_command"] == {"?": pytest.approx(1.2)}


def test_only_time_spent_during_the_profile_counts_and_the_rest_is_unattributed_by_group() -> None:
    accountant = Accountant(ModuleTimeline(), profiler_pid=9)
    before = {
        (2, 1): (100.0, 50.0, 1, None, "control_plane"),
        (9, 2): (1.0, 0.0, 1, None, "other"),
    }
    accountant.sample(0.0, before)
    after = {
        (2, 1): (103.0, 50.0, 1, None, "control_plane"),
        (9, 2): (1.5, 0.0, 1, None, "other"),
        (3, 7): (2.0, 0.0, 1, "setup:pulumi cli", "other"),
        (4, 8): (4.0, 0.0, 3, None, "other"),
        (5, 9): (0.5, 0.0, 1, "static checks", "other"),
    }
    accountant.sample(1.0, after)
    report = accountant.report()
    assert report["other_accounts_cpu_seconds_by_group"]["unattributed"] == {"control_plane": 3.0}
    # A child without the account in its own environment inherits its parent's step.
    assert report["lab_setup_cpu_seconds"] == {"pulumi cli": 6.0}
    assert report["other_accounts_cpu_seconds_by_group"]["static checks"] == {"other": 0.5}
    assert report["profiler_cpu_seconds"] == 0.5


def test_the_events_file_is_read_line_by_line_as_it_grows(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.write_text("10.5\ttests:gw0\t100\ttests/lab/test_a.py\n11.0\ttests:gw1\t2")
    timeline = ModuleTimeline()
    offset = timeline.read_events(events, 0)
    assert timeline.module_at("tests:gw0", 10.6) == "tests/lab/test_a.py"
    assert timeline.module_at("tests:gw0", 10.4) is None
    assert "tests:gw1" not in timeline.changes  # half a line: read when it is whole
    with events.open("a") as out:
        out.write("00\ttests/lab/test_b.py\n")
    timeline.read_events(events, offset)
    assert timeline.module_at("tests:gw1", 12.0) == "tests/lab/test_b.py"
    assert timeline.worker_pids == {100: "tests:gw0", 200: "tests:gw1"}


def test_the_ci_profile_charges_a_real_process_tree_to_the_account_in_its_environment(tmp_path: Path) -> None:
    """The sampler on this machine's real /proc: a step's shell starts a busy Python that
    starts a busy grandchild which ends between samples; all of it is the step's."""
    out, events = tmp_path / "profile.json", tmp_path / "events"
    profiler = subprocess.Popen([sys.executable, "-m", "lab.cpu_profile", "ci", "--out", out, "--events", events])
    time.sleep(1.0)
    grandchild = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', " + repr(BUSY) + "], check=True)\n"
    env = {**os.environ, ACCOUNT_VAR: "setup:busy step"}
    subprocess.run([sys.executable, "-c", grandchild], check=True, env=env)
    profiler.send_signal(signal.SIGTERM)
    assert profiler.wait(timeout=30) == 0
    report = json.loads(out.read_text())
    assert report["lab_setup_cpu_seconds"]["busy step"] >= 1.4, report
    assert report["lab_setup_cpu_seconds"]["busy step"] <= report["machine_busy_cpu_seconds"], report


def test_a_process_older_than_the_profile_that_ends_adds_only_what_it_spent_since() -> None:
    accountant = Accountant(ModuleTimeline(), profiler_pid=9)
    parent, child, orphan = (50, 1), (51, 2), (52, 3)
    # A build step's shell and its compiler ran before the profile: 100 s and 30 s spent already;
    # an orphan of it (re-parented to init) with 20 s.
    accountant.sample(
        0.0,
        {
            (1, 0): (0.0, 0.0, 0, None, "other"),
            parent: (1.0, 0.0, 1, "setup:kubernetes control plane", "other"),
            child: (100.0, 0.0, 50, None, "other"),
            orphan: (20.0, 0.0, 1, None, "other"),
        },
    )
    accountant.sample(
        1.0,
        {
            (1, 0): (0.0, 0.0, 0, None, "other"),
            parent: (1.0, 0.0, 1, None, "other"),
            child: (101.0, 30.0, 50, None, "other"),
            orphan: (21.0, 0.0, 1, None, "other"),
        },
    )
    # Both end: the shell waits for the compiler (131.5 s in all), init for the orphan (21.5 s).
    accountant.sample(2.0, {(1, 0): (0.0, 21.5, 0, None, "other"), parent: (1.0, 131.5, 1, None, "other")})
    report = accountant.report()
    # Only what they spent during the profile: the compiler 1 s, its children 30 s, its last 0.5 s.
    assert report["lab_setup_cpu_seconds"] == {"kubernetes control plane": pytest.approx(31.5)}
    assert report["other_accounts_cpu_seconds_by_group"]["unattributed"] == {"other": pytest.approx(1.5)}


def test_a_grandchild_reaped_after_its_parents_last_sample_is_not_counted_again_above() -> None:
    accountant = Accountant(ModuleTimeline(), profiler_pid=9)
    shell, build, link = (60, 1), (61, 2), (62, 3)
    accountant.sample(0.0, {shell: (0.0, 0.0, 1, "setup:pod runtime", "other")})
    # A go build (1 s) and its linker (5 s so far) are seen ...
    accountant.sample(
        1.0,
        {
            shell: (0.0, 0.0, 1, "setup:pod runtime", "other"),
            build: (1.0, 0.0, 60, None, "other"),
            link: (5.0, 0.0, 61, None, "other"),
        },
    )
    # ... then the linker ends (6 s), the build reaps it and ends too (1.5 s of its own), both
    # between two samples: the shell's children time grows by 7.5 s.
    accountant.sample(2.0, {shell: (0.0, 7.5, 1, "setup:pod runtime", "other")})
    assert accountant.report()["lab_setup_cpu_seconds"] == {"pod runtime": pytest.approx(7.5)}


def test_the_pytest_plugin_marks_each_module_a_worker_starts_and_what_its_tests_start(tmp_path: Path) -> None:
    """A real pytest run with the plugin (no xdist: the one process is "main"): one event per
    module, in order, and a process a test starts carries the account in its environment."""
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text(
            "import subprocess, sys\n"
            "def test_a():\n"
            "    out = subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"HK3S_CPU_ACCOUNT\"])'],\n"
            "                         capture_output=True, text=True, check=True).stdout\n"
            "    assert out.strip() == 'tests:main'\n"
            "def test_b():\n"
            "    pass\n"
        )
    events = tmp_path / "events"
    env = {**os.environ, EVENTS_VAR: str(events), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop(ACCOUNT_VAR, None)
    # The inner pytest runs without xdist: this test's own worker name (when the suite runs under
    # xdist) must not reach it, or it would take itself for that worker.
    for name in [n for n in env if n.startswith("PYTEST_XDIST")] + ["PYTEST_CURRENT_TEST"]:
        env.pop(name, None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "lab.cpu_profile_plugin",
            "test_one.py",
            "test_two.py",
        ],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line.split("\t") for line in events.read_text().splitlines()]
    assert [(account, module) for _at, account, _pid, module in lines] == [
        ("tests:main", "test_one.py"),
        ("tests:main", "test_two.py"),
    ]
