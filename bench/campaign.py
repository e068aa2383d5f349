"""A fault campaign: a seeded random schedule of operations and faults on a lab cluster, the
product's promises checked as invariants after every step.

    venv/bin/python -m bench.campaign --faults 10 --seed 7
    venv/bin/python -m bench.campaign --faults 200 --seed 1 --out bench/results/campaign.json
    venv/bin/python -m bench.campaign --replay '[{"op": "add", ...}]'    # a schedule a run printed

One lab: a server and `--workers` pod-capable workers (a real containerd, runc and kubelet under
the k3s stand-in, the real kube-controller-manager) with Longhorn's stand-in (its manager and its
CSI path: the real attach/detach controller and kubelet mount the volumes), `--spares` hosts booted
but not joined (what `node add` joins), and a few Deployments each writing into a Longhorn volume.
The kube-apiserver logs to an audit log (a k3s config drop-in on the server, written before k3s is
installed: `kube-apiserver-arg` audit flags, as a k3s operator turns auditing on).

A schedule is a list of steps, each an operation run through the public surface as users run it
(`scripts/hk3s ...`, plain `pulumi up` after a stack-file edit), with at most one fault injected at
a random moment inside it: when the run has printed its n-th line (n drawn from the seed), so the
fault lands in a different phase each time. Then the fault is healed (the host powered on, the link
back, sshd started) and the operation retried the way docs/ says: the same command again
(docs/cli.md, exit 1: "fix the cause and run the same command again"), after a killed run either
`scripts/hk3s up --yes` (docs/recovery.md: one command finishes the run), `scripts/hk3s unlock
--yes` first (docs/ci.md), or the three plain Pulumi commands (docs/recovery.md). Then the step's
invariants, each a promise of docs/:

* ``force_delete``: no pod deleted with a grace period of 0 while its node was not fenced
  (docs/fencing.md: the out-of-service taint comes only after the host is proven stopped), read
  from the real API server's audit log (pod deletions, bindings, and every change of a Node object
  with the Node as it was after it). The kubelet's own final delete of a pod of its node is its
  confirmation that the pod stopped there, not a force-deletion.
* ``held_workload``: no pod made for a Deployment while its last recorded state (audit log) held
  it stopped; a workload a fence holds stopped (its Deployment's stop record) has 0 replicas
  and no running pod; one held as stale runs again only after `workload start --accept-stale-data`
  (docs/fencing.md, "Starting a workload the fence stopped"), one held as only-copy only after that
  or a lift of its fence.
* ``double_attach``: no Longhorn volume attached (VolumeAttachment `attached`) on two nodes, and no
  volume's filesystem mounted on two running hosts (the stand-in's CSI data path: a mount is a
  writer).
* ``node_per_worker``: one Node per worker of the stack, none of a worker removed or given up, no
  Node the stack does not know; no live bootstrap token made for a node that has joined
  (docs/recovery.md: "one Node per worker ... stale join tokens deleted").
* ``firewall``: every managed host firewall that can be reached reads back equal to the plan in
  the stack (no drift, no note), and each plan's node addresses are the current nodes' addresses
  (docs/network-and-firewalls.md).
* ``converges``: after healing, `up` succeeds, the next `up` changes nothing and a plain
  `pulumi preview --expect-no-changes` passes (docs/recovery.md, docs/changing-things.md).
* ``documented_retry``: after a command failed part-way (exit 1), what the CLI then says to run
  (docs/cli.md's exit codes) is not refused by the change the failed run kept in the stack file.
* ``no_process_left``: no process of the stack's runs is left a few seconds after a run ended or was
  killed (docs/recovery.md: "The killed run's provider processes do not outlive it").

A violation stops the run; the campaign then shrinks the schedule up to the failing step by
dropping steps (each try on a fresh lab) while the same invariant still fails, and prints the seed
and the shortest schedule, which `--replay` runs again (and a test can).

Not modelled here (yet): a pool's count (pools are Hetzner servers: the lab's hcloud stand-in is not
part of this cluster), a host's clock stepped (a lab host shares this machine's clock: stepping it
would step every other lab run's too).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from lab import pod_hosts
from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    STACK_BINARIES,
    CliRun,
    LabStack,
    base_config,
    k3s_release,
    kubernetes_plugins,
    lab_binaries_missing,
    run_cli,
    server_spec,
    worker_spec,
)
from lab.stack_processes import end_processes, processes_under
from node_operations.fence import MIN_DOWN_SECONDS
from node_operations.fence_workloads import stop_record
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from remote_access.kube import parse_token_ids

K3S = "/usr/local/bin/k3s"
PREFIX = "fc"
APP_LABEL = "campaign/app"
STORAGE = {
    "install_longhorn": True,
    "longhorn_chart": str(LONGHORN_STANDIN_CHART),
    "reserved_percent": 5,
    "minimal_available_percent": 5,
    # The workloads use both classes (hk3s-one-copy and hk3s-two-copies); a stack offers only one
    # copy unless it says two.
    "max_copies": 2,
}
# The audit policy: what the invariants read, at the level they need, nothing else (the kubelets'
# status updates are the subresource nodes/status and are not logged).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    verbs: [delete, deletecollection]
    resources: [{group: "", resources: [pods]}]
  - level: Request
    verbs: [create]
    resources: [{group: "", resources: [pods/binding]}]
  - level: RequestResponse
    verbs: [create, update, patch, delete]
    resources: [{group: "", resources: [nodes]}]
  - level: Request
    verbs: [create]
    resources: [{group: "", resources: [pods]}]
  - level: RequestResponse
    verbs: [create, update, patch]
    resources: [{group: "apps", resources: [deployments]}]
  - level: None
"""
AUDIT_POLICY_IN_HOST = "/etc/hk3s-lab/audit-policy.yaml"
AUDIT_LOG_IN_HOST = "/var/lib/rancher/k3s/server/logs/audit.log"
# `key+` appends to what config.yaml gives (a plain key in a drop-in replaces a list, as in k3s).
AUDIT_DROP_IN = f"""kube-apiserver-arg+:
  - audit-policy-file={AUDIT_POLICY_IN_HOST}
  - audit-log-path={AUDIT_LOG_IN_HOST}
  - audit-log-format=json
"""

