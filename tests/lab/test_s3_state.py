"""A stack whose state is kept in an S3 bucket, run by two operators on two "machines": the real
Pulumi CLI's DIY backend on a real S3 server (versitygw, lab/s3_server.py), real lab hosts, the
operator API and CLI. Nothing is mocked.

Machine A runs in namespaces of its own (another hostname, another pid space, another HOME and
PULUMI_HOME): what Pulumi writes into its lock object is what another machine, a CI runner,
would write. Machine B is this process with its own HOME, PULUMI_HOME and copy of the project.
One S3 server, one server host and two workers serve the whole module; the tests run in order and
make the stack's whole life: bad backend input refused; an up with both workers SIGKILLed on
machine A and recovered from machine B with `unlock`; a run on machine A making machine B busy;
a damaged state restored from the previous checkpoint; a `node reboot` on machine A making machine
B's busy; s3-worker-2 powered off, fenced and given up
(`node remove --force`); the teardown. After each run the state in the bucket, read straight from
S3, is checked: one NodeJoin per worker, the given-up worker gone from it, no lock left.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import Host, Lab
from lab.s3_server import VERSITYGW, S3Server, running_s3_server
from lab.stack_harness import (
    CACHE,
    CliRun,
    LabStack,
    base_config,
    run_killable,
    server_spec,
    skip_without_lab_binaries,
    wait_until,
    worker_spec,
)
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from operator_api import ClusterStack, StackBusyError, StackError
from operator_api.s3_backend import ALLOW_HTTP

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"
BUCKET = "team-state"
MACHINE_A = "machine-a"


@dataclass
class Team:
    lab: Lab
    s3: S3Server
    server: Host
    worker: Host
    worker2: Host
    a: LabStack
    b: LabStack

    def env_a(self) -> dict[str, str]:
        home = self.a.directory / "home"
        home.mkdir(exist_ok=True)
        return {**os.environ, **self.a.env, "HOME": str(home), "PULUMI_HOME": str(self.a.directory / "pulumi-home")}

    def on_machine_a(self, argv: list[str]) -> list[str]:
        """`argv` in a UTS and pid namespace of its own, its hostname machine-a: its processes
        end with the namespace's first process, as a machine's do when it goes down."""
        script = f'hostname {MACHINE_A} && exec "$@"'
        return ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c", script, "sh", *argv]

    def hk3s_a(self, *args: str, kill_when: str | None = None) -> CliRun:
        argv = self.on_machine_a([str(self.a.project / "scripts" / "hk3s"), "--stack", self.a.name, *args])
        return run_killable(
            argv, cwd=self.a.project, env=self.env_a(), kill_when=kill_when, timeout=900, split_stderr=True
        )

    def api_b(self, **env: str) -> ClusterStack:
        home = self.b.directory / "home"
        home.mkdir(exist_ok=True)
        return ClusterStack(
            self.b.name,
            project_dir=self.b.project,
            env_vars={**self.b.env, "HOME": str(home), **env},
            pulumi_command_root=CACHE,
            pulumi_home=self.b.directory / "pulumi-home",
        )

    def hk3s_b(self, *args: str) -> CliRun:
        return self.b.hk3s(*args)

    def lock_keys(self) -> list[str]:
        return self.s3.client(BUCKET).lock_keys("hk3s", self.b.name)

    def node_names(self) -> list[str]:
        out = self.server.run([K3S, "kubectl", "get", "nodes", "-o", "name"]).stdout
        return [line.removeprefix("node/") for line in out.split()]

    def node(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.server.run([K3S, "kubectl", "get", "node", name, "-o", "json"]).stdout)
        return found

    def bucket_resources(self) -> list[dict[str, Any]]:
        """The resources of the stack's current state as the bucket holds it: the checkpoint
        object Pulumi's DIY backend keeps at .pulumi/stacks/<project>/<stack>.json, read straight
        from S3 (not through the CLI, which could answer from elsewhere)."""
        client = self.s3.client(BUCKET)
        keys = client.list_keys(".pulumi/stacks/")
        current = [k for k in keys if k.endswith(f"/hk3s/{self.b.name}.json")]
        assert len(current) == 1, keys
        raw = client.get(current[0])
        assert raw is not None, current
        latest = json.loads(raw)["checkpoint"].get("latest") or {}
        resources: list[dict[str, Any]] = latest.get("resources") or []
        return resources

    def bucket_urns(self) -> list[str]:
        return [r["urn"] for r in self.bucket_resources()]

    def in_bucket(self, kind: str) -> Counter[str]:
        """How many resources of each name of one kind (NodeJoin, NodeFence) the bucket's state holds."""
        return Counter(r["urn"].rsplit("::", 1)[1] for r in self.bucket_resources() if kind in r["type"])


