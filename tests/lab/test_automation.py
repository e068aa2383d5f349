"""The operator API and CLI through the real Pulumi CLI on booted lab hosts: workers added
with the API and with `scripts/hk3s`, `node list --json` against `nodes()`, a run killed
with SIGKILL and resumed by one API call, two callers on one stack, bad input, a refused
removal. Nothing is mocked. The tests share one cluster and run in order.

With HK3S_CLI_TRANSCRIPT=<file>, the CLI's output is written there (the README quotes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pulumi.automation import events as auto_events

from lab.hosts import Host, Lab
from lab.kms_server import running_kms_server
from lab.stack_harness import (
    CACHE,
    CliRun,
    LabStack,
    base_config,
    run_killable,
    server_spec,
    skip_without_lab_binaries,
    worker_spec,
)
from operator_api import (
    ClusterStack,
    DuplicateWorkerError,
    RefusedError,
    RunResult,
    SettingsRejectedError,
    StackBusyError,
    UnknownWorkerError,
)
from operator_api.locks import backend_directory, pulumi_lock_files

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"


@dataclass
class Cluster:
    lab: Lab
    server: Host
    workers: list[Host]
    stack: LabStack
    transcript: list[str] = field(default_factory=list)
    events: list[dict[str, str | None]] = field(default_factory=list)

    def api(self) -> ClusterStack:
        """A fresh API object on the project copy, as another service would make one."""
        return self.stack.api()

    @property
    def stack_file(self) -> Path:
        return self.stack.project / f"Pulumi.{self.stack.name}.yaml"

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.stack.env, "PULUMI_HOME": str(self.stack.directory / "pulumi-home")}

    def hk3s(self, *args: str, kill_when: str | None = None, timeout: float = 600) -> CliRun:
        """`scripts/hk3s --stack lab ARGS` in the project copy, stdin not a terminal; with
        `kill_when`, SIGKILL it and everything it started when a line containing that text appears."""
        argv = [str(self.stack.project / "scripts" / "hk3s"), "--stack", self.stack.name, *args]
        return run_killable(
            argv, cwd=self.stack.project, env=self.env(), kill_when=kill_when, timeout=timeout, split_stderr=True
        )

    def record(self, title: str, run: CliRun) -> None:
        progress = "".join(line for line in run.stderr.splitlines(keepends=True) if not line.startswith("Installing"))
        self.transcript.append(f"$ scripts/hk3s --stack {self.stack.name} {title}\n{progress}{run.stdout}")

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.server.run([K3S, "kubectl", *args, "-o", "json"]).stdout)

    def node_names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.kubectl_json("get", "nodes")["items"]]

    def ready(self, name: str) -> bool:
        node = self.kubectl_json("get", "node", name)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    def lock_files(self) -> list[Path]:
        backend = backend_directory(self.stack.env["PULUMI_BACKEND_URL"])
        assert backend is not None
        return pulumi_lock_files(backend, "hk3s", self.stack.name)


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("au-server"))
    workers = [lab.add_host(worker_spec(f"au-worker-{i}")) for i in (1, 2, 3)]
    lab.wait_ssh_ready([server, *workers])
    stack = LabStack(tmp_path_factory.mktemp("automation-stack"))
    # The server only: every worker is added through the API or the CLI.
    stack.write_config(base_config(lab, server, []))
    the_cluster = Cluster(lab, server, workers, stack)
    yield the_cluster
    transcript = os.environ.get("HK3S_CLI_TRANSCRIPT")
    if transcript:
        Path(transcript).write_text("\n".join(the_cluster.transcript))
        Path(transcript + ".events.json").write_text(json.dumps(the_cluster.events, indent=2))


def test_api_adds_a_worker_and_nodes_shows_it(cluster: Cluster) -> None:
    w1 = cluster.workers[0]
    events: list[auto_events.EngineEvent] = []
    lines: list[str] = []
    result = cluster.api().add_worker(
        w1.name,
        address=w1.public_ip,
        holds_copies=False,
        labels={"tier": "web"},
        on_event=events.append,
        on_output=lines.append,
    )
    assert isinstance(result, RunResult) and result.summary.get("create", 0) >= 2, result.summary
    # The caller saw the engine's events and the join's progress as they came.
    created = {e.resource_pre_event.metadata.urn.split("::")[-1] for e in events if e.resource_pre_event}
    assert any(name.startswith(w1.name) for name in created), created
    assert any(f"[{w1.name}] preflight" in line for line in lines), lines[-40:]
    nodes = {node.name: node for node in cluster.api().nodes(live=False)}
    assert set(nodes) == {cluster.server.name, w1.name}
    worker = nodes[w1.name]
    assert (worker.role, worker.state, worker.address, worker.network_mode) == (
        "worker",
        "ready",
        w1.public_ip,
        "public",
    )
    assert worker.ssh_address == w1.public_ip and worker.holds_copies is False and worker.fenced is False
    assert worker.k3s_version == base_config(cluster.lab, cluster.server, [])["cluster"]["k3s_version"]
    assert nodes[cluster.server.name].role == "server"
    assert cluster.ready(w1.name)
    # The stack file now lists the worker, written with the settings' keys.
    assert f"name: {w1.name}" in cluster.stack_file.read_text()


def test_cli_adds_a_worker_and_node_list_json_matches_the_api(cluster: Cluster) -> None:
    w2 = cluster.workers[1]
    run = cluster.hk3s("node", "add", w2.name, "--address", str(w2.public_ip), "--no-copies", "--label", "tier=batch")
    assert run.returncode == 0, run.stderr[-4000:]
    # Live progress per node, as the join goes.
    assert f"[{w2.name}] preflight" in run.stderr and f"[{w2.name}] preparing the host" in run.stderr, run.stderr
    assert "up succeeded" in run.stdout
    cluster.record(f"node add {w2.name} --address {w2.public_ip} --no-copies --label tier=batch", run)
    listed = cluster.hk3s("node", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    api_nodes = cluster.api().nodes(live=True)
    assert json.loads(listed.stdout) == [node.to_dict() for node in api_nodes]
    # The state read from the cluster now, beside the one the last run recorded.
    assert {n.name: (n.state, n.recorded_state) for n in api_nodes}[w2.name] == ("Ready", "ready")
    assert {n.name: n.state for n in cluster.api().nodes(live=False)}[w2.name] == "ready"
    assert cluster.ready(w2.name)
    assert cluster.kubectl_json("get", "node", w2.name)["metadata"]["labels"]["tier"] == "batch"
    # Cordoned by hand: the list says so at once, with no run in between.
    cluster.server.run([K3S, "kubectl", "cordon", w2.name])
    try:
        table = cluster.hk3s("node", "list")
    finally:
        cluster.server.run([K3S, "kubectl", "uncordon", w2.name])
    assert table.returncode == 0 and w2.name in table.stdout, table.stderr[-3000:]
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith(w2.name))
    assert row[2] == "Ready,cordoned", table.stdout
    cluster.record("node list", table)
    status = cluster.hk3s("status")
    assert status.returncode == 0, status.stderr
    assert f"https://{cluster.server.public_ip}:6443" in status.stdout
    assert "certificate-authority-data" not in status.stdout + status.stderr  # the kubeconfig stays secret
    cluster.record("status", status)
    status_json = json.loads(cluster.hk3s("status", "--json").stdout)
    assert "kubeconfig" not in json.dumps(status_json) and status_json["pending_operations"] == []


def test_bad_input_names_the_setting_and_leaves_the_file_as_it_was(cluster: Cluster) -> None:
    before = cluster.stack_file.read_bytes()
    api = cluster.api()
    with pytest.raises(SettingsRejectedError) as bad_address:
        api.add_worker("au-worker-9", address="198.51.100.300", holds_copies=False)
    assert bad_address.value.keys == ["hk3s:workers[2].address"], bad_address.value
    assert "not an IPv4 address" in str(bad_address.value)
    with pytest.raises(DuplicateWorkerError) as duplicate:
        api.add_worker(cluster.workers[0].name, address=cluster.workers[2].public_ip, holds_copies=False)
    assert duplicate.value.keys == ["hk3s:workers[0].name"]
    with pytest.raises(UnknownWorkerError) as unknown:
        api.fence("au-worker-9", powered_off=True)
    assert unknown.value.keys == ["hk3s:fences.au-worker-9"]
    # The CLI says the same with exit code 3 (refused) and a JSON error for programs.
    run = cluster.hk3s("--json", "node", "add", "au-worker-9", "--address", "198.51.100.300", "--no-copies")
    assert run.returncode == 3, run.stderr
    error = json.loads(run.stdout)
    assert error["error"] == "SettingsRejectedError" and error["problems"][0]["key"] == "hk3s:workers[2].address"
    # Removing without --yes while stdin is no terminal: refused, nothing done.
    unconfirmed = cluster.hk3s("node", "remove", cluster.workers[1].name)
    assert unconfirmed.returncode == 3 and "pass --yes" in unconfirmed.stderr, unconfirmed.stderr
    assert cluster.stack_file.read_bytes() == before


def test_reading_a_stack_never_deployed_creates_nothing(cluster: Cluster) -> None:
    other = cluster.stack.project / "Pulumi.other.yaml"
    other.write_bytes(cluster.stack_file.read_bytes())
    api = ClusterStack(
        "other",
        project_dir=cluster.stack.project,
        env_vars=cluster.stack.env,
        pulumi_command_root=CACHE,
        pulumi_home=cluster.stack.directory / "pulumi-home",
    )
    try:
        before = other.read_bytes()
        assert api.nodes() == []
        status = api.status()
        assert (status.nodes, status.last_run, status.api_endpoint) == ([], None, None)
        listed = cluster.hk3s("--stack", "other", "node", "list", "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
        assert other.read_bytes() == before  # no stack was created: no encryption salt written
    finally:
        other.unlink()


def test_a_run_killed_mid_join_is_resumed_by_one_api_call(cluster: Cluster) -> None:
    w3 = cluster.workers[2]
    killed = cluster.hk3s(
        "node",
        "add",
        w3.name,
        "--address",
        str(w3.public_ip),
        "--no-copies",
        kill_when=f"[{w3.name}] preparing the host",
    )
    assert killed.killed, f"the run finished before the join was prepared:\n{killed.stderr[-3000:]}"
    # What a crash leaves: the killed CLI's lock and the join it never saw finish.
    assert cluster.lock_files(), "the killed run left no lock"
    api = cluster.api()
    assert any("NodeJoin" in op and w3.name in op for op in api.pending_operations()), api.pending_operations()
    lines: list[str] = []
    result = api.up(on_output=lines.append)
    assert result.recovery.stale_locks and result.recovery.cleared_pending, result.recovery
    assert any("removed the lock of an interrupted run" in line for line in lines)
    assert cluster.lock_files() == []
    assert api.pending_operations() == []
    assert cluster.node_names().count(w3.name) == 1
    assert cluster.ready(w3.name)
    assert {n.name: n.state for n in api.nodes(live=False)}[w3.name] == "ready"


def test_two_api_callers_one_runs_the_other_is_told_the_stack_is_busy(cluster: Cluster) -> None:
    barrier = threading.Barrier(2)
    results: list[object] = []

    def call() -> None:
        api = cluster.api()
        barrier.wait()
        try:
            results.append(api.up())
        except StackBusyError as error:
            results.append(error)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    busy = [r for r in results if isinstance(r, StackBusyError)]
    done = [r for r in results if isinstance(r, RunResult)]
    assert len(busy) == 1 and len(done) == 1, results
    assert "is busy" in str(busy[0]) and str(os.getpid()) in str(busy[0])
    api = cluster.api()
    assert api.pending_operations() == [] and cluster.lock_files() == []
    assert api.preview().changes == []


def test_a_pulumi_run_in_progress_makes_the_api_report_busy(cluster: Cluster) -> None:
    """Someone runs `pulumi up` at a terminal; the API sees its lock, names it, and edits nothing."""
    before = cluster.stack_file.read_bytes()
    process = subprocess.Popen(
        ["pulumi", "up", "--yes", "--skip-preview", "--stack", cluster.stack.name, "--non-interactive"],
        cwd=cluster.stack.project,
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not cluster.lock_files() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.02)
        assert cluster.lock_files(), "pulumi up never took the lock"
        with pytest.raises(StackBusyError) as busy:
            cluster.api().add_worker("au-worker-9", address="198.51.100.99", holds_copies=False)
        assert "is busy" in str(busy.value) and busy.value.holders[0].pid == process.pid, busy.value
    finally:
        output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-3000:]
    assert cluster.stack_file.read_bytes() == before
    api = cluster.api()
    assert api.pending_operations() == [] and api.preview().changes == []


def test_removing_a_worker_that_does_not_answer_is_refused_and_the_file_restored(cluster: Cluster) -> None:
    w2 = cluster.workers[1]
    before = cluster.stack_file.read_bytes()
    events: list[auto_events.EngineEvent] = []
    w2.power_off()
    try:
        with pytest.raises(RefusedError) as refused:
            cluster.api().remove_worker(w2.name, on_event=events.append)
        error = refused.value
        assert error.reason == "removal" and error.config_restored and error.stack_restored, error
        diagnostics = [
            e.diagnostic_event for e in events if e.diagnostic_event and e.diagnostic_event.severity == "error"
        ]
        cluster.events.extend({"urn": d.urn, "message": d.message, "severity": d.severity} for d in diagnostics)
        failed = [e.res_op_failed_event.metadata for e in events if e.res_op_failed_event]
        cluster.events.extend({"failed_urn": m.urn, "type": m.type, "op": str(m.op)} for m in failed)
        # Refused by the worker roster, which everything that touches the cluster waits for.
        assert error.resource is not None and error.resource.name == "workers", error.problems
        assert f"{w2.name}: removing the worker is refused: does not answer over SSH" in (error.resource.message)
        assert cluster.stack_file.read_bytes() == before
        assert w2.name in {n.name for n in cluster.api().nodes()}
        # The CLI reports the same refusal with exit code 3.
        run = cluster.hk3s("node", "remove", w2.name, "--yes")
        assert run.returncode == 3 and "does not answer over SSH" in run.stderr, run.stderr[-3000:]
        # The provider's error as its message alone: no Python traceback from the provider host.
        assert "Traceback (most recent call last)" not in run.stderr + run.stdout, run.stderr[-3000:]
        assert 'File "' not in run.stderr + run.stdout, run.stderr[-3000:]
        assert cluster.stack_file.read_bytes() == before
    finally:
        w2.power_on(wait=True)
    # Whatever else moved during the refused runs comes back with the next up: no delete.
    assert cluster.api().up().summary.get("delete", 0) == 0


def test_the_cli_removes_a_worker_and_the_api_no_longer_lists_it(cluster: Cluster) -> None:
    w2 = cluster.workers[1]
    run = cluster.hk3s("node", "remove", w2.name, "--yes")
    cluster.record(f"node remove {w2.name} --yes", run)
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"[{w2.name}] removed:" in run.stderr, run.stderr[-4000:]
    assert w2.name not in cluster.node_names()
    assert w2.name not in {n.name for n in cluster.api().nodes()}
    assert w2.name not in cluster.stack_file.read_text()
    assert w2.run(["test", "-e", "/var/lib/rancher/k3s"], check=False).returncode != 0


def test_fencing_a_ready_worker_is_refused_and_changes_nothing(cluster: Cluster) -> None:
    w1 = cluster.workers[0]
    before = cluster.stack_file.read_bytes()
    # Releasing data needs --yes: without a terminal the CLI shows the plan and stops.
    unconfirmed = cluster.hk3s("node", "fence", w1.name, "--powered-off", "--accept-stale-data")
    assert unconfirmed.returncode == 3 and "pass --yes" in unconfirmed.stderr, unconfirmed.stderr[-3000:]
    assert "The plan:" in unconfirmed.stderr and f"{w1.name}-fence" in unconfirmed.stderr, unconfirmed.stderr[-3000:]
    with pytest.raises(RefusedError) as refused:
        cluster.api().fence(w1.name, powered_off=True)
    error = refused.value
    assert error.reason == "fence" and error.config_restored and error.stack_restored, error
    assert error.resource is not None and error.resource.name == f"{w1.name}-fence"
    assert f"{w1.name} is Ready: a fence is only for a worker that is down" in error.resource.message
    assert cluster.stack_file.read_bytes() == before
    assert {n.name: n.fenced for n in cluster.api().nodes()}[w1.name] is False
    assert cluster.ready(w1.name)


def test_the_ci_commands_preview_then_up(cluster: Cluster) -> None:
    """The commands examples/ci/github-actions-deploy.yml runs, as it runs them: the JSON
    preview both jobs keep, the reviewed plan's check on it, then the up."""
    preview = cluster.hk3s("--json", "preview")
    assert preview.returncode == 0, preview.stderr[-3000:]
    assert json.loads(preview.stdout)["changes"] == [], preview.stdout
    cluster.record("--json preview", preview)
    plan = cluster.stack.project / "plan.json"
    plan.write_text(preview.stdout)
    script = str(cluster.stack.project / "examples" / "ci" / "reviewed_plan.py")
    checked = subprocess.run([sys.executable, script, "check", str(plan), str(plan)], capture_output=True, check=False)
    assert checked.returncode == 0, checked.stderr
    up = cluster.hk3s("up", "--yes")
    assert up.returncode == 0 and "up succeeded" in up.stdout, up.stderr[-3000:]
    cluster.record("up --yes", up)
    assert cluster.api().pending_operations() == []


