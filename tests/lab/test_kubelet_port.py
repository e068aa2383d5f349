"""10250/tcp blocked between the nodes stops a join at validation, through the real
engine, naming the port.

k3s (and the lab's stand-in) carries the API server's own kubelet traffic through the
agent's tunnel over 6443, so the API's node proxy answers even then; what dials a
kubelet directly (metrics-server, Prometheus) does not get through. The join dials
10250 from the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"


def test_kubelet_port_blocked_fails_validation_naming_it(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("kp-server"))
    worker = lab.add_host(worker_spec("kp-worker"))
    lab.wait_ssh_ready([server, worker])
    # 10250 dropped on the way from the server to the worker, as a cloud firewall between them
    # would (a rule in the worker's own firewall is found earlier, by the firewall check).
    server.run(["nft", "add table inet lab_block"])
    server.run(["nft", "add chain inet lab_block out { type filter hook output priority 0; }"])
    server.run(["nft", f"add rule inet lab_block out ip daddr {worker.public_ip} tcp dport 10250 drop"])
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker]))
    with pytest.raises(auto.CommandError):
        stack.up()
    text = stack.text()
    assert "kp-worker: join stopped at kubelet-reachable" in text, text[-4000:]
    assert f"kp-server cannot connect to the kubelet at {worker.public_ip}:10250" in text, text[-4000:]
    assert "Open 10250/tcp from the other nodes to kp-worker" in text, text[-4000:]
    # The API server still reaches that kubelet, through the agent's tunnel over 6443.
    healthz = server.run([K3S, "kubectl", "get", "--raw", "/api/v1/nodes/kp-worker/proxy/healthz"])
    assert healthz.stdout.strip() == "ok"

    server.run(["nft", "delete table inet lab_block"])
    stack.log.clear()
    assert up_or_fail(stack).summary.result == "succeeded"
