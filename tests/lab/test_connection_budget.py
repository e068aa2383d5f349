"""The SSH connections of a run grow with the change it makes, not with the cluster.

Through the real Pulumi engine on booted lab hosts (real OpenSSH logging at VERBOSE,
the k3s stand-in, a real API server), nothing mocked, every host's firewall run by the
program (the default). A server and 3 workers are up; one `up` adds 2 workers. Each
host's own sshd log counts the connections that run opened to it (lab/sshd_log.py), not
the program's counters: at most N + 3K in all (N = 4 nodes in the cluster, K = 2
joining), at most 2 to each joining host. Counts, not times. The tests of this module
share one cluster and run in order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from lab.hosts import Host, Lab
from lab.sshd_log import ConnectionCount, connection_count
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
RECORDED_WORKERS = 3
JOINING = 2


@dataclass
class Cluster:
    lab: Lab
    server: Host
    recorded: list[Host]
    joining: list[Host]
    stack: LabStack

    @property
    def hosts(self) -> list[Host]:
        return [self.server, *self.recorded, *self.joining]

    def config(self, workers: list[Host]) -> dict[str, Any]:
        return base_config(self.lab, self.server, workers, firewall={"managed": True})

    def connections_during(self, run: Callable[[], object]) -> dict[str, ConnectionCount]:
        """Run `run`; the connections each host's sshd saw opened meanwhile."""
        since = time.time()
        run()
        until = time.time()
        # journald's clock filter takes whole seconds: read from the second before, count exactly.
        counts = {host.name: connection_count(host.sshd_log(since - 1), since, until) for host in self.hosts}
        print(
            "\nconnections opened per host: "
            + ", ".join(f"{name} {count.opened} ({count.authenticated} logged in)" for name, count in counts.items())
        )
        return counts


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("cb-server"))
    recorded = [lab.add_host(worker_spec(f"cb-worker-{index}")) for index in range(1, RECORDED_WORKERS + 1)]
    joining = [
        lab.add_host(worker_spec(f"cb-worker-{index}"))
        for index in range(RECORDED_WORKERS + 1, RECORDED_WORKERS + JOINING + 1)
    ]
    cluster = Cluster(lab, server, recorded, joining, LabStack(tmp_path_factory.mktemp("connection-budget")))
    lab.wait_ssh_ready(cluster.hosts)
    for host in cluster.hosts:
        host.set_sshd_options(["LogLevel VERBOSE"])  # "Connection from" for every connection, not only logins
    cluster.stack.write_config(cluster.config(recorded))
    up_or_fail(cluster.stack)
    return cluster


def _ready_nodes(server: Host) -> set[str]:
    nodes = json.loads(server.run(["/usr/local/bin/k3s", "kubectl", "get", "nodes", "-o", "json"]).stdout)["items"]
    return {
        node["metadata"]["name"]
        for node in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    }


def test_adding_two_workers_to_four_nodes_opens_at_most_n_plus_3k_connections(cluster: Cluster) -> None:
    cluster.stack.log.clear()
    cluster.stack.write_config(cluster.config([*cluster.recorded, *cluster.joining]))
    counts = cluster.connections_during(lambda: up_or_fail(cluster.stack))

    assert {host.name for host in cluster.hosts} <= _ready_nodes(cluster.server)
    existing = 1 + len(cluster.recorded)
    budget = existing + 3 * len(cluster.joining)
    total = sum(count.opened for count in counts.values())
    assert total <= budget, f"{total} connections for {len(cluster.joining)} joins into {existing} nodes: {counts}"
    for host in cluster.joining:
        assert counts[host.name].opened <= 2, f"{host.name}: {counts[host.name]}"
    # Every host the run changed was logged in to: the joining ones, and each node whose
    # firewall took the new peers.
    assert all(count.authenticated >= 1 for count in counts.values()), counts


def test_a_run_with_nothing_to_do_opens_no_connection(cluster: Cluster) -> None:
    # Nothing of a run with no change logs in anywhere: whether a worker's host was rebuilt
    # under its name is drift, read by refresh (NodeJoin's read), and no Longhorn here, so no
    # forward to the server's API either.
    for run in (cluster.stack.preview, cluster.stack.up):
        cluster.stack.log.clear()
        counts = cluster.connections_during(run)
        assert all(count.opened == 0 for count in counts.values()), counts
        assert "join stats" not in cluster.stack.text()


def test_the_counts_come_from_the_hosts_not_from_the_program(cluster: Cluster) -> None:
    # A login the program knows nothing of (the lab's own ssh client) is counted on the host.
    counts = cluster.connections_during(lambda: cluster.server.ssh(["true"], check=True))
    assert counts[cluster.server.name].opened == 1 and counts[cluster.server.name].authenticated == 1
