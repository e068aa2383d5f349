"""Rotating the login key (hk3s:ssh.private_key_file) through the real Pulumi engine, on booted
lab hosts (a server and two workers, existing hosts whose authorized_keys the lab wrote, not the
program), with real SSH and real authorized_keys files. Nothing is mocked. The tests of this module
share one cluster and run in order."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.stack_harness import (
    LabStack,
    base_config,
    run_cli,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"


@dataclass
class Cluster:
    lab: Lab
    server: Host
    w1: Host
    w2: Host
    stack: LabStack
    keys: Path

    @property
    def hosts(self) -> list[Host]:
        return [self.server, self.w1, self.w2]

    def key(self, name: str) -> Path:
        """A new ed25519 key pair in the test's key directory (the lab's own key is `lab`)."""
        path = self.keys / name
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
        return path

    def config(self, key: Path) -> dict[str, Any]:
        config = base_config(self.lab, self.server, [self.w1, self.w2])
        config["ssh"] = {**config["ssh"], "private_key_file": str(key)}
        return config

    def up(self) -> auto.UpResult:
        return up_or_fail(self.stack)


def logs_in(host: Host, key: Path) -> bool:
    """A real `ssh` login to the host with `key` only (host key checked)."""
    argv = host.ssh_argv("true")
    argv[argv.index("-i") + 1] = str(key)
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0


def cluster_snapshot(cluster: Cluster) -> dict[str, str]:
    """What a key rotation must not touch: k3s's start times, its config, the nodes' identities."""
    snapshot = {}
    for host in cluster.hosts:
        snapshot[host.name] = host.run(
            [
                "sh",
                "-c",
                "sha256sum /etc/rancher/k3s/config.yaml; systemctl show k3s k3s-agent -p ActiveEnterTimestamp",
            ]
        ).stdout
    nodes = cluster.server.run(
        [K3S, "kubectl", "get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.uid} {.metadata.name}{'\\n'}{end}"]
    ).stdout
    snapshot["nodes"] = nodes
    return snapshot


def changes(summary: Any) -> dict[str, int]:
    return {str(getattr(op, "value", op)): count for op, count in (summary or {}).items()}


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("rk-server"))
    w1, w2 = lab.add_host(worker_spec("rk-worker-1")), lab.add_host(worker_spec("rk-worker-2"))
    lab.wait_ssh_ready([server, w1, w2])
    keys = tmp_path_factory.mktemp("rotation-keys")
    # The lab's key, copied: what the hosts' authorized_keys hold when the stack starts.
    shutil.copy2(lab.ssh_private_key_path, keys / "lab")
    shutil.copy2(lab.ssh_private_key_path.with_suffix(".pub"), keys / "lab.pub")
    yield Cluster(lab, server, w1, w2, LabStack(tmp_path_factory.mktemp("rotation-stack")), keys)


def test_rotation_replaces_the_key_on_every_host_and_touches_nothing_else(cluster: Cluster) -> None:
    cluster.stack.write_config(cluster.config(cluster.keys / "lab"))
    cluster.up()
    before = cluster_snapshot(cluster)
    new = cluster.key("rotated-1")
    cluster.stack.write_config(cluster.config(new))

    preview = cluster.stack.preview()
    text = cluster.stack.text()
    for host in cluster.hosts:
        line = next((line for line in text.splitlines() if f"[{host.name}] plan: login key rotates" in line), "")
        # Existing hosts: their authorized_keys is the operator's, and preview says so.
        assert "written by you, not the program (an existing host)" in line, text[-4000:]
    assert set(changes(preview.change_summary)) <= {"same", "update"}, preview.change_summary

    result = cluster.up()
    summary = changes(result.summary.resource_changes)
    assert set(summary) <= {"same", "update"}, summary
    for host in cluster.hosts:
        assert logs_in(host, new), f"{host.name} refuses the new key"
        assert not logs_in(host, cluster.keys / "lab"), f"{host.name} still accepts the previous key"
        keys = host.run(["cat", "/root/.ssh/authorized_keys"]).stdout
        assert keys.count("ssh-ed25519") == 1 and "hk3s login key" in keys
    assert cluster_snapshot(cluster) == before
    # The previous key stays in the state only as a secret, and no private key reaches the output.
    state = "\n".join(p.read_text() for p in (cluster.stack.directory / "state").rglob("*.json"))
    assert "BEGIN OPENSSH PRIVATE KEY" not in state and "BEGIN OPENSSH PRIVATE KEY" not in cluster.stack.text()
    # Nothing left to do.
    assert set(changes(cluster.up().summary.resource_changes)) == {"same"}


def test_a_rotation_killed_after_the_first_host_resumes_and_completes(cluster: Cluster) -> None:
    previous, new = cluster.key("rotated-1"), cluster.key("rotated-2")
    before = cluster_snapshot(cluster)
    cluster.stack.write_config(cluster.config(new))
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{new}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    run = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"], kill_when=f"{fingerprint} logs in")
    assert run.killed, f"the up finished before a host took the new key:\n{run.output[-3000:]}"
    first = next(h for h in cluster.hosts if f"[{h.name}] the new login key {fingerprint} logs in" in run.output)
    # Killed mid-rotation: the first host takes both keys, no host lost the previous one.
    assert logs_in(first, new) and logs_in(first, previous)
    assert all(logs_in(host, previous) for host in cluster.hosts)
    # What Pulumi requires after a crash (docs/recovery.md, "When a run is interrupted"); the refresh reads
    # every resource with the key its state holds, which still logs in.
    assert run_cli(cluster.stack, ["cancel", "--yes"]).returncode == 0
    refresh = run_cli(cluster.stack, ["refresh", "--yes", "--skip-preview", "--clear-pending-creates"])
    assert refresh.returncode == 0, refresh.output[-3000:]
    cluster.up()
    for host in cluster.hosts:
        assert logs_in(host, new), f"{host.name} refuses the new key"
        assert not logs_in(host, previous), f"{host.name} still accepts the previous key"
    assert cluster_snapshot(cluster) == before


def test_a_host_that_cannot_take_the_new_key_stops_the_rotation_naming_it(cluster: Cluster) -> None:
    previous, new = cluster.key("rotated-2"), cluster.key("rotated-3")
    keys_file = "/root/.ssh/authorized_keys"
    # rk-worker-2's authorized_keys read-only (a bind mount over itself).
    cluster.w2.run(["sh", "-c", f"mount --bind {keys_file} {keys_file} && mount -o remount,ro,bind {keys_file}"])
    try:
        cluster.stack.write_config(cluster.config(new))
        with pytest.raises(auto.CommandError) as caught:
            cluster.stack.up()
        text = str(caught.value) + cluster.stack.text()
        assert "rk-worker-2: cannot add the new login key to ~/.ssh/authorized_keys of root@" in text, text[-4000:]
        assert "The previous key still logs in" in text
        # The old key still works everywhere; nothing was removed from any host.
        for host in cluster.hosts:
            assert logs_in(host, previous), f"{host.name} lost the previous key"
        assert not logs_in(cluster.w2, new)
    finally:
        cluster.w2.run(["umount", keys_file])
    # Fixed: the next up completes the rotation.
    cluster.up()
    for host in cluster.hosts:
        assert logs_in(host, new) and not logs_in(host, previous), host.name
