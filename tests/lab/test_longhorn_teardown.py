"""The documented recovery and teardown commands on a stack that installs Longhorn, typed as the
docs show them, through the real Pulumi CLI and engine, the real Kubernetes provider plugin
(lab/build/k8s_provider.sh) and the lab's Longhorn chart (lab/longhorn_standin: it refuses its
uninstall unless `deleting-confirmation-flag` is true, as Longhorn's pre-delete job does), on
booted lab hosts with the k3s stand-in. Nothing is mocked.

The commands are read from the code blocks of the docs pages (docs/recovery.md's section "When
a run is interrupted" and docs/teardown.md's "Tearing down"), `<env>` replaced by the stack's
name, so the test types exactly what the docs show. The Kubernetes provider reaches the API only through the forward the program opens, so a
command that runs no program reaches no API: the documented commands run it. The tests of this
module share one stack (a server, then one worker) and run in order."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    CliRun,
    LabStack,
    base_config,
    run_cli,
    run_killable,
    server_spec,
    skip_without_kubernetes_provider,
    stop_longhorn_manager,
    up_or_fail,
    worker_spec,
)

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
K3S = "/usr/local/bin/k3s"
FLAG = "deleting-confirmation-flag"
RELEASE = "kubernetes:helm.sh/v3:Release"


def docs_commands(page: str, section: str) -> list[str]:
    """The command lines of the ```bash blocks of docs/`page`'s section `section` (its heading's
    text, up to the next heading of its level or above), comments dropped, in order."""
    body: list[str] | None = None
    fenced = False  # a "# ..." line inside a code block is a comment, not a heading
    for line in (REPO / "docs" / page).read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,2} ", line):
            if body is not None:
                break
            if line == f"## {section}":
                body = []
                continue
        if body is not None:
            body.append(line)
    assert body is not None, f"docs/{page} has no section {section!r}"
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", "\n".join(body) + "\n", re.DOTALL):
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if command:
                lines.append(command)
    return lines


@dataclass
class Stack:
    lab: Lab
    server: Host
    worker: Host
    stack: LabStack

    def config(self, workers: list[Host], **cluster: Any) -> dict[str, Any]:
        storage = {"install_longhorn": True, "longhorn_chart": str(LONGHORN_STANDIN_CHART)}
        config = base_config(self.lab, self.server, workers, storage=storage)
        config["cluster"].update(cluster)
        return config

    def type(self, line: str, timeout: float = 600) -> CliRun:
        """One command line as a person types it in the project (`<env>`: this stack)."""
        stack = self.stack
        env = {**os.environ, **stack.env, "PULUMI_HOME": str(stack.directory / "pulumi-home")}
        argv = shlex.split(line.replace("<env>", stack.name))
        return run_killable(argv, cwd=stack.project, env=env, timeout=timeout)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.server.run([K3S, "kubectl", "-n", "longhorn-system", *args], check=check)

    def flag(self) -> str:
        return str(json.loads(self.kubectl("get", "settings.longhorn.io", FLAG, "-o", "json").stdout)["value"])

    def resources(self) -> list[str]:
        deployment = self.stack.stack().export_stack().deployment or {}
        return [r["type"] for r in deployment.get("resources", []) if r["type"] != "pulumi:pulumi:Stack"]

    def depends_on(self, name: str) -> set[str]:
        """The names of the resources the engine recorded `name` as depending on, directly or
        through others, in the stack's state."""
        resources = (self.stack.stack().export_stack().deployment or {}).get("resources", [])
        by_urn = {r["urn"]: r for r in resources}
        found: set[str] = set()
        pending = [urn for urn in by_urn if urn.endswith(f"::{name}")]
        while pending:
            for urn in by_urn[pending.pop()].get("dependencies") or []:
                if urn not in found and urn in by_urn:
                    found.add(urn)
                    pending.append(urn)
        return {urn.rsplit("::", 1)[-1] for urn in found}

    def pending(self) -> list[Any]:
        return list((self.stack.stack().export_stack().deployment or {}).get("pending_operations") or [])


@pytest.fixture(scope="module")
def longhorn_stack(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    skip_without_kubernetes_provider()
    server, worker = lab.add_host(server_spec("lt-server")), lab.add_host(worker_spec("lt-w1"))
    lab.wait_ssh_ready([server, worker])
    stack = Stack(lab, server, worker, LabStack(tmp_path_factory.mktemp("longhorn-teardown")))
    stack.stack.write_config(stack.config([]))
    up_or_fail(stack.stack)
    yield stack


def test_the_readme_recovery_commands_finish_a_killed_run(longhorn_stack: Stack) -> None:
    """A run killed in the middle of a join leaves the stack's lock and a pending create; the
    documented three commands (the refresh runs the program, which opens the forward the Kubernetes
    resources are read through) clear both and the `up` finishes the join."""
    stack = longhorn_stack
    commands = docs_commands("recovery.md", "When a run is interrupted")
    assert commands == [
        "pulumi cancel --yes --stack <env>",
        "pulumi refresh --run-program --clear-pending-creates --yes --stack <env>",
        "scripts/stack.sh up --stack <env> --yes",
    ], commands
    stack.stack.write_config(stack.config([stack.worker]))
    killed = run_cli(stack.stack, ["up", "--yes", "--skip-preview"], kill_when="waiting for the node to register")
    assert killed.killed, killed.output[-3000:]
    assert stack.pending(), "the killed run left no pending operation"
    for line in commands:
        run = stack.type(line)
        assert run.returncode == 0, f"{line}:\n{run.output[-4000:]}"
        if "refresh" in line:
            # Every Kubernetes resource was read through the API (none failed to refresh).
            assert "error" not in run.output.lower(), run.output[-4000:]
    assert stack.pending() == []
    node = stack.server.run([K3S, "kubectl", "get", "node", "lt-w1", "-o", "json"]).stdout
    ready = {c["type"]: c["status"] for c in json.loads(node)["status"]["conditions"]}
    assert ready.get("Ready") == "True", ready
    # Until a teardown is allowed the program keeps Longhorn's own guard on, and Longhorn's
    # uninstall hook is refused (here the stand-in's admission of it, Longhorn's message).
    assert stack.flag() == "false"
    hook = stack.kubectl("create", "configmap", "longhorn-uninstall", check=False)
    assert hook.returncode != 0, hook.stdout
    assert f"cannot uninstall Longhorn because {FLAG} is set to `false`" in hook.stderr, hook.stderr


def test_the_operator_cli_alone_finishes_a_killed_run(longhorn_stack: Stack) -> None:
    """`scripts/hk3s --stack <env> up --yes`, the one command the docs name for all three:
    the killed run's lock removed, its pending operations cleared with the forward open, then
    the `up` (here the one that allows the teardown, and so confirms Longhorn's uninstall)."""
    stack = longhorn_stack
    stack.stack.write_config(stack.config([stack.worker], teardown="allowed"))
    killed = run_cli(stack.stack, ["up", "--yes", "--skip-preview"], kill_when="updating (")
    assert killed.killed, killed.output[-3000:]
    run = stack.type("scripts/hk3s --stack <env> up --yes")
    assert run.returncode == 0, run.output[-4000:]
    assert "removed the lock of an interrupted run" in run.output, run.output[-4000:]
    assert stack.pending() == []
    assert stack.flag() == "true"


def test_the_readme_teardown_with_longhorn(longhorn_stack: Stack) -> None:
    """A plain `pulumi destroy` runs no program, so no forward serves the API: the guard refuses
    it before anything changes, naming the command that works. The documented commands then tear
    the stack down, Longhorn's release (its uninstall confirmed by the flag) included."""
    stack = longhorn_stack
    count = len(stack.resources())
    plain = stack.type("pulumi destroy --yes --stack <env>")
    assert plain.returncode != 0
    assert "pulumi destroy --run-program --stack lab" in plain.output and "Nothing was changed" in plain.output, (
        plain.output[-4000:]
    )
    assert len(stack.resources()) == count and RELEASE in stack.resources()
    # The state the `up`s recorded: Longhorn's release depends on the worker's join (whose delete
    # is the worker's wipe), so the destroy below deletes the release first.
    assert "lt-w1-join" in stack.depends_on("storage-longhorn"), sorted(stack.depends_on("storage-longhorn"))
    commands = docs_commands("teardown.md", "Tearing down")
    assert commands == [
        "pulumi destroy --run-program --preview-only --stack <env>",
        "pulumi destroy --run-program --yes --stack <env>",
    ], commands
    preview = stack.type(commands[0])
    assert preview.returncode == 0, preview.output[-4000:]
    assert "storage-longhorn" in preview.output and f"- {count} to delete" in preview.output, preview.output[-3000:]
    assert len(stack.resources()) == count
    final = stack.type(commands[1])
    assert final.returncode == 0, final.output[-5000:]
    assert stack.resources() == []
    # The engine's own order, as its progress lines show it: Longhorn's release is deleted (its
    # uninstall done) before any host's wipe starts (a worker's join, the server's k3s).
    lines = final.output.splitlines()
    released = [i for i, line in enumerate(lines) if re.search(r"\bstorage-longhorn deleted\b", line)]
    wipes = [i for i, line in enumerate(lines) if re.search(r"\b(lt-w1-join|lt-server-k3s) deleting\b", line)]
    assert released and wipes, final.output[-5000:]
    assert released[0] < wipes[0], f"a wipe began before Longhorn's release was deleted: {lines[wipes[0]]!r}"
    for host in (stack.server, stack.worker):
        left = host.run(["sh", "-c", f"ls -d {K3S} /var/lib/rancher/k3s /etc/rancher/k3s 2>/dev/null"], check=False)
        assert left.stdout.strip() == "", f"{host.name} keeps: {left.stdout}"


def test_the_documented_stack_rm_keeps_the_stack_file(longhorn_stack: Stack) -> None:
    """After the teardown (the test above: `pulumi stack rm` refuses a stack that still has
    resources), the command docs/teardown.md's "Removing the stack" shows removes the stack and
    keeps `Pulumi.<env>.yaml` byte for byte. Pulumi's `stack rm` (pkg/cmd/pulumi/stack/stack_rm.go)
    deletes that file unless `--preserve-config` is given; the plain command is typed on a second,
    empty stack to show the warning the page gives is true."""
    stack = longhorn_stack
    assert stack.resources() == []
    commands = docs_commands("teardown.md", "Removing the stack")
    assert commands == ["pulumi stack rm --preserve-config --yes --stack <env>"], commands
    stack_file = stack.stack.project / f"Pulumi.{stack.stack.name}.yaml"
    kept = stack_file.read_bytes()
    removed = stack.type(commands[0], timeout=120)
    assert removed.returncode == 0, removed.output[-3000:]
    assert stack_file.read_bytes() == kept
    env = {**os.environ, **stack.stack.env, "PULUMI_HOME": str(stack.stack.directory / "pulumi-home")}
    listed = run_killable(["pulumi", "stack", "ls", "--json"], cwd=stack.stack.project, env=env, split_stderr=True)
    assert listed.returncode == 0, listed.output[-3000:] + listed.stderr[-3000:]
    assert stack.stack.name not in {entry["name"] for entry in json.loads(listed.stdout)}
    # Without the flag, the file goes with the stack.
    other = stack.stack.project / "Pulumi.other.yaml"
    other.write_text("config:\n  hk3s:cluster.name: other\n")
    assert stack.type("pulumi stack init other", timeout=120).returncode == 0
    plain = stack.type("pulumi stack rm --yes --stack other", timeout=120)
    assert plain.returncode == 0, plain.output[-3000:]
    assert not other.exists()


def test_a_lost_control_plane_is_torn_down_with_its_loss_declared(longhorn_stack: Stack, tmp_path: Path) -> None:
    """A Longhorn stack whose server is gone for good (here powered off) has no API to delete
    Longhorn's release through: pulumi-kubernetes refuses "can't delete Helm Release with
    unreachable cluster" (provider.go Delete), and the program cannot open its forward. The way
    out docs/teardown.md's "When the control plane is lost" shows: hk3s:cluster.control_plane_lost
    with the teardown allowed, then the documented `up` and destroy. It refuses while the server
    still answers, and without the teardown allowed, changing nothing either time; once the server
    is gone the destroy forgets Longhorn's objects, wipes the worker, names the server as not
    reached, and leaves an empty state.

    A new stack on the hosts the teardown above wiped, so no host is booted for it."""
    base = longhorn_stack
    stop_longhorn_manager(base.lab)  # the torn-down cluster's; the new one starts its own
    stack = Stack(base.lab, base.server, base.worker, LabStack(tmp_path / "lost"))
    stack.stack.write_config(stack.config([stack.worker]))
    up_or_fail(stack.stack)
    count = len(stack.resources())
    assert RELEASE in stack.resources()
    commands = docs_commands("teardown.md", "When the control plane is lost")
    assert commands == [
        "pulumi up --yes --stack <env>",
        "pulumi destroy --run-program --yes --stack <env>",
    ], commands

    # Declared without the teardown allowed: refused by the settings check, before anything runs.
    stack.stack.write_config(stack.config([stack.worker], control_plane_lost=True))
    refused = stack.type("pulumi preview --stack <env>")
    assert refused.returncode != 0
    assert "hk3s:cluster.control_plane_lost" in refused.output and "teardown: allowed" in refused.output, (
        refused.output[-3000:]
    )
    # Declared while the server answers: refused, nothing changed (Longhorn's guard stays on).
    stack.stack.write_config(stack.config([stack.worker], teardown="allowed", control_plane_lost=True))
    answers = stack.type(commands[0])
    assert answers.returncode != 0
    assert "the control plane answers" in answers.output and "Nothing was changed" in answers.output, answers.output[
        -3000:
    ]
    assert stack.flag() == "false" and len(stack.resources()) == count

    # The server is gone for good. The teardown alone cannot go on, and says the way that does.
    stack.server.power_off()
    try:
        stack.stack.write_config(stack.config([stack.worker], teardown="allowed"))
        stuck = stack.type(commands[0], timeout=900)
        assert stuck.returncode != 0
        assert "hk3s:cluster.control_plane_lost: true" in stuck.output, stuck.output[-3000:]
        stack.stack.write_config(stack.config([stack.worker], teardown="allowed", control_plane_lost=True))
        for line in commands:
            run = stack.type(line, timeout=900)
            assert run.returncode == 0, f"{line}:\n{run.output[-5000:]}"
        assert stack.resources() == []
        assert "lt-server" in run.output and "by hand" in run.output, run.output[-4000:]
        left = stack.worker.run(
            ["sh", "-c", f"ls -d {K3S} /var/lib/rancher/k3s /etc/rancher/k3s 2>/dev/null"], check=False
        )
        assert left.stdout.strip() == "", f"lt-w1 keeps: {left.stdout}"
    finally:
        stack.server.power_on(wait=True)