OPERATIONS = ("add", "remove", "fence", "lift", "give_up", "reboot", "upgrade", "labels", "workload_start")
FAULTS = ("kill_run", "power_off", "link_cut", "link_lossy", "server_restart", "sshd_stop")
# The cheap ones: no fence (a fence waits the minute a Node must be NotReady), no power cycle.
CI_OPERATIONS = ("add", "remove", "labels", "reboot")
CI_FAULTS = ("kill_run", "server_restart", "sshd_stop", "link_lossy")
HEALS = ("hk3s_up", "unlock", "pulumi")
# Pulumi's own processes (its language host), not the program's: see `check_no_process_left`.
# ("pulumi-language-python" is cut to 15 characters in /proc/PID/comm.)
PULUMI_OWN = ("pulumi-language",)
# What a CLI command's refusal says when the change it is asked for is already in the stack file
# (kept there by the same command's earlier run that failed part-way).
OWN_CHANGE_REFUSED = ("is already a node of this stack", "there is no worker named")


class Violation(Exception):  # noqa: N818 (an invariant's finding, not an error of the campaign)
    """An invariant that does not hold: its name and what was found."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


@dataclass(frozen=True)
class Step:
    """One operation, its target chosen by `pick` among those it may take at run time, and at most
    one fault, injected when the run has printed its `at_line`-th line, on the host `fault_pick`
    chooses; `heal` is the documented recovery after a killed run."""

    op: str
    pick: int
    fault: str | None = None
    at_line: int = 0
    fault_pick: int = 0
    heal: str = "hk3s_up"
    variant: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_schedule(
    seed: int, faults: int, operations: tuple[str, ...] = OPERATIONS, kinds: tuple[str, ...] = FAULTS
) -> list[Step]:
    """A schedule holding `faults` faults (about one step in five without one), all drawn from `seed`."""
    rng = random.Random(seed)
    steps: list[Step] = []
    placed = 0
    while placed < faults:
        fault = rng.choice(kinds) if rng.random() < 0.8 else None
        steps.append(
            Step(
                op=rng.choice(operations),
                pick=rng.randrange(1000),
                fault=fault,
                at_line=rng.randint(1, 12),
                fault_pick=rng.randrange(1000),
                heal=rng.choice(HEALS),
                variant=rng.randrange(1000),
            )
        )
        placed += fault is not None
    return steps


@dataclass
class StepReport:
    index: int
    step: Step
    target: str | None = None
    skipped: str | None = None
    fault_fired: bool = False
    fault_host: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)  # Pulumi's own processes a killed run left
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        found["step"] = self.step.to_json()
        return found

    def line(self) -> str:
        fault = f" + {self.step.fault}@{self.step.at_line}" if self.step.fault else ""
        fired = (" (fired on " + str(self.fault_host) + ")") if self.fault_fired else (" (not fired)" if fault else "")
        runs = ", ".join(f"{r['command']}={r['exit']}{'/killed' if r['killed'] else ''}" for r in self.runs)
        verdicts = " ".join(f"{k}={v}" for k, v in self.verdicts.items())
        what = f"skipped: {self.skipped}" if self.skipped else f"[{runs}] {verdicts}"
        return f"step {self.index} {self.step.op}({self.target or '-'}){fault}{fired} {self.seconds:.0f}s: {what}"


def wait_for(what: str, check: Callable[[], bool], timeout: float, diagnose: Callable[[], str] | None = None) -> None:
    """Wait until `check` holds; past `timeout`, fail naming `what` and what `diagnose` reads."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            seen = ""
            if diagnose is not None:
                try:
                    seen = "\n" + diagnose()
                except Exception as error:  # the reading is for the report only
                    seen = f"\n(reading what was there failed: {error})"
            raise TimeoutError(f"{what}: not within {timeout:.0f} s{seen}")
        time.sleep(1)


