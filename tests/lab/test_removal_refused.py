"""A worker dropped from the stack while its removal cannot be carried out: refused at
`preview`, and refused by `up` before any firewall changed. Through the real Pulumi
engine on booted lab hosts whose nftables firewalls the program manages; the ports
are probed for real from the other hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab

PROBE = """
import errno, socket, sys
s = socket.socket()
s.settimeout(3)
code = s.connect_ex((sys.argv[1], int(sys.argv[2])))
print("open" if code in (0, errno.ECONNREFUSED) else "closed")
"""


def reachable(source: Host, target: Host, port: int) -> bool:
    return source.run(["python3", "-c", PROBE, target.public_ip or "", str(port)]).stdout.strip() == "open"


def ready(server: Host, name: str) -> bool:
    node = json.loads(server.run(["/usr/local/bin/k3s", "kubectl", "get", "node", name, "-o", "json"]).stdout)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_dropping_a_worker_is_refused_before_any_firewall_changes(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("rr-server"))
    w1, w2 = lab.add_host(worker_spec("rr-worker-1")), lab.add_host(worker_spec("rr-worker-2"))
    lab.wait_ssh_ready([server, w1, w2])
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [w1, w2], firewall={"managed": True}))
    up_or_fail(stack)
    # Peers reach the kubelet and the API through the program's nftables rules.
    assert reachable(w1, w2, 10250) and reachable(server, w2, 10250) and reachable(w2, server, 6443)
    rules_before = {host.name: host.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout for host in (server, w1)}

    stack.write_config(base_config(lab, server, [w1], firewall={"managed": True}))
    with pytest.raises(auto.CommandError) as previewed:
        stack.preview()
    assert "rr-worker-2: removing the worker is not available in this release" in str(previewed.value)
    stack.log.clear()
    with pytest.raises(auto.CommandError) as refused:
        stack.up()
    text = str(refused.value) + stack.text()
    assert "rr-worker-2: removing the worker is not available in this release" in text
    # Nothing of the run started: no firewall was touched, the worker is still a peer everywhere.
    for host in (server, w1):
        assert host.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout == rules_before[host.name]
    assert reachable(w1, w2, 10250) and reachable(server, w2, 10250) and reachable(w2, server, 6443)
    assert ready(server, w2.name)
