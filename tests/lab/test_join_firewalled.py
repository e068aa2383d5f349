"""A join through the real engine with the program managing every node's host
firewall: the peer rules go in before the join, and the join still passes every
check (agent to API, API server to kubelet) through them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Lab
from tests.lab.lab_stack import LabStack, base_config, lab_binaries_missing, server_spec, worker_spec

pytestmark = pytest.mark.lab


def test_join_with_managed_host_firewalls(lab: Lab, tmp_path: Path) -> None:
    missing = lab_binaries_missing()
    if missing:
        pytest.skip(f"lab binaries missing ({', '.join(missing)}); run lab/setup.sh")
    server = lab.add_host(server_spec("fw-server"))
    worker = lab.add_host(worker_spec("fw-worker-1"))
    outsider = lab.add_host(worker_spec("fw-outsider"))
    lab.wait_ssh_ready([server, worker, outsider])
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker], firewall={"managed": True}))
    try:
        result = stack.up()
    except auto.CommandError as error:
        pytest.fail(f"pulumi up failed:\n{stack.text()[-6000:]}\n{error}")
    assert result.summary.result == "succeeded"
    node = json.loads(server.run(["/usr/local/bin/k3s", "kubectl", "get", "node", worker.name, "-o", "json"]).stdout)
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    for host in (server, worker):
        assert "table inet hk3s_node" in host.run(["nft", "list", "tables"]).stdout
    # The kubelet answers the server, not a host outside the cluster.
    probe = [
        "python3",
        "-c",
        "import socket,sys; s=socket.socket(); s.settimeout(3); sys.exit(s.connect_ex((sys.argv[1], 10250)))",
    ]
    assert server.run([*probe, worker.public_ip or ""], check=False).returncode == 0
    assert outsider.run([*probe, worker.public_ip or ""], check=False).returncode != 0


def test_private_mode_firewalls_admit_the_peers_private_addresses_only(lab: Lab, tmp_path: Path) -> None:
    missing = lab_binaries_missing()
    if missing:
        pytest.skip(f"lab binaries missing ({', '.join(missing)}); run lab/setup.sh")
    server = lab.add_host(server_spec("fwp-server"))
    worker = lab.add_host(worker_spec("fwp-worker"))
    outsider = lab.add_host(worker_spec("fwp-outsider"))  # on the private network, not in the cluster
    lab.wait_ssh_ready([server, worker, outsider])
    assert server.private_ip and worker.private_ip and worker.public_ip
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker], firewall={"managed": True}, network={"mode": "auto"}))
    try:
        result = stack.up()
    except auto.CommandError as error:
        pytest.fail(f"pulumi up failed:\n{stack.text()[-6000:]}\n{error}")
    nodes = {node["name"]: node for node in result.outputs["nodes"].value}
    assert nodes["fwp-worker"]["network_mode"] == "private" and nodes["fwp-worker"]["state"] == "ready"
    probe = [
        "python3",
        "-c",
        "import socket,sys; s=socket.socket(); s.settimeout(3); sys.exit(s.connect_ex((sys.argv[1], 10250)))",
    ]
    # The kubelet answers the server over the private network only: its public address is
    # not a peer in private mode, and neither is a private host outside the cluster.
    assert server.run([*probe, worker.private_ip], check=False).returncode == 0
    assert server.run([*probe, worker.public_ip], check=False).returncode != 0
    assert outsider.run([*probe, worker.private_ip], check=False).returncode != 0
    # The API admits the worker's private address.
    api = [*probe[:2], probe[2].replace("10250", "6443"), server.private_ip]
    assert worker.run(api, check=False).returncode == 0
