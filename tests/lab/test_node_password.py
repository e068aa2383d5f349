"""A host rebuilt under a worker's name, through the real engine: k3s keeps a hash of
each node's /etc/rancher/node/password and refuses another host under that name
("Node password rejected"). With no config change, a refresh notices the rebuilt host
(NodeJoin's read asks the host) and the next `up` joins it again: while the old Node exists
the join stops naming the conflict; once the Node is gone the rebuilt host rejoins. Then its
Node is deleted once more while the host keeps its client certificate: k3s's supervisor refuses
a node certificate whose Node is gone (401), the agent's spent token authenticates nothing, and
only the next up's fresh token brings it back."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"
ORPHAN_AGE = 15


def test_rebuilt_host_is_refused_while_its_node_lives_and_rejoins_once_it_is_gone(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("np-server"))
    worker = lab.add_host(worker_spec("np-worker"))
    lab.wait_ssh_ready([server, worker])
    # k3s deletes a node-password Secret whose Node is gone once it is older than 10 minutes
    # (pkg/nodepassword/controller.go, MinOrphanSecretAge); the stand-in's setting shortens that
    # to seconds here, so the paths below hold with that sweep running as on a real server.
    drop_in = server.root / "etc/systemd/system/k3s.service.d/lab-orphan-age.conf"
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text(f"[Service]\nEnvironment=HK3S_LAB_NODE_PASSWORD_ORPHAN_AGE={ORPHAN_AGE}s\n")
    stack = LabStack(tmp_path)

    stack.write_config(base_config(lab, server, [worker]))
    up_or_fail(stack)
    assert server.run([K3S, "kubectl", "get", "secret", "-n", "kube-system", "np-worker.node-password.k3s"])

    # The host is rebuilt: a new OS (new machine-id), no k3s, no node password. The config
    # stays as it is: only the host can tell that its join is gone, and refresh asks it.
    worker.run(["systemctl", "disable", "--now", "k3s-agent"])
    worker.run(["rm", "-rf", "/var/lib/rancher", "/etc/rancher", "/var/lib/hk3s", "/usr/local/bin/k3s"])
    worker.run(["rm", "-f", "/etc/systemd/system/k3s-agent.service"])
    worker.run(["systemctl", "daemon-reload"])
    new_machine_id = secrets.token_hex(16)
    worker.run(["sh", "-c", 'printf "%s\\n" "$1" > /etc/machine-id', "-", new_machine_id])
    stack.log.clear()
    stack.api().refresh(on_output=stack.log.append)
    refreshed = stack.text()
    assert "is another machine than the one joined as np-worker" in refreshed and "the next up joins it again" in (
        refreshed
    ), refreshed[-4000:]
    stack.log.clear()
    with pytest.raises(auto.CommandError):
        stack.up()
    text = stack.text()
    assert "[np-worker] the host at" in text and "is another machine than the one joined as np-worker" in text, text[
        -4000:
    ]
    assert "np-worker: join stopped at node-password" in text, text[-4000:]
    assert f"this host has {new_machine_id}" in text and "kubectl delete node np-worker" in text, text[-4000:]
    # Refused before the host changed: nothing of k3s on it yet.
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0

    # The old Node deleted (its host is gone): the rebuilt host joins under the name.
    server.run([K3S, "kubectl", "delete", "node", "np-worker"])
    stack.log.clear()
    assert up_or_fail(stack).summary.result == "succeeded"
    node = json.loads(server.run([K3S, "kubectl", "get", "node", "np-worker", "-o", "json"]).stdout)
    assert node["status"]["nodeInfo"]["machineID"] == new_machine_id
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    # Its Node deleted again, the host keeping its valid client certificate and the spent token
    # of the join. k3s's supervisor authenticates a node certificate only while its Node exists
    # (pkg/nodepassword/validate.go verifyNode: 401), the agent retries with its token alone
    # (pkg/agent/config/config.go getNodeNamedCrt), deleted after the join: the agent stays out
    # and registers nothing. The wait first: kube-apiserver caches an accepted token for 10 s. The
    # journal is read merged (-m): the rebuild above changed the machine-id its files are named by.
    time.sleep(15)
    server.run([K3S, "kubectl", "delete", "node", "np-worker"])
    worker.run(["systemctl", "restart", "--no-block", "k3s-agent"])
    refused = "/v1-k3s/serving-kubelet.crt: 401 Unauthorized"
    deadline = time.monotonic() + 90
    while refused not in (
        log := worker.run(["journalctl", "-m", "-u", "k3s-agent", "--no-pager", "-o", "cat", "-n", "40"]).stdout
    ):
        node_now = server.run([K3S, "kubectl", "get", "node", "np-worker", "--ignore-not-found", "-o", "name"]).stdout
        assert time.monotonic() < deadline, (
            f"the agent was never refused its deleted Node's certificate (Node now: {node_now.strip() or 'none'}):\n"
            + worker.run(["journalctl", "-m", "-u", "k3s-agent", "--no-pager", "-o", "cat", "-n", "40"]).stdout
        )
        time.sleep(2)
    assert "Node authorization rejected, retrying without client certificate authentication" in log, log
    time.sleep(10)
    gone = server.run([K3S, "kubectl", "get", "node", "np-worker", "--ignore-not-found", "-o", "name"]).stdout
    assert gone.strip() == "", f"a certificate whose Node was deleted registered it again: {gone}"

    # The refresh finds the Node gone; the next up joins the host with a fresh token: it is back.
    stack.log.clear()
    stack.api().refresh(on_output=stack.log.append)
    stack.log.clear()
    assert up_or_fail(stack).summary.result == "succeeded"
    node = json.loads(server.run([K3S, "kubectl", "get", "node", "np-worker", "-o", "json"]).stdout)
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]), node["status"]
    tokens = json.loads(server.run([K3S, "kubectl", "get", "secrets", "-n", "kube-system", "-o", "json"]).stdout)
    assert [t for t in tokens["items"] if t.get("type") == "bootstrap.kubernetes.io/token"] == []
    # The sweep ran all along (its setting reached the server) and kept the live Node's record.
    server_env = server.run(["systemctl", "show", "k3s", "-p", "Environment", "--value"]).stdout
    assert f"HK3S_LAB_NODE_PASSWORD_ORPHAN_AGE={ORPHAN_AGE}s" in server_env, server_env
    assert server.run([K3S, "kubectl", "get", "secret", "-n", "kube-system", "np-worker.node-password.k3s"])
