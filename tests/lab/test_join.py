"""Joining workers through the real Pulumi engine, on booted lab hosts, with the
k3s stand-in and a real Kubernetes API server. Nothing is mocked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from tests.lab.lab_stack import LabStack, base_config, lab_binaries_missing, server_spec, worker_spec

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def cluster_hosts(lab: Lab) -> dict[str, Host]:
    missing = lab_binaries_missing()
    if missing:
        pytest.skip(f"lab binaries missing ({', '.join(missing)}); run lab/setup.sh")
    hosts = {
        "server": lab.add_host(server_spec("jn-server")),
        "worker": lab.add_host(worker_spec("jn-worker-1")),
    }
    lab.wait_ssh_ready(list(hosts.values()))
    return hosts


def kubectl_json(server: Host, *args: str) -> dict:
    out = server.run(["/usr/local/bin/k3s", "kubectl", *args, "-o", "json"], check=True)
    return json.loads(out.stdout)


def test_join_one_worker(lab: Lab, cluster_hosts: dict[str, Host], tmp_path: Path) -> None:
    server, worker = cluster_hosts["server"], cluster_hosts["worker"]
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker]))
    try:
        result = stack.up()
    except auto.CommandError as error:
        pytest.fail(f"pulumi up failed:\n{stack.text()[-6000:]}\n{error}")
    assert result.summary.result == "succeeded", stack.text()
    node = kubectl_json(server, "get", "node", worker.name)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert node["metadata"]["labels"]["node-role.kubernetes.io/worker"] == "true"
    assert not [t for t in node["spec"].get("taints", []) if t["key"] == "hk3s.dev/validating"]
    nodes = result.outputs["nodes"].value
    assert [n["state"] for n in nodes if n["name"] == worker.name] == ["ready"]
    # The token is gone from the cluster and from the host; it never reached the state.
    secrets = kubectl_json(server, "get", "secrets", "-n", "kube-system")
    assert not [s for s in secrets["items"] if s.get("type") == "bootstrap.kubernetes.io/token"]
    assert worker.run(["test", "-e", "/etc/rancher/k3s/hk3s-join-token"], check=False).returncode != 0
    state = "\n".join(p.read_text() for p in (tmp_path / "state").rglob("*.json"))
    assert "K10" not in state
