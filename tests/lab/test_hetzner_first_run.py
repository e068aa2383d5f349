"""The first run on Hetzner, rehearsed end to end: the shipped `Pulumi.dev.yaml`, the commands
docs/getting-started-hetzner.md shows, Hetzner's own Terraform provider behind the `hcloud`
plugin (lab/build/hcloud_provider.sh), the lab's Hetzner API stand-in (lab/hcloud_standin.py)
whose created servers are lab hosts running real cloud-init (lab/hcloud_servers.py), the real
Pulumi CLI and engine, the real Kubernetes provider, the k3s stand-in and the lab's Longhorn
chart. Then a created worker that went down, fenced through the Hetzner API and given up with
docs/fencing.md's commands, and the documented teardown (docs/teardown.md) of the same stack.

The stack file is the shipped one, with what the user sets (docs/getting-started-hetzner.md):
the token (the first-run block's `HCLOUD_TOKEN`), `hcloud:endpoint` (the stand-in's address) and
the key (the file expects ~/.ssh/id_ed25519: a fresh key there, in the test's own HOME). Beside
them, only what the lab cannot do as Hetzner's cloud does, each named in `LAB_ONLY`: k3s comes
from the lab's stand-in binary (no download from GitHub), pod traffic is vxlan (the lab's kernel
has no WireGuard module; the hosts share a private network, so vxlan is never over public
addresses), Longhorn's chart is the lab's (none can be fetched here) and the Kubernetes API's
forward takes a port of this lab's (labs of a test run side by side).

The tests share one stack and run in order; each states what the one before left.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.hcloud_servers import LabServer, LabServers
from lab.hcloud_standin import HcloudStandin, ServerRequest
from lab.hosts import Lab
from lab.stack_harness import (
    BIN,
    KUBE_BIN_IN_HOST,
    LONGHORN_PACKAGES,
    LONGHORN_STANDIN_CHART,
    CliRun,
    LabStack,
    ensure_longhorn_manager,
    k3s_release,
    run_killable,
    skip_without_hcloud_provider,
    skip_without_kubernetes_provider,
    stop_longhorn_manager,
    wait_until,
)
from lab.stack_processes import processes_under
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from tests.lab.test_longhorn_teardown import docs_commands
from tests.lab.test_stack_preview import first_run_block

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
K3S = "/usr/local/bin/k3s"
STACK = "dev"


def lab_only(lab: Lab) -> dict[str, dict[str, Any]]:
    """What the lab sets beside the shipped file (see the module's docstring), by section."""
    return {
        "cluster": {
            **k3s_release(),
            "pod_network": "vxlan",
            "api_forward_port": 17000 + int(lab.lab_id[2:], 16) % 10000,
        },
        "storage": {"longhorn_chart": str(LONGHORN_STANDIN_CHART)},
    }


@dataclass
class FirstRun:
    lab: Lab
    standin: HcloudStandin
    servers: LabServers
    stack: LabStack
    env: dict[str, str]  # what the shell holds: the lab stack's environment, HOME, the block's exports
    home: Path
    seconds: dict[str, float]

    @property
    def stack_file(self) -> Path:
        return self.stack.project / f"Pulumi.{STACK}.yaml"

    def type(self, line: str, timeout: float = 1200) -> CliRun:
        """One command line as a person types it in the project's directory (`<env>`: dev)."""
        argv = shlex.split(line.replace("<env>", STACK))
        started = time.monotonic()
        run = run_killable(argv, cwd=self.stack.project, env=self.env, timeout=timeout)
        self.seconds[line] = round(time.monotonic() - started, 1)
        return run

    def set_cluster(self, **values: Any) -> None:
        """Set `hk3s:cluster` keys in the stack file, as a person edits it."""
        document = yaml.safe_load(self.stack_file.read_text())
        document["config"]["hk3s:cluster"].update(values)
        self.stack_file.write_text(yaml.safe_dump(document, sort_keys=False))

    def server_host(self) -> LabServer:
        (server,) = [s for s in self.standin.servers.values() if s.name.endswith("-dev-server")]
        return self.servers.booted[server.id]

    def nodes(self) -> dict[str, dict[str, str]]:
        """Each Kubernetes node's conditions, read on the control plane's host."""
        listed = self.server_host().host.run([K3S, "kubectl", "get", "nodes", "-o", "json"]).stdout
        return {
            item["metadata"]["name"]: {c["type"]: c["status"] for c in item["status"]["conditions"]}
            for item in json.loads(listed)["items"]
        }

    def resources(self) -> list[str]:
        deployment = self.stack.stack().export_stack().deployment or {}
        return [r["urn"].rsplit("::", 1)[-1] for r in deployment.get("resources", [])]


def _changes(output: str) -> list[str]:
    """The lines of a preview's or up's output that announce or report a change to a resource:
    a step line (`+`, `-`, `~`, `+-`, ...) or a count of the summary other than `unchanged`."""
    marks = ("+ ", "- ", "~ ", "+-", "-+", "++", "--")
    summary = re.compile(
        r"^\s*[+~-]?\s*\d+ (to create|to update|to delete|to replace|created|updated|deleted|replaced)\b"
    )
    return [
        line
        for line in output.splitlines()
        if (line.strip().startswith(marks) and "pulumi:pulumi:Stack" not in line) or summary.match(line)
    ]


@pytest.fixture(scope="module")
def first_run(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstRun]:
    skip_without_hcloud_provider()
    skip_without_kubernetes_provider()
    tmp = tmp_path_factory.mktemp("hetzner-first-run")
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)

    def started(request: ServerRequest, server: LabServer) -> None:
        # Longhorn's chart starts Longhorn's manager on the cluster; the lab's chart is the
        # objects alone, and its manager stand-in runs beside the control plane's host.
        if request.name.endswith("-dev-server"):
            ensure_longhorn_manager(lab, server.host)

    servers = LabServers(
        lab,
        extra_binds=[(BIN, KUBE_BIN_IN_HOST)],
        extra_packages=LONGHORN_PACKAGES,
        # Each host is named as Kubernetes names the node (the Hetzner name without the
        # `<cluster>-<stack>-` prefix): the Longhorn manager stand-in finds the node's disk there.
        host_name=lambda request: request.name.removeprefix(f"dev-{STACK}-"),
        on_boot=started,
    )
    standin = HcloudStandin(boot=servers).start()
    try:
        stack = LabStack(tmp / "stack", name=STACK)
        shipped = (REPO / "Pulumi.dev.yaml").read_text()
        assert (stack.project / "Pulumi.dev.yaml").read_text() == shipped
        document = yaml.safe_load(shipped)
        for section, values in lab_only(lab).items():
            document["config"].setdefault(f"hk3s:{section}", {}).update(values)
        # The user's one setting in the file: where the Hetzner API is (default Hetzner's).
        document["config"]["hcloud:endpoint"] = standin.url
        (stack.project / "Pulumi.dev.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
        env = {**os.environ, **stack.env, "HOME": str(home), "PULUMI_HOME": str(stack.directory / "pulumi-home")}
        # The first-run block exports the passphrase and the token itself.
        for name in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE", "HCLOUD_TOKEN", "HCLOUD_ENDPOINT"):
            env.pop(name, None)
        yield FirstRun(lab, standin, servers, stack, env, home, {})
    finally:
        stop_longhorn_manager(lab)
        standin.stop()


def test_the_documented_first_run_creates_the_shipped_cluster(first_run: FirstRun) -> None:
    """docs/getting-started-hetzner.md's first-run block typed line by line (its `export` in the
    shell the later lines run in): the preview, then the `up` makes a server, the two workers and
    the batch pool's two as Hetzner servers; each became a lab host through cloud-init and joined
    k3s, all Ready; `node list` and `status --check` answer."""
    run = first_run
    block = first_run_block(REPO / "docs" / "getting-started-hetzner.md")
    export, *lines = block
    assert export.startswith("export "), block
    for assignment in shlex.split(export)[1:]:
        name, _, value = assignment.partition("=")
        run.env[name] = run.standin.token if value == "<your token>" else value
    assert run.env.get("HCLOUD_TOKEN") == run.standin.token, export
    # The Automation API reads the same state with the passphrase the block chose.
    run.stack.env["PULUMI_CONFIG_PASSPHRASE"] = run.env["PULUMI_CONFIG_PASSPHRASE"]
    run.stack.env["HCLOUD_TOKEN"] = run.standin.token
    assert lines[:2] == ["scripts/stack.sh preview", "scripts/hk3s --stack dev up"], lines
    for line in lines:
        typed = run.type(line)
        assert typed.returncode == 0, f"{line}:\n{typed.output[-6000:]}"
        if line == "scripts/stack.sh preview":
            assert run.standin.servers == {}, "the preview created servers"
    names = sorted(s.name for s in run.standin.servers.values())
    assert names == sorted(
        f"dev-dev-{node}" for node in ("dev-server", "dev-worker-1", "dev-worker-2", "batch-1", "batch-2")
    ), names
    assert len(run.servers.booted) == 5
    for server in run.standin.servers.values():
        machine = run.servers.booted[server.id]
        assert machine.is_running, server.name
        assert "status: done" in machine.host.run(["cloud-init", "status"], check=False).stdout, server.name
    nodes = run.nodes()
    assert len(nodes) == 5, sorted(nodes)
    assert all(conditions.get("Ready") == "True" for conditions in nodes.values()), nodes
    print(f"first run: {run.seconds}")


def test_the_next_up_and_a_plain_preview_change_nothing(first_run: FirstRun) -> None:
    """After the first run (the test above): the next `up` and a plain `pulumi preview` announce
    no change and make none at Hetzner."""
    run = first_run
    assert len(run.servers.booted) == 5, "the first run did not finish"
    before = len(run.standin.requests)
    up = run.type("pulumi up --yes --stack <env>")
    assert up.returncode == 0, up.output[-6000:]
    assert _changes(up.output) == [], up.output[-6000:]
    preview = run.type("pulumi preview --stack <env>")
    assert preview.returncode == 0, preview.output[-6000:]
    assert _changes(preview.output) == [], preview.output[-6000:]
    changing = [(m, p) for m, p in run.standin.requests[before:] if m != "GET"]
    assert changing == [], changing
    print(f"unchanged runs: {run.seconds}")


def test_a_created_worker_that_is_down_is_fenced_through_the_api_and_given_up(first_run: FirstRun) -> None:
    """After the unchanged runs (the test above): dev-worker-2, a server the program created, goes
    down (its k3s agent stopped, its host still answering SSH). docs/fencing.md's commands, typed:
    `node fence` finds the Hetzner server the program recorded for it, proves it is the worker's,
    holds its agent down over SSH and powers the server off through the Hetzner API (one poweroff,
    the lab host really off), and records the fence on the Node with the out-of-service taint;
    `node remove --force --yes` then gives it up: its Node is gone, its server deleted at Hetzner,
    and the next plain preview shows no change. The other servers are left alone."""
    run = first_run
    assert len(run.servers.booted) == 5, "the first run did not finish"
    name = "dev-worker-2"
    (server,) = [s for s in run.standin.servers.values() if s.name == f"dev-{STACK}-{name}"]
    worker = run.servers.booted[server.id]
    others = {s.id: s.name for s in run.standin.servers.values() if s.id != server.id}
    worker.host.run(["systemctl", "stop", "k3s-agent"])
    wait_until(f"{name} NotReady", lambda: run.nodes()[name].get("Ready") != "True", timeout=90)
    # A fence is for a worker NotReady for a minute (node_operations/fence.py: MIN_DOWN_SECONDS).
    control = run.server_host().host
    listed = json.loads(control.run([K3S, "kubectl", "get", "node", name, "-o", "json"]).stdout)
    (ready,) = [c for c in listed["status"]["conditions"] if c["type"] == "Ready"]
    since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()
    time.sleep(max(0.0, since + 62 - float(control.run(["date", "+%s"]).stdout)))

    fence = run.type(f"scripts/hk3s --stack <env> node fence {name}")
    assert fence.returncode == 0, fence.output[-6000:]
    assert f"[{name}] fenced (recorded" in fence.output, fence.output[-6000:]
    actions = run.standin.power_actions(server.id)
    assert [(a.command, a.status) for a in actions] == [("stop_server", "success")], actions
    assert f"powered off through the Hetzner API (dev-{STACK}-{name} (id {server.id})" in fence.output, fence.output[
        -6000:
    ]
    assert not worker.is_running, "the fenced server's host still runs"
    node = json.loads(control.run([K3S, "kubectl", "get", "node", name, "-o", "json"]).stdout)
    assert FENCE_ANNOTATION in node["metadata"]["annotations"], node["metadata"]
    assert OUT_OF_SERVICE_TAINT in [t["key"] for t in node["spec"].get("taints", [])], node["spec"]
    assert all(run.standin.power_actions(i) == [] for i in others), "another server was powered off"
    assert run.standin.token not in fence.output

    removed = run.type(f"scripts/hk3s --stack <env> node remove {name} --force --yes")
    assert removed.returncode == 0, removed.output[-6000:]
    assert f"[{name}] given up (fenced since" in removed.output, removed.output[-6000:]
    assert name not in run.nodes()
    assert sorted(s.name for s in run.standin.servers.values()) == sorted(others.values())
    assert all(run.servers.booted[i].is_running for i in others)
    names = [w["name"] for w in yaml.safe_load(run.stack_file.read_text())["config"]["hk3s:workers"]]
    assert name not in names, names
    preview = run.type("pulumi preview --stack <env>")
    assert preview.returncode == 0, preview.output[-6000:]
    assert _changes(preview.output) == [], preview.output[-6000:]
    print(f"fence and give-up: {run.seconds}")


def test_the_documented_teardown_leaves_nothing(first_run: FirstRun) -> None:
    """`hk3s:cluster.teardown: allowed`, `up`, then docs/teardown.md's destroy: the state is empty,
    the stand-in holds none of the stack's servers, network, firewalls, placement groups or the
    key it uploaded, and no lab host the servers were is left. Before that, the Hetzner token is
    revoked after the `up`: the destroy is refused before anything changes (with the old token in
    the shell, and with the new one exported, which the resources have not recorded yet), and the
    `up` the refusal names lets the documented destroy through."""
    run = first_run
    assert len(run.servers.booted) == 5, "the first run did not finish"
    hosts = [machine.host.name for machine in run.servers.booted.values()]
    run.set_cluster(teardown="allowed")
    up = run.type("pulumi up --yes --stack <env>")
    assert up.returncode == 0, up.output[-6000:]
    commands = docs_commands("teardown.md", "Tearing down")
    destroy = commands[-1]
    assert destroy.startswith("pulumi destroy --run-program --yes"), commands

    def untouched() -> dict[str, Any]:
        return {
            "state": sorted(run.resources()),  # a run of the program writes them in its own order
            "servers": sorted(s.name for s in run.standin.servers.values()),
            "ssh_keys": sorted(k.name for k in run.standin.ssh_keys.values()),
            "hosts": sorted(m.host.name for m in run.servers.booted.values() if m.is_running),
            "k3s": [
                m.host.run(["test", "-x", K3S], check=False).returncode
                for m in run.servers.booted.values()
                if m.is_running
            ],
        }

    before = untouched()
    # The token revoked after that up (Hetzner no longer takes it) and the shell still holding it:
    # the destroy's run of the program cannot read the project, and nothing changes.
    revoked, run.standin.token = run.standin.token, secrets.token_hex(32)
    refused = run.type(destroy)
    assert refused.returncode != 0 and "hcloud:token" in refused.output, refused.output[-6000:]
    assert untouched() == before
    # The new token exported: the program runs, and the guard finds the resources' recorded token
    # refused, before anything changes, saying how to record the new one.
    run.env["HCLOUD_TOKEN"] = run.standin.token
    refused = run.type(destroy)
    assert refused.returncode != 0, refused.output[-6000:]
    assert "does not take the token the stack's resources recorded" in refused.output, refused.output[-6000:]
    assert f"run pulumi up --yes --stack {STACK}" in refused.output, refused.output[-6000:]
    assert revoked not in refused.output and run.standin.token not in refused.output
    assert untouched() == before
    up = run.type(f"pulumi up --yes --stack {STACK}")
    assert up.returncode == 0, up.output[-6000:]
    for line in commands:
        typed = run.type(line)
        assert typed.returncode == 0, f"{line}:\n{typed.output[-6000:]}"
    assert run.resources() == [], run.resources()
    standin = run.standin
    left = {
        "servers": [s.name for s in standin.servers.values()],
        "networks": [n.name for n in standin.networks.values()],
        "firewalls": [f.name for f in standin.firewalls.values()],
        "placement_groups": [g.name for g in standin.placement_groups.values()],
        "ssh_keys": [k.name for k in standin.ssh_keys.values()],
    }
    assert left == {k: [] for k in left}, left
    assert not set(hosts) & set(run.lab.hosts), sorted(set(hosts) & set(run.lab.hosts))
    # Nothing of the runs keeps running: the destroy's forward to the Kubernetes API ends once
    # its engine has (it checks every second).
    wait_until(
        "the stack's processes ended after the destroy",
        lambda: not processes_under(run.stack.directory),
        timeout=15,
        diagnose=lambda: "\n".join(str(p) for p in processes_under(run.stack.directory)),
    )
    print(f"teardown: {run.seconds}")