@dataclass
class Cluster:
    """The campaign's lab cluster and what the campaign knows of it."""

    lab: Lab
    stack: LabStack
    server: Host
    hosts: dict[str, Host]
    image: str
    ever_joined: set[str] = field(default_factory=set)
    given_up: set[str] = field(default_factory=set)  # their hosts stay as the fence left them: not reused
    consented: set[str] = field(default_factory=set)  # workloads started with --accept-stale-data
    lifted: set[str] = field(default_factory=set)  # workers whose fence was lifted
    held_seen: dict[str, tuple[str, str]] = field(default_factory=dict)  # workload -> (reason, fenced node)
    upgraded: bool = False
    audit_offset: int = 0
    audit_nodes: dict[str, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    audit_deleted_nodes: dict[str, str] = field(default_factory=dict)
    pod_nodes: dict[str, str] = field(default_factory=dict)
    sampled: list[str] = field(default_factory=list)  # double mounts seen while a run went on
    audit_held: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)  # workload -> (when, held)
    audit_held_problems: list[str] = field(default_factory=list)
    log: Callable[[str], None] = print

    # --- reading ---------------------------------------------------------------------------
    def kubectl(self, *args: str, timeout: float = 60) -> str:
        return self.server.run([K3S, "kubectl", *args], timeout=timeout).stdout

    def get(self, *args: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return found

    def config(self) -> dict[str, Any]:
        # Read as Pulumi reads the file (YAML 1.2: an unquoted `yes` is a string, as the program's
        # own `node add` writes a label value). PyYAML reads YAML 1.1, where it is a boolean.
        document = YAML(typ="safe", pure=True).load((self.stack.project / f"Pulumi.{self.stack.name}.yaml").read_text())
        return {key.removeprefix("hk3s:"): value for key, value in document["config"].items()}

    def workers(self) -> list[str]:
        """The stack file's workers."""
        return [w["name"] for w in self.config().get("workers") or []]

    def fenced(self) -> list[str]:
        """Workers of the stack file it fences (hk3s:fences; a given-up worker's entry stays, with
        force_remove, after the worker left hk3s:workers)."""
        workers = self.workers()
        return sorted(name for name in self.config().get("fences") or {} if name in workers)

    def joined(self) -> list[str]:
        """Workers of the stack file that are not fenced."""
        fenced = self.fenced()
        return [w for w in self.workers() if w not in fenced]

    @property
    def removed(self) -> set[str]:
        """Workers that joined once and are no longer in the stack file."""
        return self.ever_joined - set(self.workers())

    @property
    def spares(self) -> list[str]:
        """Hosts `node add` may join: never joined, or removed (a removal wipes the host)."""
        return sorted(set(self.hosts) - set(self.workers()) - self.given_up)

    def node_ready(self, name: str) -> bool:
        node = self.get("node", name)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def seconds_not_ready(self, name: str) -> float:
        node = self.get("node", name)
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        if ready["status"] == "True":
            return 0.0
        since = self.server.run(["date", "-u", "-d", ready["lastTransitionTime"], "+%s"]).stdout.strip()
        return float(int(self.server.run(["date", "-u", "+%s"]).stdout.strip()) - int(since))

    # --- running ---------------------------------------------------------------------------
    def run(self, report: StepReport, argv: list[str], fault: Callable[[str], bool] | None = None) -> CliRun:
        """One command as a user runs it: `scripts/hk3s ...`, or `pulumi ...` when argv starts with
        "pulumi"; `fault` sees each line (True: SIGKILL the run). Afterwards no process of the
        stack may be left (a few seconds' grace: providers end within a second of their engine)."""
        started = time.monotonic()
        with self.sampling():
            if argv[0] == "pulumi":
                result = run_cli(self.stack, argv[1:], timeout=900, on_line=fault)
            else:
                result = self.stack.hk3s(*argv, timeout=900, on_line=fault)
        report.runs.append(
            {
                "command": " ".join(argv[:3]),
                "exit": result.returncode,
                "killed": result.killed,
                "seconds": round(time.monotonic() - started, 1),
                "tail": (result.stderr or result.output)[-1500:] if result.returncode else "",
            }
        )
        self.check_no_process_left(report)
        return result

    def check_no_process_left(self, report: StepReport) -> None:
        deadline = time.monotonic() + 8
        while (left := processes_under(self.stack.directory)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not left:
            return
        end_processes(left)
        # Pulumi's own language host outlives an engine that was SIGKILLed (it has no watch on its
        # engine: pulumi/pulumi#263, #8696): Pulumi's, not the program's; recorded and ended.
        ours = [p for p in left if not p.name.startswith(PULUMI_OWN)]
        report.leftovers += [str(p) for p in left if p.name.startswith(PULUMI_OWN)]
        if ours:
            raise Violation("no_process_left", "; ".join(str(p) for p in ours))

    # --- invariants ------------------------------------------------------------------------
    def check_all(self, report: StepReport) -> None:
        for name, check in (
            ("force_delete", self.check_force_deletes),
            ("held_workload", self.check_held),
            ("double_attach", self.check_attachments),
            ("node_per_worker", self.check_nodes),
            ("firewall", self.check_firewalls),
        ):
            check()
            report.verdicts[name] = "ok"

    def _node_fenced_at(self, node: str, when: str) -> bool:
        """Whether the last record of `node` in the audit log before `when` shows a completed fence."""
        before = [obj for stamp, obj in self.audit_nodes.get(node, []) if stamp <= when]
        if not before:
            return False
        last = before[-1]
        taints = {t.get("key") for t in (last.get("spec") or {}).get("taints") or []}
        annotations = (last.get("metadata") or {}).get("annotations") or {}
        return OUT_OF_SERVICE_TAINT in taints and FENCE_ANNOTATION in annotations

    def check_force_deletes(self) -> None:
        path = self.server.root / AUDIT_LOG_IN_HOST.lstrip("/")
        if not path.exists():
            raise Violation("force_delete", f"no audit log at {AUDIT_LOG_IN_HOST} on {self.server.name}")
        with open(path, "rb") as handle:
            handle.seek(self.audit_offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self.audit_offset += end
        found: list[str] = []
        events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        events.sort(key=lambda e: e.get("stageTimestamp", ""))
        for event in events:
            if event.get("stage") != "ResponseComplete" or (event.get("responseStatus") or {}).get("code", 0) >= 300:
                continue
            ref = event.get("objectRef") or {}
            stamp = event.get("stageTimestamp", "")
            if ref.get("resource") == "nodes" and not ref.get("subresource"):
                if event["verb"] == "delete":
                    self.audit_deleted_nodes.setdefault(ref.get("name", ""), stamp)
                elif isinstance(event.get("responseObject"), dict):
                    name = event["responseObject"]["metadata"]["name"]
                    self.audit_nodes.setdefault(name, []).append((stamp, event["responseObject"]))
                    self.audit_deleted_nodes.pop(name, None)
            elif ref.get("resource") == "pods" and ref.get("subresource") == "binding":
                target = (event.get("requestObject") or {}).get("target") or {}
                self.pod_nodes[f"{ref.get('namespace')}/{ref.get('name')}"] = target.get("name", "")
            elif ref.get("resource") == "pods" and event["verb"] == "delete":
                found += self._judge_delete(event, ref, stamp)
            elif ref.get("resource") == "pods" and event["verb"] == "create" and not ref.get("subresource"):
                self._judge_create(event, ref, stamp)
            elif ref.get("resource") == "deployments" and isinstance(event.get("responseObject"), dict):
                obj = event["responseObject"]
                name = f"{obj['metadata'].get('namespace')}/Deployment/{obj['metadata']['name']}"
                self.audit_held.setdefault(name, []).append((stamp, stop_record(obj) is not None))
        if found:
            raise Violation("force_delete", "\n".join(found))

    def _judge_create(self, event: dict[str, Any], ref: dict[str, Any], stamp: str) -> None:
        """A pod made for a Deployment (through its ReplicaSet, named `<deployment>-<hash>`) while
        the Deployment's last recorded state held it stopped."""
        metadata = (event.get("requestObject") or {}).get("metadata") or {}
        for owner in metadata.get("ownerReferences") or []:
            if owner.get("kind") != "ReplicaSet":
                continue
            workload = f"{ref.get('namespace')}/Deployment/{owner['name'].rsplit('-', 1)[0]}"
            before = [held for when, held in self.audit_held.get(workload, []) if when <= stamp]
            if before and before[-1]:
                name = metadata.get("name") or metadata.get("generateName", "")
                self.audit_held_problems.append(f"a pod {name} of {workload} created at {stamp} while held stopped")

    def _judge_delete(self, event: dict[str, Any], ref: dict[str, Any], stamp: str) -> list[str]:
        options = event.get("requestObject") or {}
        grace = options.get("gracePeriodSeconds")
        if grace is None and "gracePeriodSeconds=0" in event.get("requestURI", ""):
            grace = 0
        if grace != 0:
            return []
        pod = f"{ref.get('namespace')}/{ref.get('name')}"
        body = event.get("responseObject") or {}
        node = ((body.get("spec") or {}).get("nodeName")) or self.pod_nodes.get(pod, "")
        user = (event.get("user") or {}).get("username", "")
        if not node or user == f"system:node:{node}":
            return []  # never on a node, or the kubelet confirming the pod stopped on its own node
        if self._node_fenced_at(node, stamp):
            return []
        deleted = self.audit_deleted_nodes.get(node)
        if deleted is not None and deleted <= stamp:
            return []  # the pod garbage collector's orphan: its Node was deleted (removed, given up)
        return [f"pod {pod} on {node} deleted with grace 0 by {user} at {stamp}; {node} was not fenced"]

    def check_held(self) -> None:
        problems, self.audit_held_problems = self.audit_held_problems, []
        for deployment in self.get("deployments", "-n", "default")["items"]:
            name = f"default/Deployment/{deployment['metadata']['name']}"
            record = stop_record(deployment)
            replicas = deployment["spec"].get("replicas", 1)
            if record is not None:
                reason = str(record.get("reason", ""))
                self.held_seen[name] = (reason, str(record.get("node", "")))
                if replicas:
                    problems.append(f"{name} is held stopped ({reason}) and has {replicas} replicas")
                selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

                def running(selector: str = selector) -> list[str]:
                    pods = self.get("pods", "-n", "default", "-l", selector)["items"]
                    return [
                        p["metadata"]["name"]
                        for p in pods
                        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                    ]

                # At 0 replicas its ReplicaSet deletes what runs; a pod running after that is one started.
                with contextlib.suppress(TimeoutError):
                    wait_for(f"{name}'s pods gone", lambda r=running: not r(), 30)  # type: ignore[misc]
                if left := running():
                    problems.append(f"{name} is held stopped ({reason}) and runs pods {left}")
                continue
            if name in self.held_seen and replicas:
                reason, fenced = self.held_seen[name]
                # Only a lift of the fence that held it starts a workload whose only copy is there.
                allowed = name in self.consented or (reason != "stale" and fenced in self.lifted)
                if not allowed:
                    problems.append(f"{name} was held ({reason}) and runs again without consent or a lift")
                self.held_seen.pop(name)
        if problems:
            raise Violation("held_workload", "; ".join(problems))

    def check_attachments(self) -> None:
        attached: dict[str, list[str]] = {}
        for item in self.get("volumeattachments")["items"]:
            if (item.get("status") or {}).get("attached"):
                pv = item["spec"]["source"].get("persistentVolumeName", "")
                attached.setdefault(pv, []).append(item["spec"]["nodeName"])
        problems = [f"{pv} attached on {nodes}" for pv, nodes in attached.items() if len(nodes) > 1]
        problems += self.double_mounts() + self.sampled
        self.sampled = []
        if problems:
            raise Violation("double_attach", "; ".join(problems))

    def double_mounts(self) -> list[str]:
        """Each volume whose filesystem (the stand-in's CSI data path) is mounted on two running hosts."""
        mounted: dict[str, list[str]] = {}
        for name, host in list(self.hosts.items()):
            if not host.is_running:
                continue
            with contextlib.suppress(Exception):
                out = host.run(["cat", "/proc/self/mountinfo"], check=False, timeout=20).stdout
                for volume in {part.split("/")[0] for part in out.split("lab-csi/")[1:]}:
                    mounted.setdefault(volume, []).append(name)
        return [f"{volume} mounted on {hosts}" for volume, hosts in mounted.items() if len(hosts) > 1]

    @contextlib.contextmanager
    def sampling(self) -> Iterator[None]:
        """While a run goes on, the mounts read every few seconds: a volume mounted on two hosts
        for a while during a run is as bad as after it."""
        done = threading.Event()

        def sample() -> None:
            while not done.wait(3):
                found = self.double_mounts()
                if found and not self.sampled:
                    self.sampled = [f"during a run: {problem}" for problem in found]

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=30)

    def check_nodes(self) -> None:
        nodes = {n["metadata"]["name"] for n in self.get("nodes")["items"]}
        wanted = {self.server.name, *self.workers()}
        problems = []
        if nodes != wanted:
            problems.append(f"Nodes {sorted(nodes)} != the stack's {sorted(wanted)}")
        if nodes & self.removed:
            problems.append(f"Nodes of removed workers: {sorted(nodes & self.removed)}")
        live = {token: node for token, node in live_tokens(self.kubectl(*TOKENS)).items() if node in nodes}
        if live:
            problems.append(f"bootstrap tokens of joined nodes still live: {live}")
        if problems:
            raise Violation("node_per_worker", "; ".join(problems))

    def check_firewalls(self) -> None:
        import asyncio  # noqa: PLC0415

        from node_operations.host_firewall.apply import read_node_firewall  # noqa: PLC0415
        from operator_api.deployment import Deployment  # noqa: PLC0415
        from providers.host_firewall import firewall_plan  # noqa: PLC0415

        deployment = Deployment.export(self.stack.stack())
        targets = {t.node: t for t in deployment.host_targets(self.lab.ssh_private_key_path.read_text(), "root")}
        addresses = {str(self.server.public_ip)} | {str(self.hosts[w].public_ip) for w in self.workers()}
        problems = []
        for resource in deployment.resources:
            if not str(resource.get("type", "")).endswith(":HostFirewall"):
                continue
            inputs = resource.get("inputs") or {}
            plan = firewall_plan(inputs)
            if set(plan.node_addresses) != addresses:
                problems.append(
                    f"{plan.node}'s plan names {sorted(plan.node_addresses)}, nodes are {sorted(addresses)}"
                )
            host = self.hosts.get(plan.node) or (self.server if plan.node == self.server.name else None)
            if plan.node in self.fenced() or host is None or not host.is_running or plan.node not in targets:
                continue
            observed = asyncio.run(read_node_firewall(targets[plan.node], plan))
            spelt, wanted = port_sources(observed.rules), port_sources(plan.rules)
            if not observed.present or observed.notes or spelt != wanted:
                problems.append(
                    f"{plan.node}: present={observed.present} notes={observed.notes} "
                    f"differs: {sorted(set(spelt.items()) ^ set(wanted.items()))}"
                )
        if problems:
            raise Violation("firewall", "; ".join(problems))

    def converge(self, report: StepReport) -> None:
        """`up` succeeds, the next `up` changes nothing, and a plain preview shows no change."""
        for attempt in range(2):
            first = self.run(report, ["--json", "up", "--yes"])
            if first.returncode == 0:
                break
            if attempt == 1:
                raise Violation("converges", f"up after healing failed: {(first.stderr or first.output)[-3000:]}")
        again = self.run(report, ["--json", "up", "--yes"])
        if again.returncode != 0:
            raise Violation("converges", f"the second up failed: {(again.stderr or again.output)[-3000:]}")
        summary = json.loads(again.stdout).get("summary") or {}
        if set(summary) - {"same"}:
            raise Violation("converges", f"the up after a converged up changed {summary}")
        preview = self.run(report, ["pulumi", "preview", "--expect-no-changes", "--diff"])
        if preview.returncode != 0:
            raise Violation("converges", f"plain pulumi preview shows changes: {preview.output[-3000:]}")
        report.verdicts["converges"] = "ok"


def live_tokens(out: str) -> dict[str, str]:
    """Bootstrap token id -> the node it was made for (its description), of the tokens not expired."""
    import base64  # noqa: PLC0415
    from datetime import UTC, datetime  # noqa: PLC0415

    found = {}
    now = datetime.now(UTC)
    names = parse_token_ids(out)
    for item in json.loads(out).get("items", []):
        token = item["metadata"]["name"].removeprefix("bootstrap-token-")
        expiration = base64.b64decode((item.get("data") or {}).get("expiration", "")).decode()
        if not expiration or datetime.fromisoformat(expiration.replace("Z", "+00:00")) > now:
            found[token] = names.get(token, "")
    return found


def port_sources(rules: Any) -> dict[tuple[str, str], tuple[str, ...]]:
    """(port, protocol) -> every source any rule allows for it: what a firewall enforces, whatever
    the rules' split or purposes."""
    found: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        found.setdefault((str(rule.port), str(rule.protocol)), set()).update(rule.sources)
    return {key: tuple(sorted(value)) for key, value in found.items()}


TOKENS = ("get", "secrets", "-n", "kube-system", "--field-selector", "type=bootstrap.kubernetes.io/token", "-o", "json")


class Fault:
    """A fault injected into a run at its n-th line (in a thread, so the run goes on meanwhile),
    and its healing."""

    def __init__(self, cluster: Cluster, step: Step, report: StepReport, target: str | None) -> None:
        self.cluster, self.step, self.report = cluster, step, report
        self.lines = 0
        self.fired = False
        self.thread: threading.Thread | None = None
        self.was_ready = False
        running = [n for n, h in cluster.hosts.items() if h.is_running and n in [*cluster.joined(), target]]
        candidates = sorted({n for n in running if n})
        self.host: Host | None = None
        if step.fault == "server_restart":
            self.host = cluster.server
        elif candidates:
            # The operation's own host more often than not; else another worker.
            name = (
                target
                if target in candidates and step.fault_pick % 3
                else candidates[step.fault_pick % len(candidates)]
            )
            self.host = cluster.hosts[name]

    def __call__(self, line: str) -> bool:
        if self.step.fault is None or self.fired:
            return False
        self.lines += 1
        if self.lines < self.step.at_line:
            return False
        self.fired = True
        self.report.fault_fired = True
        self.report.fault_host = self.host.name if self.host else None
        if self.step.fault == "kill_run":
            self.report.fault_host = "the run"
            return True
        if self.host is None:
            return False
        self.thread = threading.Thread(target=self.inject, daemon=True)
        self.thread.start()
        return False

    def inject(self) -> None:
        host = self.host
        assert host is not None
        with contextlib.suppress(Exception):
            self.was_ready = host is not self.cluster.server and self.cluster.node_ready(host.name)
        with contextlib.suppress(Exception):
            if self.step.fault == "power_off":
                host.power_off()
            elif self.step.fault == "link_cut":
                host.link_down("public")
            elif self.step.fault == "link_lossy":
                host.netem(delay_ms=40, loss_pct=20)
            elif self.step.fault == "server_restart":
                host.run(["systemctl", "restart", "k3s"], timeout=120)
            elif self.step.fault == "sshd_stop":
                host.run(["systemctl", "stop", "ssh.service"], timeout=30)

    def heal(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=180)
        host = self.host
        if not self.fired or host is None or self.step.fault == "kill_run":
            return
        if self.step.fault == "power_off":
            host.power_on(wait=True)
        elif self.step.fault == "link_cut":
            host.link_up("public")
        elif self.step.fault == "link_lossy":
            host.clear_netem()
        elif self.step.fault == "sshd_stop":
            host.run(["systemctl", "start", "ssh.service"], timeout=30)
        if self.was_ready and host.name in self.cluster.joined():
            wait_for(f"{host.name} Ready again", lambda: self.cluster.node_ready(host.name), 180)
        wait_for("the API answers", lambda: bool(self.cluster.kubectl("get", "--raw", "/readyz")), 180)


def pick(items: list[str], index: int) -> str | None:
    return sorted(items)[index % len(items)] if items else None


class Campaign:
    """Runs a schedule on a fresh cluster; `run` returns the reports and the first violation."""

    def __init__(
        self,
        lab: Lab,
        scratch: Path,
        workers: int,
        spares: int,
        log: Callable[[str], None] = print,
        *,
        pods: bool = True,
    ) -> None:
        self.lab, self.scratch, self.log = lab, scratch, log
        self.cluster = build_cluster(lab, scratch, workers, spares, log, pods=pods)

    def run(
        self, schedule: list[Step], on_step: Callable[[list[StepReport]], None] | None = None
    ) -> tuple[list[StepReport], Violation | None]:
        """Runs the schedule until its end or the first violation; `on_step` is given the reports
        so far after every step that ended without one."""
        reports: list[StepReport] = []
        for index, step in enumerate(schedule):
            report = StepReport(index, step)
            reports.append(report)
            started = time.monotonic()
            try:
                self.step(step, report)
                self.cluster.ever_joined |= set(self.cluster.workers())
                if report.skipped is None:
                    self.cluster.converge(report)
                self.cluster.check_all(report)
            except Violation as violation:
                report.verdicts[violation.invariant] = "VIOLATED"
                report.seconds = time.monotonic() - started
                self.log(report.line())
                return reports, violation
            except Exception as error:  # a step that could not be carried out is a finding too
                report.verdicts["campaign"] = f"error: {error!r}"[:2000]
                report.seconds = time.monotonic() - started
                self.log(report.line())
                return reports, Violation("campaign_error", f"{error!r}"[:4000])
            report.seconds = time.monotonic() - started
            self.log(report.line())
            if on_step is not None:
                on_step(reports)
        return reports, None

    def step(self, step: Step, report: StepReport) -> None:
        c = self.cluster
        joined = c.joined()
        if step.op == "add":
            report.target = pick(c.spares, step.pick)
            if report.target is None:
                report.skipped = "no spare host"
                return
            host = c.hosts[report.target]
            argv = ["node", "add", host.name, "--address", str(host.public_ip), "--label", f"{APP_LABEL}=yes"]
            self.attempt(step, report, argv, in_file=lambda: host.name in c.workers())
        elif step.op == "remove":
            report.target = pick(joined, step.pick)
            if report.target is None or len(joined) <= 2:
                report.skipped = "two workers are kept joined"
                return
            gone = report.target
            self.attempt(step, report, ["node", "remove", gone, "--yes"], in_file=lambda: gone not in c.workers())
        elif step.op == "fence":
            self.fence(step, report)
        elif step.op == "lift":
            report.target = pick(c.fenced(), step.pick)
            if report.target is None:
                report.skipped = "no fenced worker"
                return
            c.hosts[report.target].power_on(wait=True)
            lifted = report.target
            self.attempt(step, report, ["node", "unfence", lifted], in_file=lambda: lifted not in c.fenced())
            if report.target not in c.fenced():
                c.lifted.add(report.target)
        elif step.op == "give_up":
            report.target = pick(c.fenced(), step.pick)
            if report.target is None:
                report.skipped = "no fenced worker"
                return
            c.given_up.add(report.target)
            given = report.target
            argv = ["node", "remove", given, "--force", "--yes"]
            self.attempt(step, report, argv, in_file=lambda: given not in c.workers())
            if report.target in c.workers():
                c.given_up.discard(report.target)
        elif step.op == "reboot":
            report.target = pick(joined, step.pick)
            if report.target is None:
                report.skipped = "no joined worker"
                return
            self.attempt(step, report, ["node", "reboot", report.target])
        elif step.op == "upgrade":
            if c.upgraded:
                report.skipped = "already on the patch release"
                return
            report.target = "cluster"
            self.edit_and_up(step, report, lambda config: config["cluster"].update(k3s_release("k3s-patch")))
            c.upgraded = True
        elif step.op == "labels":
            report.target = pick(joined, step.pick)
            if report.target is None:
                report.skipped = "no joined worker"
                return

            def relabel(config: dict[str, Any]) -> None:
                entry = next(w for w in config["workers"] if w["name"] == report.target)
                entry["labels"] = {**(entry.get("labels") or {}), "campaign/tier": f"t{step.variant % 3}"}

            self.edit_and_up(step, report, relabel)
        elif step.op == "workload_start":
            held = sorted(c.held_seen)
            if not held:
                report.skipped = "no held workload"
                return
            report.target = held[step.pick % len(held)]
            first = self.attempt(step, report, ["workload", "start", report.target, "--yes"], retry=False)
            if first.returncode == 3 and "--accept-stale-data" in (first.stderr + first.output):
                c.consented.add(report.target)
                self.attempt(step, report, ["workload", "start", report.target, "--accept-stale-data", "--yes"])
        else:
            raise ValueError(f"unknown operation {step.op}")

    def attempt(
        self,
        step: Step,
        report: StepReport,
        argv: list[str],
        retry: bool = True,
        in_file: Callable[[], bool] | None = None,
    ) -> CliRun:
        """The command with the step's fault in it, the fault healed, then the documented retry;
        `in_file` tells whether the command's change is in the stack file (a killed run may have
        written it or not)."""
        c = self.cluster
        fault = Fault(c, step, report, report.target)
        result = c.run(report, argv, fault)
        fault.heal()
        if not retry:
            return result
        if result.killed or result.returncode == 4:
            # A killed run: finished as docs/recovery.md says; the command again only when the
            # killed run had not yet written its change into the stack file.
            self.recover_killed(step, report)
            if in_file is not None and in_file():
                return result
            return c.run(report, argv)
        if result.returncode == 1:
            # Failed part-way: fix the cause (the fault healed) and do what the CLI says (docs/cli.md,
            # exit 1): `up` where it names it, else the same command again.
            hint = (result.stderr + result.output)[-600:]
            way_on = ["up", "--yes"] if "up --yes" in hint else argv
            again = c.run(report, way_on)
            said = again.stderr + again.output
            if again.returncode == 3 and any(text in said for text in OWN_CHANGE_REFUSED):
                raise Violation(
                    "documented_retry",
                    f"`{' '.join(argv)}` failed part-way (exit 1) saying {hint!r}; `{' '.join(way_on)}` "
                    f"is then refused by the change the first run kept: {said[-1500:]}",
                )
            return again
        return result

    def recover_killed(self, step: Step, report: StepReport) -> None:
        """After a killed run, one of the ways docs/ say: `scripts/hk3s up --yes` (docs/recovery.md),
        `scripts/hk3s unlock --yes` first (docs/ci.md), or the three plain Pulumi commands
        (docs/recovery.md)."""
        c = self.cluster
        if step.heal == "pulumi":
            c.run(report, ["pulumi", "cancel", "--yes"])
            c.run(report, ["pulumi", "refresh", "--run-program", "--clear-pending-creates", "--yes", "--skip-preview"])
            c.run(report, ["pulumi", "up", "--yes", "--skip-preview"])
            return
        if step.heal == "unlock":
            c.run(report, ["unlock", "--yes"])
        c.run(report, ["up", "--yes"])

    def edit_and_up(self, step: Step, report: StepReport, edit: Callable[[dict[str, Any]], None]) -> None:
        """A stack-file edit and a plain `pulumi up`, as docs/changing-things.md shows."""
        c = self.cluster
        config = c.config()
        edit(config)
        c.stack.write_config(config)
        fault = Fault(c, step, report, report.target if report.target in c.hosts else None)
        result = c.run(report, ["pulumi", "up", "--yes", "--skip-preview"], fault)
        fault.heal()
        if result.killed:
            self.recover_killed(step, report)
        elif result.returncode != 0:
            c.run(report, ["pulumi", "up", "--yes", "--skip-preview"])

    def fence(self, step: Step, report: StepReport) -> None:
        """A worker goes down (its agent stopped, its containers running on; or powered off), is
        NotReady the minute a fence asks for, and is fenced (`node fence`, `--powered-off` when it
        is off)."""
        c = self.cluster
        joined = c.joined()
        report.target = pick(joined, step.pick)
        if report.target is None or len(joined) <= 1:
            report.skipped = "one worker is kept joined"
            return
        host = c.hosts[report.target]
        how = "powered_off" if step.variant % 2 else "agent_stopped"
        if how == "powered_off":
            host.power_off()
        else:
            host.run(["systemctl", "stop", "k3s-agent"])
        wait_for(f"{host.name} NotReady", lambda: not c.node_ready(host.name), 180)
        wait_for(f"{host.name} NotReady a minute", lambda: c.seconds_not_ready(host.name) >= MIN_DOWN_SECONDS + 2, 180)
        argv = ["node", "fence", host.name] + (["--powered-off"] if how == "powered_off" else [])
        self.attempt(step, report, argv, in_file=lambda: host.name in c.fenced())
        if host.name in c.fenced():
            return
        # Refused or failed for good: the worker comes back as it was (recorded in the report).
        if how == "powered_off":
            host.power_on(wait=True)
        else:
            host.run(["systemctl", "start", "k3s-agent"])


def workload_objects(image: str, count: int) -> list[dict[str, Any]]:
    """`count` Deployments, each writing into its own Longhorn volume (two copies, one for the last)."""
    objects: list[dict[str, Any]] = []
    for index in range(count):
        name = f"app-{index}"
        storage_class = "hk3s-one-copy" if index == count - 1 else "hk3s-two-copies"
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": "16Mi"}},
                },
            }
        )
        labels = {"app": name}
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {
                    "replicas": 1,
                    "strategy": {"type": "Recreate"},
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": {APP_LABEL: "yes"},
                            "terminationGracePeriodSeconds": 1,
                            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
                            "containers": [
                                {
                                    "name": "app",
                                    "image": image,
                                    "imagePullPolicy": "Never",
                                    "command": [
                                        "sh",
                                        "-c",
                                        "while true; do date >> /data/written-by; sync; sleep 2; done",
                                    ],
                                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                                }
                            ],
                        },
                    },
                },
            }
        )
    return objects


