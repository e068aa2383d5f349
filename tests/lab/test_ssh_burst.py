"""Many workers joining in one `up` while every host's sshd sheds SSH load.

Through the real Pulumi engine on booted lab hosts (real OpenSSH, the k3s
stand-in, a real API server), nothing mocked. Every host's sshd drops every
unauthenticated connection beyond 2 (`MaxStartups 2:100:2`), so the pressure
does not depend on how fast this machine is, and every packet a host receives
is delayed 50 ms.
"""

from __future__ import annotations

import json
import time

import pytest

from lab.hosts import Lab
from lab.sshd_log import handshake_load
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
JOINING = 8


def test_eight_workers_join_in_one_up_while_every_sshd_sheds_load(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("sb-server"))
    first = lab.add_host(worker_spec("sb-worker-0"))
    joining = [lab.add_host(worker_spec(f"sb-worker-{index}")) for index in range(1, JOINING + 1)]
    hosts = [server, first, *joining]
    lab.wait_ssh_ready(hosts)
    stack = LabStack(tmp_path_factory.mktemp("ssh-burst"))
    stack.write_config(base_config(lab, server, [first]))
    up_or_fail(stack)

    for host in hosts:
        host.set_sshd_options(["MaxStartups 2:100:2", "LogLevel VERBOSE"])
        host.netem(delay_ms=50)
    since = time.time() - 1
    stack.log.clear()
    stack.write_config(base_config(lab, server, [first, *joining]))
    up_or_fail(stack)

    nodes = json.loads(server.run(["/usr/local/bin/k3s", "kubectl", "get", "nodes", "-o", "json"]).stdout)["items"]
    ready = {
        node["metadata"]["name"]
        for node in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    }
    assert {host.name for host in joining} <= ready
    assert len(nodes) == len(hosts)  # one Node per host, none twice
    # Each new worker was joined once: one "joined and released" per node (the engine
    # repeats diagnostics in its summary, so count distinct nodes, and each at least once).
    released = {host.name: stack.text().count(f"[{host.name}] joined and released") for host in joining}
    assert all(count >= 1 for count in released.values()), released
    # The recorded worker was checked once for the run, not once per join.
    assert stack.text().count("checking SSH access to 1 recorded node(s) once for this run") >= 1
    loads = {host.name: handshake_load(host.sshd_log(since)) for host in hosts}
    print(
        f"\nsshd dropped {sum(load.dropped for load in loads.values())} connections past MaxStartups "
        f"during the joins; per host: "
        + ", ".join(f"{name} {load.dropped} dropped/{load.accepted} accepted" for name, load in loads.items())
    )
    # Every host was logged in to during the joins (the joining ones, the server, and the
    # recorded worker by the run's one access check).
    assert all(load.authenticated >= 1 for load in loads.values()), loads
