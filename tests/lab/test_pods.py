"""Pods really run in the lab: pod-capable hosts (``HostSpec(pods=True)``, see lab.pod_hosts).

A pod-capable host gets its own writable cgroup subtree, plain directories for containerd
and the kubelet, and the runtime ``lab/build/pod_runtime.sh`` builds (containerd, runc, CNI
plugins, crictl; the kubelet from ``lab/build/kube.sh``) where k3s keeps its bundled
binaries. These tests check the host itself: containerd and runc run a container from an
image imported without a registry, inside the host's own cgroups, and a teardown leaves no
cgroup, mount or process behind.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lab import pod_hosts
from lab.hosts import DEFAULT_CACHE_DIR, Host, HostSpec, Lab

pytestmark = pytest.mark.lab

RUNTIME = pod_hosts.RUNTIME_BIN_IN_HOST
# A bare containerd (no CRI, no kubelet) to prove the host runs containers at all.
CONTAINERD_CONFIG = f"""version = 3
root = "{pod_hosts.CONTAINERD_DIR_IN_HOST}"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{RUNTIME}/runc"
"""


def _runtime_built() -> str | None:
    """Why pod-capable hosts cannot be made here (the runtime is not built), or None."""
    bins = [DEFAULT_CACHE_DIR / "bin" / b for b in pod_hosts.RUNTIME_BINARIES]
    missing = [str(b) for b in bins if not b.exists()]
    if missing:
        return f"pod runtime not built: {', '.join(missing)} missing (run lab/setup.sh)"
    try:
        pod_hosts.image_archives(DEFAULT_CACHE_DIR)
    except pod_hosts.PodHostError as err:
        return str(err)
    return None


@pytest.fixture(scope="module")
def pod_host(lab: Lab) -> Host:
    reason = _runtime_built()
    if reason:
        pytest.skip(reason)
    host = lab.add_host(HostSpec("pods-one", pods=True))
    lab.wait_ssh_ready([host], timeout=120)
    return host


def _start_containerd(host: Host) -> None:
    host.run(["mkdir", "-p", "/etc/hk3s-lab-test"])
    (host.root / "etc/hk3s-lab-test/containerd.toml").write_text(CONTAINERD_CONFIG)
    host.run(
        [
            "systemd-run", "--unit=test-containerd", "--property=Delegate=yes", "--property=KillMode=process",
            f"--setenv=PATH={RUNTIME}:/usr/sbin:/usr/bin:/sbin:/bin",
            f"{RUNTIME}/containerd", "--config", "/etc/hk3s-lab-test/containerd.toml",
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while host.run([f"{RUNTIME}/ctr", "version"], check=False).returncode != 0:
        assert time.monotonic() < deadline, host.run(["journalctl", "-u", "test-containerd", "--no-pager"]).stdout
        time.sleep(0.3)


def test_pod_host_has_its_own_writable_cgroups(pod_host: Host) -> None:
    # The container's cgroup root is the host's own subtree (init.scope at the top), and
    # the host can create cgroups that land under its subtree on the machine.
    cgroup = pod_host.run(["cat", "/proc/1/cgroup"], via="ssh").stdout
    assert "memory:/init.scope" in cgroup, cgroup
    pod_host.run(["mkdir", "/sys/fs/cgroup/memory/hk3s-probe"])
    on_machine = Path(pod_host.cgroup_dirs["memory"]) / "hk3s-probe"
    assert on_machine.is_dir()
    pod_host.run(["rmdir", "/sys/fs/cgroup/memory/hk3s-probe"])
    assert not on_machine.exists()
    # The kubelet's kernel values, and a plain (non-overlay) containerd directory.
    assert pod_host.run(["cat", "/proc/sys/vm/overcommit_memory"]).stdout.strip() == "1"
    fstype = pod_host.run(["findmnt", "-n", "-o", "FSTYPE", pod_hosts.CONTAINERD_DIR_IN_HOST]).stdout.strip()
    assert fstype not in ("overlay", ""), fstype


def test_ctr_runs_a_container_from_an_imported_image(pod_host: Host) -> None:
    _start_containerd(pod_host)
    for archive in pod_hosts.image_archives(DEFAULT_CACHE_DIR):
        pod_host.run(["mkdir", "-p", "/root/images"])
        (pod_host.root / "root/images" / archive.name).write_bytes(archive.read_bytes())
        pod_host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "images", "import", "--local", f"/root/images/{archive.name}"])
    images = pod_host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "images", "ls", "-q"]).stdout
    busybox = next(line for line in images.splitlines() if "busybox" in line)
    out = pod_host.run(
        [f"{RUNTIME}/ctr", "-n", "k8s.io", "run", "--rm", busybox, "probe", "sh", "-c", "echo hello from $(hostname); cat /proc/self/cgroup"],
        timeout=60,
    ).stdout  # fmt: skip
    assert "hello from" in out, out
    # runc put the container in a cgroup of the host's subtree (containerd's /<namespace>/<id>).
    assert "memory:/k8s.io/probe" in out, out
    # A long-running container keeps running while containerd is stopped (KillMode=process):
    # the shim holds it, as on a k3s node whose agent is stopped.
    pod_host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "run", "-d", busybox, "sleeper", "sleep", "3600"], timeout=60)
    pod_host.run(["systemctl", "stop", "test-containerd"])
    assert pod_host.run(["pgrep", "-f", "sleep 3600"], check=False).returncode == 0
    assert (Path(pod_host.cgroup_dirs["memory"]) / "k8s.io" / "sleeper").is_dir()


def test_teardown_removes_pod_hosts_cgroups(lab: Lab, fresh_lab: Lab) -> None:
    reason = _runtime_built()
    if reason:
        pytest.skip(reason)
    host = fresh_lab.add_host(HostSpec("pods-td", pods=True))
    fresh_lab.wait_ssh_ready([host], timeout=120)
    _start_containerd(host)
    host.run(["mkdir", "-p", "/sys/fs/cgroup/pids/deep/deeper"])
    dirs = dict(host.cgroup_dirs)
    assert all(Path(d).is_dir() for d in dirs.values())
    assert fresh_lab.leftovers().cgroups
    fresh_lab.teardown()
    assert not [d for d in dirs.values() if Path(d).exists()]
    assert fresh_lab.leftovers().empty()