@pytest.fixture(scope="module")
def team(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    skip_without_lab_binaries()
    if not VERSITYGW.exists() or shutil.which("unshare") is None:
        pytest.skip(f"{VERSITYGW} or unshare missing: run lab/build/versitygw.sh")
    with running_s3_server(tmp_path_factory.mktemp("s3-server")) as s3:
        s3.create_bucket(BUCKET)
        server = lab.add_host(server_spec("s3-server"))
        workers = [lab.add_host(worker_spec(f"s3-worker-{i}")) for i in (1, 2)]
        lab.wait_ssh_ready([server, *workers])
        # The module ends with the stack's teardown (destroy needs the setting, applied by an up).
        config = base_config(lab, server, workers, cluster={"teardown": "allowed"})
        stacks = []
        for machine in ("machine-a", "machine-b"):
            stack = LabStack(tmp_path_factory.mktemp(machine))
            stack.env.update({**s3.credentials(), "PULUMI_BACKEND_URL": s3.backend_url(BUCKET)})
            stack.write_config(config)
            stacks.append(stack)
        yield Team(lab, s3, server, workers[0], workers[1], stacks[0], stacks[1])


def test_bad_backend_input_is_one_line_naming_the_variable_and_changes_nothing(team: Team) -> None:
    """A wrong endpoint, a missing bucket, refused credentials, a key that may only read and a
    plain-HTTP endpoint not acknowledged: each refused before any run, by name, with the fix; the
    bucket and the stack file untouched."""
    url = team.s3.backend_url
    reader = team.s3.reader(BUCKET)
    cases = {
        "endpoint": (
            {"PULUMI_BACKEND_URL": url(BUCKET, endpoint="http://127.0.0.1:9")},
            "endpoint= in PULUMI_BACKEND_URL",
        ),
        "bucket": ({"PULUMI_BACKEND_URL": url("no-such-bucket")}, "names bucket no-such-bucket, which does not exist"),
        "credentials": ({"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "refused the credentials"),
        "read-only": (reader, "may not write to bucket team-state"),
        "no key": ({"AWS_ACCESS_KEY_ID": ""}, "AWS_ACCESS_KEY_ID not set"),
        # The lab's gateway is plain HTTP: used only with the acknowledgement (the fixture's env has it).
        "plain http": ({ALLOW_HTTP: "0"}, "is plain HTTP: the key id, request signatures and the stack's state"),
    }
    client = team.s3.client(BUCKET)
    before = (client.list_keys(""), team.b.project.joinpath("Pulumi.lab.yaml").read_bytes())
    for name, (env, expected) in cases.items():
        with pytest.raises(StackError) as refused:
            team.api_b(**env).add_worker("s3-worker-9", address="198.51.100.9", holds_copies=False)
        message = str(refused.value)
        assert expected in message and "\n" not in message, (name, message)
        assert (client.list_keys(""), team.b.project.joinpath("Pulumi.lab.yaml").read_bytes()) == before, name
    # The CLI: the same line, last on stderr, and a failing exit.
    saved = dict(team.b.env)
    team.b.env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    try:
        cli = team.hk3s_b("status")
    finally:
        team.b.env.clear()
        team.b.env.update(saved)
    assert cli.returncode != 0 and "refused the credentials" in cli.stderr.strip().splitlines()[-1], cli.stderr[-2000:]
    assert client.list_keys("") == before[0]


def test_a_run_killed_on_machine_a_is_recovered_from_machine_b_with_unlock(team: Team) -> None:
    killed = team.hk3s_a("up", "--yes", kill_when=f"[{team.worker.name}] preparing the host")
    assert killed.killed, f"the run finished before the join was prepared:\n{killed.stderr[-3000:]}"
    # What a dead runner leaves in the bucket: its lock object, naming machine A.
    assert len(team.lock_keys()) == 1, team.lock_keys()
    api = team.api_b()
    with pytest.raises(StackBusyError) as busy:
        api.up()
    holder = busy.value.holders[0]
    assert holder.hostname == MACHINE_A and holder.user == "root" and holder.pid and holder.since, holder
    assert MACHINE_A in str(busy.value) and "unlock" in str(busy.value)
    assert len(team.lock_keys()) == 1, "a lock of another machine was removed without a confirmation"
    # Shown, not removed, without a confirmation: the API and the CLI (stdin not a terminal).
    report = api.unlock()
    assert [h.hostname for h in report.holders] == [MACHINE_A] and report.removed == [], report
    assert report.ages[0] is not None and 0 <= report.ages[0] < 3600, report
    shown = team.hk3s_b("unlock")
    assert shown.returncode != 0 and MACHINE_A in shown.stdout + shown.stderr, shown
    assert "old" in shown.stdout + shown.stderr, shown
    assert len(team.lock_keys()) == 1
    removed = team.hk3s_b("unlock", "--yes")
    assert removed.returncode == 0 and MACHINE_A in removed.stdout + removed.stderr, removed
    assert team.lock_keys() == []
    # The usual recovery goes on from machine B: the interrupted join's pending operations are
    # cleared by a refresh, and each worker's join runs once: one Node per worker, one NodeJoin
    # per worker in the state in the bucket.
    assert api.pending_operations(), "the killed run left no pending operation"
    result = team.api_b().up()
    assert result.recovery.cleared_pending, result.recovery
    workers = (team.worker.name, team.worker2.name)
    assert [team.node_names().count(name) for name in workers] == [1, 1], team.node_names()
    assert team.in_bucket("NodeJoin") == {f"{name}-join": 1 for name in workers}, team.bucket_urns()
    assert team.api_b().pending_operations() == [] and team.lock_keys() == []


def test_a_pulumi_login_to_the_bucket_with_an_aws_profile_is_the_stack_every_surface_sees(
    team: Team, tmp_path: Path
) -> None:
    """A user whose AWS access is a profile (a shared credentials file, no key in the environment)
    and who ran `pulumi login s3://...`, PULUMI_BACKEND_URL unset: `pulumi up` typed by hand, then
    `scripts/hk3s node list` and `status` and the API see that stack in the bucket, through the
    profile named by AWS_PROFILE; then `status` and `up` with the profile named by profile= in the URL."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[team]\naws_access_key_id = {team.s3.access_key}\naws_secret_access_key = {team.s3.secret_key}\n"
    )
    pulumi_home = team.b.directory / "pulumi-home"
    env = {
        key: value
        for key, value in {**os.environ, **team.b.env}.items()
        if key not in ("PULUMI_BACKEND_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    }
    env |= {
        "HOME": str(tmp_path),
        "PULUMI_HOME": str(pulumi_home),
        "AWS_PROFILE": "team",
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }

    def pulumi(environment: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pulumi", *args],
            cwd=team.b.project,
            env=environment,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    def hk3s(environment: dict[str, str], *args: str) -> CliRun:
        argv = [str(team.b.project / "scripts" / "hk3s"), "--stack", team.b.name, *args]
        return run_killable(argv, cwd=team.b.project, env=environment, timeout=900, split_stderr=True)

    url = team.s3.backend_url(BUCKET)
    login = pulumi(env, "login", url)
    assert login.returncode == 0, login.stdout + login.stderr
    try:
        # As the user types it (the stack made first when this test runs alone).
        selected = pulumi(env, "stack", "select", "--create", team.b.name)
        assert selected.returncode == 0, selected.stderr
        typed = pulumi(env, "up", "--yes", "--skip-preview", "--stack", team.b.name, "--non-interactive")
        assert typed.returncode == 0, typed.stdout[-3000:] + typed.stderr[-3000:]
        output = pulumi(env, "stack", "output", "nodes", "--json", "--stack", team.b.name)
        assert output.returncode == 0, output.stderr
        recorded = sorted(node["name"] for node in json.loads(output.stdout))
        assert team.worker.name in recorded and team.worker2.name in recorded, recorded
        listed = hk3s(env, "node", "list", "--json")
        assert listed.returncode == 0, listed.stderr[-3000:]
        assert sorted(node["name"] for node in json.loads(listed.stdout)) == recorded, listed.stdout
        status = hk3s(env, "status", "--json")
        assert status.returncode == 0, status.stderr[-3000:]
        assert (json.loads(status.stdout)["last_run"] or {}).get("kind") == "update", status.stdout
        assert not (tmp_path / ".hk3s-state").exists(), "a second, empty state was made"
        api = ClusterStack(
            team.b.name,
            project_dir=team.b.project,
            env_vars={k: v for k, v in env.items() if k != "PULUMI_HOME"},
            pulumi_command_root=CACHE,
            pulumi_home=pulumi_home,
        )
        assert sorted(node.name for node in api.nodes(live=False)) == recorded
        assert (api.backend_url, api.backend_choice.source) == (url, "pulumi login"), api.backend_choice

        # The profile named in the URL instead of AWS_PROFILE.
        by_url = {k: v for k, v in env.items() if k != "AWS_PROFILE"}
        login = pulumi(by_url, "login", f"{url}&profile=team")
        assert login.returncode == 0, login.stdout + login.stderr
        status = hk3s(by_url, "status", "--json")
        assert status.returncode == 0, status.stderr[-3000:]
        assert sorted(node["name"] for node in json.loads(status.stdout)["nodes"]) == recorded, status.stdout
        # And an up through hk3s runs on that same stack in the bucket (its lock taken and released there).
        up = hk3s(by_url, "up", "--yes")
        assert up.returncode == 0 and "up succeeded" in up.stdout, up.stdout[-3000:] + up.stderr[-3000:]
        assert "no Pulumi login" not in up.stderr + listed.stderr + status.stderr
        assert not (tmp_path / ".hk3s-state").exists(), "a second, empty state was made"
        assert team.lock_keys() == []
    finally:
        pulumi(env, "logout")


def test_a_live_run_on_machine_a_makes_machine_b_busy_naming_it(team: Team) -> None:
    pulumi = ["pulumi", "up", "--yes", "--skip-preview", "--stack", team.a.name, "--non-interactive", "--refresh"]
    process = subprocess.Popen(
        team.on_machine_a(pulumi),
        cwd=team.a.project,
        env=team.env_a(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stack_file = team.b.project / "Pulumi.lab.yaml"
    before = stack_file.read_bytes()
    try:
        deadline = time.monotonic() + 120
        while not team.lock_keys() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert team.lock_keys(), "pulumi up on machine A never took the lock"
        with pytest.raises(StackBusyError) as busy:
            team.api_b().add_worker("s3-worker-9", address="198.51.100.9", holds_copies=False)
        holder = busy.value.holders[0]
        assert holder.hostname == MACHINE_A and holder.pid is not None and holder.pid != process.pid, holder
        # Read from the bucket before the stack file was touched, not learnt from a refused run.
        assert "in the bucket" in str(busy.value), busy.value
        assert stack_file.read_bytes() == before
    finally:
        output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-3000:]
    assert team.lock_keys() == []


def _secrets_and_host_keys(team: Team) -> tuple[set[str], dict[str, str]]:
    """A digest of every secret's value in the stack's state (read with --show-secrets here,
    compared as digests so that no secret reaches a failure message; an export encrypts each
    secret anew, so ciphertexts cannot be compared), and each recorded host key."""
    exported = subprocess.run(
        ["pulumi", "stack", "export", "--show-secrets", "--stack", team.b.name],
        cwd=team.b.project,
        env={**os.environ, **team.b.env, "PULUMI_HOME": str(team.b.directory / "pulumi-home")},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    resources = json.loads(exported.stdout)["deployment"].get("resources", [])
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            if "plaintext" in value:
                found.add(hashlib.sha256(str(value["plaintext"]).encode()).hexdigest())
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(resources)
    keys = {
        f"{r['urn']}.{name}": str(value)
        for r in resources
        for name, value in (r.get("outputs") or {}).items()
        if "host_key" in name and isinstance(value, str) and value
    }
    return found, keys


def test_a_damaged_state_is_restored_from_the_previous_checkpoint_with_its_secrets(team: Team) -> None:
    api = team.api_b()
    before = api.export_state()
    assert "plaintext" not in json.dumps(before), "the API's export shows a secret"
    secrets, host_keys = _secrets_and_host_keys(team)
    assert secrets and host_keys, f"the state holds no secret or host key to keep: {secrets} {host_keys}"
    checkpoints = api.checkpoints()
    assert checkpoints and checkpoints[0].kind == "update" and checkpoints[0].result == "succeeded", checkpoints
    # The damage: a teammate on machine A drops the worker's join from the state by hand.
    join = next(
        r["urn"] for r in before["deployment"]["resources"] if "NodeJoin" in r["type"] and team.worker.name in r["urn"]
    )
    dropped = subprocess.run(
        team.on_machine_a(["pulumi", "state", "delete", join, "--target-dependents", "--yes", "--stack", "lab"]),
        cwd=team.a.project,
        env=team.env_a(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert join not in {r["urn"] for r in api.export_state()["deployment"]["resources"]}
    # A restore needs the stack's name.
    with pytest.raises(StackError, match="confirm='lab'"):
        api.restore(checkpoints[0], confirm="yes")
    assert join not in {r["urn"] for r in api.export_state()["deployment"]["resources"]}
    # The CLI lists the kept states and restores one, only with the stack's name.
    listed = team.hk3s_b("state", "list")
    assert listed.returncode == 0 and checkpoints[0].key in listed.stdout, listed
    unconfirmed = team.hk3s_b("state", "restore", checkpoints[0].key)
    assert unconfirmed.returncode == 3 and "--confirm lab" in unconfirmed.stderr, unconfirmed
    assert join not in {r["urn"] for r in api.export_state()["deployment"]["resources"]}
    restored = team.hk3s_b("state", "restore", checkpoints[0].key, "--confirm", "lab")
    assert restored.returncode == 0, restored
    after = api.export_state()
    assert [r["urn"] for r in after["deployment"]["resources"]] == [r["urn"] for r in before["deployment"]["resources"]]
    assert _secrets_and_host_keys(team) == (secrets, host_keys)
    assert api.preview().changes == [], "the restored state differs from the hosts"


def test_a_reboot_on_machine_a_holds_the_stack_in_the_bucket_against_machine_b(team: Team) -> None:
    """`node reboot` makes no Pulumi run, yet it must hold the stack across machines as an `up`
    does: machine A's reboot of s3-worker-1 writes a lock object into the bucket (Pulumi's own
    layout, so a `pulumi up` anywhere waits for it too). Meanwhile machine B's `node reboot
    s3-worker-2` is refused naming machine A as the holder, before it touches anything:
    s3-worker-2 is not cordoned, not recorded as rebooting, its host not rebooted. Once A's reboot
    is over its lock is gone."""
    w1, w2 = team.worker, team.worker2
    hk3s = [str(team.a.project / "scripts" / "hk3s"), "--stack", team.a.name, "node", "reboot", w1.name]
    process = subprocess.Popen(
        team.on_machine_a(hk3s),
        cwd=team.a.project,
        env=team.env_a(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    boots, stack_file = w2.boots, team.b.project / "Pulumi.lab.yaml"
    before = stack_file.read_bytes()
    try:
        deadline = time.monotonic() + 120
        while not team.lock_keys() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert team.lock_keys(), "node reboot on machine A took no lock in the bucket"
        refused = team.hk3s_b("node", "reboot", w2.name)
        assert refused.returncode != 0, refused.stderr[-3000:]
        assert MACHINE_A in refused.stderr and "in the bucket" in refused.stderr, refused.stderr[-3000:]
        found = team.node(w2.name)
        assert not found["spec"].get("unschedulable"), found["spec"]
        assert "hk3s.dev/reboot" not in (found["metadata"].get("annotations") or {}), found["metadata"]
        assert stack_file.read_bytes() == before
    finally:
        output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-3000:]
    assert w2.boots == boots, "machine B's reboot went on"
    assert team.lock_keys() == []


def test_a_worker_that_is_down_is_fenced_and_given_up_with_the_state_in_the_bucket(team: Team) -> None:
    """s3-worker-2 goes down: powered off, its address silent (no machine answers ARP for it, so
    the server's dial of its kubelet gets no answer). Once NotReady for the minute a fence asks for,
    it is fenced as powered off, then given up (`node remove --force`: the fence completed, the
    host off). After each run, the state in the bucket: its fence recorded beside the joins, then
    nothing of it left, s3-worker-1's join alone, and no lock."""
    w1, w2 = team.worker, team.worker2
    stack_file = team.b.project / "Pulumi.lab.yaml"
    w2.power_off()

    def ready() -> dict[str, Any]:
        return next(c for c in team.node(w2.name)["status"]["conditions"] if c["type"] == "Ready")

    wait_until(f"{w2.name} NotReady", lambda: ready()["status"] != "True", 90, lambda: str(team.node_names()))
    since = datetime.fromisoformat(ready()["lastTransitionTime"]).timestamp()
    time.sleep(max(0.0, since + 62 - float(team.server.run(["date", "+%s"]).stdout)))

    fence = team.hk3s_b("node", "fence", w2.name, "--powered-off")
    assert fence.returncode == 0, fence.stderr[-4000:]
    assert f"[{w2.name}] fenced (recorded" in fence.stderr, fence.stderr[-4000:]
    assert "confirmed powered off" in fence.stderr, fence.stderr[-4000:]
    found = team.node(w2.name)
    assert FENCE_ANNOTATION in found["metadata"]["annotations"], found["metadata"]
    assert OUT_OF_SERVICE_TAINT in {t["key"] for t in found["spec"].get("taints") or []}, found["spec"]
    assert team.in_bucket("NodeFence") == {f"{w2.name}-fence": 1}, team.bucket_urns()
    assert team.in_bucket("NodeJoin") == {f"{w1.name}-join": 1, f"{w2.name}-join": 1}, team.bucket_urns()
    assert team.lock_keys() == []

    removed = team.hk3s_b("node", "remove", w2.name, "--force", "--yes")
    assert removed.returncode == 0, removed.stderr[-4000:]
    assert f"[{w2.name}] given up (fenced since" in removed.stderr, removed.stderr[-4000:]
    assert team.node_names().count(w1.name) == 1 and w2.name not in team.node_names(), team.node_names()
    left = [r["urn"] for r in team.bucket_resources() if w2.name in r["urn"]]
    assert left == [], f"the given-up worker is still in the state in the bucket: {left}"
    assert team.in_bucket("NodeJoin") == {f"{w1.name}-join": 1}, team.bucket_urns()
    assert team.lock_keys() == [] and team.api_b().pending_operations() == []
    config = stack_file.read_text()
    assert f"name: {w2.name}" not in config and "force_remove: true" in config, config


def test_the_stack_is_torn_down_from_machine_b_and_leaves_the_bucket_clean(team: Team) -> None:
    """The end of the stack's life on S3: destroyed from machine B (what a teardown wipes on the
    hosts is tests/lab/test_teardown.py's), no lock and no resource left in the state in the bucket."""
    api = team.api_b()
    api.destroy_stack(confirm="lab")
    assert team.lock_keys() == []
    assert api.export_state()["deployment"].get("resources") in (None, [])
    assert team.bucket_resources() == []
    assert api.pending_operations() == []