def build_cluster(
    lab: Lab, scratch: Path, workers: int, spares: int, log: Callable[[str], None], *, pods: bool = True
) -> Cluster:
    """The server (auditing on), `workers` joined pod-capable workers, `spares` booted ones, Longhorn's
    stand-in, the workloads Running. Without `pods`: plain workers, no Longhorn, no workload (what
    needs no pod runtime and no Kubernetes provider: the operations and the invariants of nodes,
    firewalls, runs and the audit log)."""
    started = time.monotonic()
    server = lab.add_host(server_spec(f"{PREFIX}-srv"))
    hosts = {
        f"{PREFIX}-w{i}": lab.add_host(worker_spec(f"{PREFIX}-w{i}", pods=pods)) for i in range(1, workers + spares + 1)
    }
    lab.wait_ssh_ready([server, *hosts.values()])
    for host in hosts.values() if pods else ():  # before k3s is installed, as k3s's air-gap instructions say
        pod_hosts.place_airgap_images(host.root, DEFAULT_CACHE_DIR)
    # Auditing on, as a k3s operator turns it on: a config drop-in before k3s is installed.
    (server.root / AUDIT_POLICY_IN_HOST.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (server.root / AUDIT_POLICY_IN_HOST.lstrip("/")).write_text(AUDIT_POLICY)
    drop_ins = server.root / "etc/rancher/k3s/config.yaml.d"
    drop_ins.mkdir(parents=True, exist_ok=True)
    (drop_ins / "90-lab-audit.yaml").write_text(AUDIT_DROP_IN)
    stack = LabStack(scratch / "stack")
    names = sorted(hosts)
    joined = [hosts[n] for n in names[:workers]]
    storage = STORAGE if pods else {"install_longhorn": False}
    config = base_config(lab, server, joined, storage=storage, firewall={"managed": True})
    for entry in config["workers"]:
        entry["labels"] = {APP_LABEL: "yes"}
    stack.write_config(config)
    stack.log.clear()
    try:
        stack.up()
    except Exception as error:
        raise RuntimeError(f"the first up failed:\n{stack.text()[-6000:]}") from error
    cluster = Cluster(lab, stack, server, hosts, pod_hosts.busybox_image() if pods else "", log=log)
    cluster.ever_joined = set(cluster.workers())
    if not pods:
        log(f"cluster ready in {time.monotonic() - started:.0f} s (plain workers): {names}")
        return cluster
    nodes = {server.name, *(h.name for h in joined)}
    wait_for(
        "a Longhorn node per node",
        lambda: {n["metadata"]["name"] for n in cluster.get("nodes.longhorn.io", "-A")["items"]} == nodes,
        180,
    )
    for name in nodes:
        body = json.dumps({"spec": {"allowScheduling": True}})
        cluster.kubectl("patch", "nodes.longhorn.io", name, "-n", "longhorn-system", "--type", "merge", "-p", body)
    for host in joined:
        wait_for(
            f"{host.name} imports the air-gap images",
            lambda h=host: cluster.image in h.run([K3S, "ctr", "images", "ls", "-q"]).stdout,  # type: ignore[misc]
            120,
        )
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": workload_objects(cluster.image, 3)})
    (server.root / "root/apps.json").write_text(text)
    cluster.kubectl("apply", "-f", "/root/apps.json")

    def running() -> int:
        pods = cluster.get("pods", "-n", "default")["items"]
        return sum(p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp") for p in pods)

    def pods_and_events() -> str:
        return "\n".join(
            (
                cluster.kubectl("get", "pods", "-A", "-o", "wide"),
                cluster.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp")[-4000:],
                cluster.kubectl("get", "volumes.longhorn.io,volumeattachments", "-A", "-o", "wide"),
            )
        )

    wait_for("the workloads Running", lambda: running() == 3, 300, diagnose=pods_and_events)
    log(
        f"cluster ready in {time.monotonic() - started:.0f} s: {server.name}, "
        f"workers {names[:workers]}, spares {names[workers:]}"
    )
    return cluster


def shrink(
    schedule: list[Step],
    violation: Violation,
    replay: Callable[[list[Step]], Violation | None],
    log: Callable[[str], None],
) -> list[Step]:
    """The shortest schedule found by dropping steps that still shows the same invariant violated:
    runs of steps first (halves, quarters, ...: a long schedule shrinks in few tries), then single
    steps; the failing step itself always stays last. Each try is a run on a fresh cluster."""
    current = list(schedule)
    size = max(1, (len(current) - 1) // 2)
    while True:
        start = len(current) - 1 - size
        while start >= 0:
            candidate = current[:start] + current[start + size :]
            found = replay(candidate)
            same = found is not None and found.invariant == violation.invariant
            dropped = ", ".join(step.op for step in current[start : start + size])
            log(f"shrink: without steps {start}..{start + size - 1} ({dropped}): {'still' if same else 'gone'}")
            if same:
                current = candidate
            start -= size
            start = min(start, len(current) - 1 - size)
        if size == 1:
            return current
        size = max(1, size // 2)


def missing() -> list[str]:
    found = lab_binaries_missing([*STACK_BINARIES, "k3s-patch"])
    if not kubernetes_plugins():
        found.append("the Kubernetes provider plugin")
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    return found + ([reason] if reason else [])


@contextlib.contextmanager
def fresh_campaign(workers: int, spares: int, log: Callable[[str], None], *, pods: bool = True) -> Iterator[Campaign]:
    with tempfile.TemporaryDirectory(prefix="bench-campaign-") as scratch, Lab(DEFAULT_CACHE_DIR) as lab:
        yield Campaign(lab, Path(scratch), workers, spares, log, pods=pods)


def run_campaign(
    schedule: list[Step],
    workers: int,
    spares: int,
    log: Callable[[str], None] = print,
    *,
    pods: bool = True,
    on_step: Callable[[list[StepReport]], None] | None = None,
) -> tuple[list[StepReport], Violation | None]:
    with fresh_campaign(workers, spares, log, pods=pods) as campaign:
        return campaign.run(schedule, on_step)


def write_partial(out: Path, seed: int | None, schedule: list[Step], reports: list[StepReport], started: float) -> None:
    """The result so far, written whole (aside, then renamed) after each step: a long run cut off
    (a session's end, a machine going away) keeps every step it finished, marked unfinished."""
    result = summary(seed, schedule, reports, time.monotonic() - started)
    result["reports"] = [r.to_json() for r in reports]
    result["violation"] = None
    result["finished"] = False
    partial = out.with_name(f".{out.name}.partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(partial, out)


def summary(seed: int | None, schedule: list[Step], reports: list[StepReport], seconds: float) -> dict[str, Any]:
    fired: dict[str, int] = {}
    ops: dict[str, int] = {}
    for report in reports:
        if report.skipped is None:
            ops[report.step.op] = ops.get(report.step.op, 0) + 1
        if report.fault_fired and report.step.fault:
            fired[report.step.fault] = fired.get(report.step.fault, 0) + 1
    return {
        "seed": seed,
        "steps": len(reports),
        "steps_planned": len(schedule),
        "operations": ops,
        "faults_fired": fired,
        "faults_planned": sum(s.fault is not None for s in schedule),
        "pulumi_language_hosts_left_by_a_kill": sum(len(r.leftovers) for r in reports),
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=10, help="faults in the schedule")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4, help="workers joined at the start")
    parser.add_argument("--spares", type=int, default=1, help="hosts booted for `node add`")
    parser.add_argument("--ci", action="store_true", help="the cheap operations and faults only (no fence)")
    parser.add_argument(
        "--plain", action="store_true", help="plain workers: no pod runtime, no Longhorn, no workload (no fence)"
    )
    parser.add_argument("--replay", help="a schedule (JSON list of steps) to run instead of the seed's")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lacking = lab_binaries_missing([*STACK_BINARIES, "k3s-patch"]) if args.plain else missing()
    if lacking:
        print(f"lab binaries missing ({', '.join(lacking)}); run lab/setup.sh", file=sys.stderr)
        return 2
    if args.replay:
        schedule = [Step(**s) for s in json.loads(args.replay)]
    elif args.ci or args.plain:
        schedule = make_schedule(args.seed, args.faults, CI_OPERATIONS, CI_FAULTS)
    else:
        schedule = make_schedule(args.seed, args.faults)
    print(f"seed {args.seed}: {len(schedule)} steps, {args.faults} faults", flush=True)
    started = time.monotonic()
    out = args.out

    def keep(reports: list[StepReport]) -> None:
        if out is not None:
            write_partial(out, args.seed, schedule, reports, started)

    reports, violation = run_campaign(schedule, args.workers, args.spares, pods=not args.plain, on_step=keep)
    result: dict[str, Any] = summary(args.seed, schedule, reports, time.monotonic() - started)
    result["reports"] = [r.to_json() for r in reports]
    result["violation"] = None
    result["finished"] = True
    if violation is not None:
        failing = schedule[: len(reports)]
        shortest = failing
        if not args.no_shrink:

            def replay(candidate: list[Step]) -> Violation | None:
                return run_campaign(candidate, args.workers, args.spares, lambda line: None, pods=not args.plain)[1]

            shortest = shrink(failing, violation, replay, print)
        result["violation"] = {
            "invariant": violation.invariant,
            "detail": violation.detail,
            "schedule": [s.to_json() for s in shortest],
        }
        print(f"VIOLATION of {violation.invariant} (seed {args.seed}): {violation.detail}")
        print(f"replay: python -m bench.campaign --replay '{json.dumps([s.to_json() for s in shortest])}'")
    result["machine"] = {"cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "reports"}, indent=2))
    return 1 if violation is not None else 0


if __name__ == "__main__":
    sys.exit(main())