def _pulumi(
    cluster: Cluster, env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`pulumi ARGS` typed by hand in the project copy."""
    return subprocess.run(
        ["pulumi", *args],
        cwd=cluster.stack.project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_pulumi_login_to_a_file_backend_is_the_stack_every_surface_sees(cluster: Cluster, tmp_path: Path) -> None:
    """A user who ran `pulumi login file://DIR` and never set PULUMI_BACKEND_URL: `pulumi up` typed
    by hand, then `scripts/hk3s node list`, `status` and `up`, and the API, all see that one stack
    (not an empty one in ~/.hk3s-state, which is never made)."""
    backend = cluster.stack.env["PULUMI_BACKEND_URL"]
    env = {key: value for key, value in cluster.env().items() if key != "PULUMI_BACKEND_URL"}
    env["HOME"] = str(tmp_path / "home")  # a HOME of its own: its ~/.hk3s-state would be the fallback
    Path(env["HOME"]).mkdir()
    login = _pulumi(cluster, env, "login", backend)
    assert login.returncode == 0, login.stdout + login.stderr
    try:
        # As the user types it (the stack made first when this test runs alone).
        selected = _pulumi(cluster, env, "stack", "select", "--create", "lab")
        assert selected.returncode == 0, selected.stderr
        typed = _pulumi(
            cluster, env, "up", "--yes", "--skip-preview", "--stack", "lab", "--non-interactive", timeout=900
        )
        assert typed.returncode == 0, typed.stdout[-3000:] + typed.stderr[-3000:]
        # What the stack records, as the Pulumi CLI reads it from the backend of the login.
        output = _pulumi(cluster, env, "stack", "output", "nodes", "--json", "--stack", "lab")
        assert output.returncode == 0, output.stderr
        recorded = sorted(node["name"] for node in json.loads(output.stdout))
        assert cluster.server.name in recorded, recorded

        def hk3s(*args: str) -> CliRun:
            argv = [str(cluster.stack.project / "scripts" / "hk3s"), "--stack", "lab", *args]
            return run_killable(argv, cwd=cluster.stack.project, env=env, timeout=900, split_stderr=True)

        listed = hk3s("node", "list", "--json")
        assert listed.returncode == 0, listed.stderr[-3000:]
        assert sorted(node["name"] for node in json.loads(listed.stdout)) == recorded, listed.stdout
        status = hk3s("status", "--json")
        assert status.returncode == 0, status.stderr[-3000:]
        assert (json.loads(status.stdout)["last_run"] or {}).get("kind") == "update", status.stdout
        up = hk3s("up", "--yes")
        assert up.returncode == 0 and "up succeeded" in up.stdout, up.stderr[-3000:]
        assert "no Pulumi login" not in up.stderr + listed.stderr + status.stderr
        assert not (Path(env["HOME"]) / ".hk3s-state").exists(), "a second, empty state was made"
        # The API, made as another service makes it, finds the login's backend too.
        api = ClusterStack(
            "lab",
            project_dir=cluster.stack.project,
            env_vars={key: value for key, value in cluster.stack.env.items() if key != "PULUMI_BACKEND_URL"}
            | {"HOME": env["HOME"]},
            pulumi_command_root=CACHE,
            pulumi_home=cluster.stack.directory / "pulumi-home",
        )
        assert sorted(node.name for node in api.nodes(live=False)) == recorded
        assert api.backend_choice.source == "pulumi login", api.backend_choice
        assert backend_directory(api.backend_url) == backend_directory(backend), api.backend_url
    finally:
        _pulumi(cluster, env, "logout")


def test_a_passphrase_stack_rotated_to_a_key_service_runs_with_no_passphrase(cluster: Cluster, tmp_path: Path) -> None:
    """The cluster's passphrase stack moved to a key service (AWS KMS's API, served by moto in the
    lab) with `pulumi stack change-secrets-provider`, as docs/ci.md shows: the passphrase is needed
    that once; from then on `scripts/hk3s` lists, reports and runs `up` with no passphrase set, and
    the state's secrets are the key's (no passphrase salt left). A stack made with the key and a
    key service without credentials: tests/lab/test_stack_preview.py."""
    with running_kms_server(tmp_path) as kms:
        url = kms.secrets_provider(kms.create_key())
        env = {**cluster.env(), **kms.credentials()}
        with_passphrase = dict(env)
        env.pop("PULUMI_CONFIG_PASSPHRASE", None)

        def hk3s(*args: str) -> CliRun:
            argv = [str(cluster.stack.project / "scripts" / "hk3s"), "--stack", "lab", *args]
            return run_killable(argv, cwd=cluster.stack.project, env=env, timeout=900, split_stderr=True)

        changed = _pulumi(cluster, with_passphrase, "stack", "change-secrets-provider", url, "--stack", "lab")
        assert changed.returncode == 0, changed.stdout + changed.stderr
        document = yaml.safe_load(cluster.stack_file.read_text())
        assert document["secretsprovider"] == url and "encryptionsalt" not in document, list(document)
        listed = hk3s("node", "list", "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout), listed.stderr[-3000:]
        status = hk3s("status")
        assert status.returncode == 0, status.stderr[-3000:]
        up = hk3s("up", "--yes")
        assert up.returncode == 0 and "up succeeded" in up.stdout, up.stderr[-3000:]
        assert "PULUMI_CONFIG_PASSPHRASE" not in listed.stderr + status.stderr + up.stderr
        backend = backend_directory(cluster.stack.env["PULUMI_BACKEND_URL"])
        assert backend is not None
        # `.pulumi/stacks/[organization/]hk3s/lab.json`, as the backend lays out its stacks.
        current = [path for path in backend.rglob("lab.json") if path.parent.name == "hk3s" and "stacks" in path.parts]
        assert len(current) == 1, current
        state = json.loads(current[0].read_text())
        providers = state["checkpoint"]["latest"]["secrets_providers"]
        assert providers["type"] == "cloud" and providers["state"]["url"] == url, providers
        assert "salt" not in json.dumps(providers), providers
        assert "ciphertext" in json.dumps(state["checkpoint"]["latest"]["resources"]), "no secret in the state"
