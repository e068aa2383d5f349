"""The benchmarks' CPU profile (lab/cpu_profile.py) on this machine's real processes: a busy
child is counted in full and in its group, and the groups follow what each process is."""

from __future__ import annotations

import subprocess
import sys

from lab.cpu_profile import CpuProfile, classify

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
