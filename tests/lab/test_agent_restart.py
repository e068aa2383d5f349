"""A joined worker survives its restarts with no `pulumi up`: its agent restarted alone,
and every worker rebooted, each comes back Ready by itself.

Real k3s parses the token its agent is configured with at every start, before it uses
the node's certificate, and never starts with an empty one ("token must not be
empty", retried forever); the lab's stand-in does the same. So this holds only if
the join leaves the agent a token it accepts (the deleted bootstrap token)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"
BACK_READY_SECONDS = 120.0
CLIENT_CERT = "/var/lib/rancher/k3s/agent/client-kubelet.crt"


@dataclass
class Cluster:
    server: Host
    workers: list[Host]

    def node(self, name: str) -> dict:
        return dict(json.loads(self.server.run([K3S, "kubectl", "get", "node", name, "-o", "json"]).stdout))

    def lease_renewed(self, name: str) -> dt.datetime:
        lease = json.loads(
            self.server.run([K3S, "kubectl", "get", "lease", "-n", "kube-node-lease", name, "-o", "json"]).stdout
        )
        return dt.datetime.fromisoformat(lease["spec"]["renewTime"])

    def wait_back_ready(self, worker: Host, old_agent_gone: dt.datetime, started: float) -> float:
        """Seconds since `started` (monotonic) until the worker's Node is Ready with a Lease
        renewed after `old_agent_gone`, so by the new agent; failing with its log if not."""
        while time.monotonic() - started < BACK_READY_SECONDS:
            node = self.node(worker.name)
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
            if ready and self.lease_renewed(worker.name) > old_agent_gone:
                return time.monotonic() - started
            time.sleep(0.5)
        log = worker.run(["journalctl", "-u", "k3s-agent", "-b", "--no-pager", "-o", "cat"], check=False).stdout
        pytest.fail(f"{worker.name} not back Ready within {BACK_READY_SECONDS:.0f}s; agent log:\n{log[-3000:]}")


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("ar-server"))
    workers = [lab.add_host(worker_spec(f"ar-worker-{i}")) for i in (1, 2)]
    lab.wait_ssh_ready([server, *workers])
    stack = LabStack(Path(tmp_path_factory.mktemp("agent-restart")))
    stack.write_config(base_config(lab, server, workers))
    up_or_fail(stack)
    yield Cluster(server, workers)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _main_pid(worker: Host) -> str:
    return worker.run(["systemctl", "show", "k3s-agent", "-p", "MainPID", "--value"]).stdout.strip()


def _agent_started_clean(worker: Host, *window: str) -> None:
    """The agent's log in `window` (journalctl options): it started its node with its
    configured (deleted) token and its certificate, and refused no token."""
    log = worker.run(["journalctl", "-u", "k3s-agent", *window, "--no-pager", "-o", "cat"]).stdout
    assert "Running kubelet stand-in for node" in log, log[-2000:]
    assert "token must not be empty" not in log, log[-2000:]


def test_agent_restarted_alone_comes_back_ready(cluster: Cluster) -> None:
    worker = cluster.workers[0]
    pid_before = _main_pid(worker)
    since = worker.run(["date", "+%Y-%m-%d %H:%M:%S"]).stdout.strip()
    started = time.monotonic()
    worker.run(["systemctl", "restart", "--no-block", "k3s-agent"])
    while (pid := _main_pid(worker)) in (pid_before, "0"):
        assert time.monotonic() - started < 60, f"{worker.name}: k3s-agent did not restart"
        time.sleep(0.1)
    took = cluster.wait_back_ready(worker, _now(), started)
    assert _main_pid(worker) == pid, "the restarted agent exited"
    _agent_started_clean(worker, "--since", since)
    print(f"{worker.name}: agent restarted, Ready again after {took:.1f}s")


def _client_certificate(worker: Host) -> x509.Certificate:
    return x509.load_pem_x509_certificate(worker.run(["cat", CLIENT_CERT]).stdout.encode())


def test_every_worker_rebooted_comes_back_ready(cluster: Cluster) -> None:
    """Each worker rebooted comes back Ready by itself, with a client certificate the server
    signed at that start: k3s's agent asks the supervisor for a new client-kubelet.crt at every
    start (pkg/agent/config/config.go get: getNodeNamedHostFile), authenticated by the one it
    holds, so a reboot renews a certificate that has not yet expired (docs/changing-things.md)."""
    boots = {w.name: w.boots for w in cluster.workers}
    before = {w.name: _client_certificate(w) for w in cluster.workers}
    started = time.monotonic()
    for worker in cluster.workers:
        worker.reboot(wait=False)  # returns once the host's new boot has begun
    old_agents_gone = _now()
    for worker in cluster.workers:
        assert worker.boots > boots[worker.name], f"{worker.name} did not reboot"
    took = {w.name: cluster.wait_back_ready(w, old_agents_gone, started) for w in cluster.workers}
    for worker in cluster.workers:
        _agent_started_clean(worker, "-b")
        renewed, old = _client_certificate(worker), before[worker.name]
        assert renewed.serial_number != old.serial_number, f"{worker.name} kept its client certificate"
        # Signed now, for a year from now (k3s backdates notBefore to its CA's: no clue there).
        assert renewed.not_valid_after_utc > old.not_valid_after_utc, (renewed, old)
    print("rebooted, Ready again after: " + ", ".join(f"{name} {s:.1f}s" for name, s in took.items()))
