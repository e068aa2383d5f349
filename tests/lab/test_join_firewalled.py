"""A join through the real engine with the program managing every node's host
firewall: the peer rules go in before the join, and the join still passes every
check (agent to API, API server to kubelet) through them."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_PACKAGES,
    LabStack,
    base_config,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)
from operator_api.deployment import Deployment
from remote_access.api_forward import forward_port, forwarded_kubeconfig, open_api_forward

pytestmark = pytest.mark.lab


def test_join_with_managed_host_firewalls(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("fw-server"))
    worker = lab.add_host(worker_spec("fw-worker-1"))
    outsider = lab.add_host(worker_spec("fw-outsider"))
    lab.wait_ssh_ready([server, worker, outsider])
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker], firewall={"managed": True}))
    result = up_or_fail(stack)
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
    _api_through_the_forward(lab, stack, server)


def _api_through_the_forward(lab: Lab, stack: LabStack, server: Host) -> None:
    """With hk3s:firewall.operator_access empty, 6443 is closed to the operator's machine (this
    one), yet the API answers through the forward of the server's SSH session that the Kubernetes
    provider uses, verified with the stack's own kubeconfig (its CA, its client certificate). The
    forward ends with the process it was told to outlive."""
    with socket.socket() as direct:
        direct.settimeout(3)
        assert direct.connect_ex((server.public_ip or "", 6443)) != 0, "6443 answers the operator's machine"
    targets = Deployment.export(stack.stack()).host_targets(lab.ssh_private_key_path.read_text(), "root")
    [target] = [t for t in targets if t.node == server.name]
    kubeconfig = stack.api().kubeconfig()
    assert kubeconfig is not None
    outlived = subprocess.Popen(["sleep", "300"])
    port = forward_port("hk3s", f"fw-{outlived.pid}")
    forward = open_api_forward(target, port, outlive_pid=outlived.pid)
    try:
        config = yaml.safe_load(forwarded_kubeconfig(kubeconfig, forward.port))
        assert config["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{port}"
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        with tempfile.TemporaryDirectory() as folder:
            files = {}
            for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
                files[key] = Path(folder) / key
                files[key].write_bytes(base64.b64decode(cluster.get(key) or user[key]))
            context = ssl.create_default_context(cafile=str(files["certificate-authority-data"]))
            context.load_cert_chain(str(files["client-certificate-data"]), str(files["client-key-data"]))
            url = f"https://127.0.0.1:{port}/readyz"
            with urllib.request.urlopen(url, context=context, timeout=10) as answer:
                assert answer.read() == b"ok"
        # A second open in the same run finds the forward serving and keeps it.
        assert open_api_forward(target, port, outlive_pid=outlived.pid).started is False
    finally:
        outlived.kill()
        outlived.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as local:
            if local.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the forward on {port} outlived the process it served")


def test_private_mode_firewalls_admit_the_peers_private_addresses_only(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("fwp-server"))
    worker = lab.add_host(worker_spec("fwp-worker"))
    outsider = lab.add_host(worker_spec("fwp-outsider"))  # on the private network, not in the cluster
    lab.wait_ssh_ready([server, worker, outsider])
    assert server.private_ip and worker.private_ip and worker.public_ip
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker], firewall={"managed": True}, network={"mode": "auto"}))
    result = up_or_fail(stack)
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


PROBE = """
import errno, socket, sys
for port in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(2)
    code = s.connect_ex((sys.argv[1], int(port)))
    # Connected or refused by the host itself: the firewall let it through.
    print(port, "open" if code in (0, errno.ECONNREFUSED) else "closed")
"""
TCP_PORTS = ("22", "6443", "8888", "9100", "10250")


def _probe(source: Host | None, address: str) -> dict[str, str]:
    """What each TCP port of `address` looks like from `source` (None: the outside bridge,
    i.e. this machine's root namespace)."""
    if source is None:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, address, *TCP_PORTS], capture_output=True, text=True, check=True
        ).stdout
    else:
        out = source.run(["python3", "-c", PROBE, address, *TCP_PORTS], timeout=60).stdout
    return dict(line.split() for line in out.splitlines())


def test_after_joins_ufw_firewalld_and_nftables_nodes_open_exactly_the_planned_ports(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("fwj-server"))
    ufw = lab.add_host(worker_spec("fwj-ufw", extra_packages=(*LONGHORN_PACKAGES, "ufw")))
    firewalld = lab.add_host(worker_spec("fwj-fwd", extra_packages=(*LONGHORN_PACKAGES, "firewalld", "libpam-systemd")))
    nft = lab.add_host(worker_spec("fwj-nft"))
    outsider = lab.add_host(worker_spec("fwj-outsider"))
    lab.wait_ssh_ready([server, ufw, firewalld, nft, outsider], timeout=180)
    firewalld.run("for i in $(seq 100); do firewall-cmd --state && exit 0; sleep 0.2; done; exit 1", timeout=60)
    workers = [ufw, firewalld, nft]
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, workers, firewall={"managed": True}))
    up_or_fail(stack)
    assert "Status: active" in ufw.run(["ufw", "status"]).stdout
    assert "hk3s" in firewalld.run(["firewall-cmd", "--get-active-zones"]).stdout
    assert "table inet hk3s_node" in nft.run(["nft", "list", "tables"]).stdout

    def expect(node: Host, source: Host | None) -> dict[str, str]:
        peer = source is not None and source is not outsider
        is_server = node is server
        return {
            "22": "open",
            "6443": "open" if is_server and peer else "closed",
            "8888": "closed",
            "9100": "open" if not is_server and source is server else "closed",
            "10250": "open" if peer else "closed",
        }

    seen, wanted = {}, {}
    for node in [server, *workers]:
        for source in [server, nft if node is not nft else ufw, outsider, None]:
            if source is node:
                continue
            key = f"{node.name} from {source.name if source else 'outside'}"
            seen[key] = _probe(source, node.public_ip or "")
            wanted[key] = expect(node, source)
    assert seen == wanted
