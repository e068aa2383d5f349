"""The lab's smoke test (issue 3): real hosts, the k3s stand-in against a real
control plane, a power-off seen by the real node lifecycle controller, and the
real Pulumi engine running one of this program's dynamic resources."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Host, HostSpec, Lab
from lab.stack_harness import BIN, CACHE, KUBE_BIN_IN_HOST, REPO, skip_without_lab_binaries

pytestmark = pytest.mark.lab
K3S = f"{KUBE_BIN_IN_HOST}/k3s"


def _node(server: Host, name: str) -> dict | None:
    out = server.run([K3S, "kubectl", "get", "node", name, "-o", "json", "--ignore-not-found"], check=True)
    return json.loads(out.stdout) if out.stdout.strip() else None


def _ready(node: dict | None) -> str | None:
    if node is None:
        return None
    # A Node is created before its first status report: no conditions yet means not Ready yet.
    conditions = node.get("status", {}).get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


PROGRAM = """\
import pulumi
from providers.host_probe import HostProbe, HostProbeInputs
from providers.inputs import NodeLogin

config = pulumi.Config()
login = NodeLogin(
    node=config.require("node"),
    address=config.require("address"),
    private_key=pulumi.Output.secret(open(config.require("keyFile")).read()),
)
# Run through the Automation API, with no terminal: a run nobody watches, so the host's key is
# recorded on first contact only because the program opts in.
probe = HostProbe("smoke-probe", HostProbeInputs(login=login, trust_on_first_use=True))
pulumi.export("default_route_interface", probe.default_route_interface)
pulumi.export("os_id", probe.os_id)
"""


def test_smoke(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    bind = [(BIN, KUBE_BIN_IN_HOST)]
    server = lab.add_host(HostSpec("smoke-server", extra_binds=bind))
    routed = lab.add_host(HostSpec("smoke-routed", private_default_route=True, extra_binds=bind))
    public_only = lab.add_host(HostSpec("smoke-public", private_nic=False, extra_binds=bind))
    lab.wait_ssh_ready([server, routed, public_only])
    assert server.public_ip and routed.public_ip

    # Real SSH into each, pinned to the recorded host key.
    for host in (server, routed, public_only):
        assert host.run(["hostname"], via="ssh").stdout.strip() == host.name
    assert "enp7s0" in routed.run(["ip", "-4", "route", "show", "default"]).stdout
    assert "enp7s0" not in public_only.run(["ip", "-o", "link"]).stdout

    # The stand-in server starts the real control plane on the server host.
    server.run(
        ["systemd-run", "--unit", "k3s-smoke", K3S, "server", "--node-name", server.name, "--node-ip", server.public_ip]
    )
    _wait(
        lambda: server.run([K3S, "kubectl", "get", "--raw", "/readyz"], check=False).returncode == 0, 120, "API ready"
    )
    token = server.run([K3S, "token", "create", "--ttl", "10m", "--description", public_only.name]).stdout.strip()
    assert token.startswith("K10") and "::" in token

    # The agent on the host without a private NIC registers and turns Ready.
    public_only.run(
        [
            "systemd-run", "--unit", "k3s-agent-smoke", K3S, "agent",
            "--server", f"https://{server.public_ip}:6443", "--token", token, "--node-name", public_only.name,
        ]
    )  # fmt: skip
    _wait(lambda: _ready(_node(server, public_only.name)) == "True", 120, f"{public_only.name} Ready")

    # Power the host off: the real node lifecycle controller marks the Node NotReady.
    public_only.power_off()
    _wait(lambda: _ready(_node(server, public_only.name)) in ("False", "Unknown"), 120, "NotReady after power-off")

    # The real Pulumi engine runs one of the program's dynamic resources against a lab host.
    program = tmp_path / "program"
    program.mkdir()
    (program / "Pulumi.yaml").write_text(
        f"name: hk3s-smoke\nruntime:\n  name: python\n  options:\n    virtualenv: {REPO / 'venv'}\n"
    )
    (program / "__main__.py").write_text(PROGRAM)
    (tmp_path / "state").mkdir()
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_CONFIG_PASSPHRASE": "smoke",
        "PULUMI_BACKEND_URL": (tmp_path / "state").as_uri(),
        "PULUMI_PYTHON_CMD": str(REPO / "venv" / "bin" / "python"),
        # The provider is pickled by reference: its process imports the project's modules.
        "PYTHONPATH": str(REPO),
    }
    workspace = auto.LocalWorkspace(
        work_dir=str(program),
        pulumi_home=str(tmp_path / "home"),
        env_vars=env,
        pulumi_command=auto.PulumiCommand(root=str(CACHE)),
    )
    stack = auto.Stack.create("smoke", workspace)
    stack.set_all_config(
        {
            "node": auto.ConfigValue(routed.name),
            "address": auto.ConfigValue(routed.public_ip),
            "keyFile": auto.ConfigValue(str(lab.ssh_private_key_path)),
        }
    )
    up = stack.up(color="never")
    assert up.summary.result == "succeeded"
    assert up.outputs["default_route_interface"].value == "enp7s0"
    assert up.outputs["os_id"].value == "debian"
    destroy = stack.destroy(color="never")
    assert destroy.summary.result == "succeeded"
    assert destroy.summary.resource_changes == {"delete": 2}
