"""Reboot a worker: cordon, drain, reboot, wait for Ready, uncordon, then wait until the
workloads that were ready before are ready again.

The rules, and why:
- Only a Ready worker, and only while every other node is Ready and schedulable: two
  workers down at once can leave a workload (or a volume's copies) with nowhere to run.
  A worker that is down is a case for a fence, not a reboot.
- Never a worker whose Node records a fence (node_operations.health.FENCE_ANNOTATION), whatever
  the stack file says: the record is the fence's own promise that nothing runs there until it
  rejoins, and it outlives the settings' entry (a lift not yet run).
- A worker whose fence finished (recorded, and tainted out of service) is not "down" for the rule
  above: its workloads already run elsewhere, its host is held stopped, and a fence can last
  months, while every worker needs its reboot within the year (k3s renews its certificates
  when it starts). A fence recorded but not finished is down: its host may still run.
- The rule about the other nodes is checked again on every resume: a reboot cut short still has
  its drain and its reboot ahead, and a node that went down meanwhile makes it two.
- It is checked once more right before the host is rebooted, the pinned-copy move and the drain
  (minutes) being behind: every other node is read again, and its kubelet asked itself through
  the API server (node_operations.nodes_up), since a Node reads Ready for the node monitor's
  grace period after its agent stopped. A node down then stops the reboot: the worker is
  uncordoned again, its record removed, its host not rebooted.
- Where Longhorn runs, a copy pinned to the server that sits on this worker moves to the
  server first (node_operations.pinned_copies), or the reboot is refused naming the volume and
  the space it needs: a worker that does not come back must not take a volume's only copy.
- The reboot is recorded on the Node (an annotation) before anything changes, so an
  interrupted reboot is visible and the next call resumes it instead of refusing the
  cordoned node; the record goes when the worker is uncordoned.
- The drain evicts (PodDisruptionBudgets respected, blocked evictions retried until the
  deadline); DaemonSet pods stay; emptyDir data goes as with any drain. A drain that cannot
  finish names each pod left and the budget holding it, and the worker is uncordoned again
  without a reboot: nothing is left half done.
- "Back" means the host booted again (its boot marker changed) and the Node is Ready with a
  kubelet heartbeat from after the reboot was issued: a Node can still read Ready from
  before the reboot for as long as the node monitor's grace period.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from node_operations.drain import blocking_budgets, names_to_evict
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from node_operations.nodes_up import nodes_down
from node_operations.pinned_copies import PinnedCopyRefusedError, move_pinned_copies
from remote_access.kube import ClusterApi, NodeStatus, Repeat
from remote_access.ssh import RemoteCommandError, SshError, SshSession, SshTarget, open_session

REBOOT_ANNOTATION = "hk3s.dev/reboot"
DRAIN_TIMEOUT_SECONDS = 300.0
READY_TIMEOUT_SECONDS = 600.0
# The host's boot: the kernel's boot id and when PID 1 started (a machine that boots again
# changes both; a container host restarted by its supervisor changes the second).
BOOT_MARKER_COMMAND = "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f22 /proc/1/stat"
POLL_SECONDS = 2.0

Progress = Callable[[str], None]


class RebootRefusedError(SshError):
    """The reboot was refused or stopped. `put_back`: nothing is left changed (refused before
    anything, or the worker uncordoned again after a drain that could not finish); otherwise
    the worker stays cordoned and recorded as rebooting, and the next call resumes."""

    def __init__(self, node: str, message: str, *, put_back: bool) -> None:
        self.put_back = put_back
        super().__init__(node, message)


@dataclass(frozen=True)
class Workload:
    """A Deployment, StatefulSet or DaemonSet."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind.lower()}/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class RebootReport:
    """What a reboot did."""

    node: str
    resumed: bool
    evicted: tuple[str, ...]
    seconds: float
    ready_again: tuple[str, ...]
    not_ready: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        text = (
            f"{self.node} rebooted and Ready in {self.seconds:.0f} s; {len(self.evicted)} pod(s) evicted; "
            f"{len(self.ready_again)} workload(s) ready again"
        )
        if self.not_ready:
            text += f"; NOT ready again: {', '.join(self.not_ready)}"
        return text


def _workload_ready(kind: str, obj: Mapping[str, Any]) -> bool:
    status, spec = obj.get("status") or {}, obj.get("spec") or {}
    if kind == "DaemonSet":
        return int(status.get("numberReady") or 0) >= int(status.get("desiredNumberScheduled") or 0)
    return int(status.get("readyReplicas") or 0) >= int(spec.get("replicas", 1))


async def ready_workloads(api: ClusterApi) -> list[Workload]:
    """Every Deployment, StatefulSet and DaemonSet that is fully ready now."""
    out = await api.kubectl(["get", "deployments,statefulsets,daemonsets", "-A", "-o", "json"], repeat=Repeat.READ)
    ready = []
    for item in json.loads(out).get("items", []):
        kind, metadata = item.get("kind", ""), item.get("metadata", {})
        if _workload_ready(kind, item):
            ready.append(Workload(kind, metadata.get("namespace", ""), metadata.get("name", "")))
    return ready


def fence_finished(node: NodeStatus) -> bool:
    """Whether the node's fence completed: recorded on the Node and tainted out of service."""
    return FENCE_ANNOTATION in node.annotations and node.has_taint(OUT_OF_SERVICE_TAINT)


def reboot_refusals(node: NodeStatus, others: Sequence[NodeStatus], *, resuming: bool) -> list[str]:
    """Why `node` may not be rebooted now (see the module docstring); empty when it may. `others`:
    every other node. `resuming`: a reboot is recorded on it already, so it may be cordoned and
    down by that reboot; the rest holds on a resume as on a first call."""
    problems = []
    recorded = node.annotations.get(FENCE_ANNOTATION)
    if recorded is not None:
        problems.append(
            f"{node.name} has a fence recorded on its Node ({FENCE_ANNOTATION}={recorded}): a fenced worker is held "
            "down on purpose and comes back by the fence's lift (a rejoin), never by a reboot. Remove "
            f"hk3s:fences.{node.name} from the stack file if it is still there, then run up to lift the fence"
        )
    elif not node.ready and not resuming:
        problems.append(
            f"{node.name} is NotReady ({node.ready_reason or 'no heartbeat'}): only a Ready worker is rebooted; "
            f"a worker that is down is fenced (hk3s:fences.{node.name}) instead"
        )
    for other in others:
        if fence_finished(other):
            continue  # not down for this rule: see the module docstring
        if FENCE_ANNOTATION in other.annotations:
            problems.append(
                f"{other.name}'s fence is recorded but not finished (no {OUT_OF_SERVICE_TAINT} taint): its host may "
                f"still run and its workloads wait; never two nodes down at once: run up to finish it "
                f"(hk3s:fences.{other.name}), then reboot again"
            )
        elif not other.ready:
            problems.append(
                f"{other.name} is NotReady ({other.ready_reason or 'no heartbeat'}): never two nodes down at once; "
                f"bring it back first, or fence it (hk3s:fences.{other.name})"
            )
        elif other.unschedulable:
            problems.append(
                f"{other.name} is cordoned (draining or in maintenance): never two nodes down at once; "
                f"finish that first, or uncordon it (k3s kubectl uncordon {other.name})"
            )
    return problems


async def _boot_marker(target: SshTarget, deadline: float = 20) -> str:
    async with open_session(target) as session:
        result = await session.run(["sh", "-c", BOOT_MARKER_COMMAND], deadline=deadline)
    return " ".join(result.stdout.split())


class Reboot:
    """One worker's reboot (see the module docstring)."""

    def __init__(
        self,
        api: ClusterApi,
        server: SshSession,
        worker: SshTarget,
        *,
        drain_timeout: float,
        ready_timeout: float,
        progress: Progress,
        longhorn_minimal_available: int | None = None,
    ) -> None:
        self.api, self.server, self.worker = api, server, worker
        self.node = worker.node
        self.drain_timeout, self.ready_timeout = drain_timeout, ready_timeout
        self.progress = progress
        # hk3s:storage.minimal_available_percent where Longhorn runs; None where it does not.
        self.longhorn_minimal_available = longhorn_minimal_available

    async def _move_pinned_copies(self, *, put_back: bool) -> None:
        """Copies pinned to the server that sit here go there first (node_operations.pinned_copies)."""
        if self.longhorn_minimal_available is None:
            return
        try:
            moved = await move_pinned_copies(
                self.api,
                self.node,
                self.server.target.node,
                minimal_available_percent=self.longhorn_minimal_available,
                progress=lambda line: self.progress(f"[{self.node}] {line}"),
            )
        except PinnedCopyRefusedError as error:
            raise RebootRefusedError(self.node, f"reboot refused: {error}", put_back=put_back) from None
        if moved:
            self.progress(f"[{self.node}] moved to {self.server.target.node}: {', '.join(moved)}")

    async def _record(self, record: Mapping[str, Any] | None) -> None:
        value = json.dumps(record, sort_keys=True) if record is not None else None
        # A merge patch of a fixed value (null removes the key): the same result however often it runs.
        patch = {"metadata": {"annotations": {REBOOT_ANNOTATION: value}}}
        await self.api.kubectl(
            ["patch", "node", self.node, "--type", "merge", "-p", json.dumps(patch)], repeat=Repeat.IDEMPOTENT
        )

    async def _node_object(self) -> dict[str, Any]:
        out = await self.api.kubectl(["get", "node", self.node, "-o", "json"], repeat=Repeat.READ)
        node: dict[str, Any] = json.loads(out)
        return node

    async def _node_object_if_any(self) -> dict[str, Any] | None:
        """The Node as the API returns it, or None when there is none of this name."""
        out = await self.api.kubectl(["get", "node", self.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
        return dict(json.loads(out)) if out.strip() else None

    async def _refusals(self, node: NodeStatus, *, resuming: bool) -> list[str]:
        others = [other for other in await self.api.nodes() if other.name != self.node]
        return reboot_refusals(node, others, resuming=resuming)

    async def _server_now(self) -> float:
        return float((await self.server.run(["date", "+%s"], deadline=15)).stdout.strip())

    async def _drain(self) -> list[str]:
        evicted = await names_to_evict(self.api, self.node)
        self.progress(f"[{self.node}] draining: {len(evicted)} pod(s) to evict (DaemonSet pods stay)")
        try:
            await self.api.drain(self.node, self.drain_timeout)
        except RemoteCommandError:
            held = await blocking_budgets(self.api, self.node)
            await self.api.cordon(self.node, False)
            await self._record(None)
            raise RebootRefusedError(
                self.node,
                f"the drain did not finish within {self.drain_timeout:.0f} s: "
                + ("; ".join(held) or "the pods were not evicted in time")
                + f". {self.node} is uncordoned again and was not rebooted; scale the workload up or relax its "
                "budget, then reboot again",
                put_back=True,
            ) from None
        return evicted

    async def _others_down(self) -> list[str]:
        """The rule about the other nodes, read again now, each other node's kubelet asked itself
        (see the module docstring); empty when the host may go down."""
        nodes = await self.api.nodes()
        me = next((node for node in nodes if node.name == self.node), None)
        if me is None:
            return [f"there is no Node named {self.node} in the cluster any more"]
        others = [other for other in nodes if other.name != self.node]
        problems = reboot_refusals(me, others, resuming=True)
        return problems or await nodes_down(self.api, [other for other in others if not fence_finished(other)])

    async def _reboot_host(self, record: dict[str, Any]) -> None:
        # Right before the host goes down: a node that went down since the first check makes it two.
        problems = await self._others_down()
        if problems:
            await self.api.cordon(self.node, False)
            await self._record(None)
            raise RebootRefusedError(
                self.node,
                "the reboot stopped before the host went down: "
                + "; ".join(problems)
                + f"; never two nodes down at once: {self.node} is uncordoned again and was not rebooted. Bring "
                f"the other node back (or fence it), then reboot {self.node} again",
                put_back=True,
            )
        record["issued_at"] = await self._server_now()
        await self._record(record)
        self.progress(f"[{self.node}] rebooting the host")
        try:
            async with open_session(self.worker) as session:
                await session.run(["systemctl", "reboot", "--no-block"], deadline=30)
        except SshError as error:
            # The host may cut the connection as it goes down; whether it rebooted is judged by its
            # boot marker below.
            self.progress(f"[{self.node}] the connection ended with the reboot command ({error})")

    async def _still_on(self, boot: str) -> bool:
        """Whether the host answers from the boot the reboot was recorded in."""
        try:
            return await asyncio.wait_for(_boot_marker(self.worker), timeout=30) == boot
        except (SshError, TimeoutError):
            return False

    async def _wait_back(self, record: Mapping[str, Any], deadline: float) -> None:
        while True:
            try:
                marker = await asyncio.wait_for(_boot_marker(self.worker), timeout=30)
                if marker != record["boot"]:
                    break
            except (SshError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RebootRefusedError(
                    self.node,
                    f"the host did not come back over SSH within {self.ready_timeout:.0f} s of the reboot; it stays "
                    "cordoned and recorded as rebooting: check its console, then reboot again to finish",
                    put_back=False,
                )
            await asyncio.sleep(POLL_SECONDS)
        self.progress(f"[{self.node}] the host booted again; waiting for its Node to be Ready")
        issued = float(record.get("issued_at") or 0)
        while True:
            node = await self._node_object()
            conditions: list[dict[str, Any]] = node["status"].get("conditions", [])
            ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
            beat = ready.get("lastHeartbeatTime")
            fresh = beat is not None and datetime.fromisoformat(beat.replace("Z", "+00:00")).timestamp() >= issued
            if ready.get("status") == "True" and fresh:
                return
            if time.monotonic() > deadline:
                raise RebootRefusedError(
                    self.node,
                    f"the Node did not report Ready within {self.ready_timeout:.0f} s of the reboot "
                    f"({ready.get('reason', 'no heartbeat')}); it stays cordoned and recorded as rebooting: check "
                    "k3s-agent on the host (journalctl -u k3s-agent), then reboot again to finish",
                    put_back=False,
                )
            await asyncio.sleep(POLL_SECONDS)

    async def _wait_workloads(self, before: list[Workload], deadline: float) -> tuple[list[str], list[str]]:
        wanted = {str(workload) for workload in before}
        while True:
            now = {str(workload) for workload in await ready_workloads(self.api)}
            missing = sorted(wanted - now)
            if not missing or time.monotonic() > deadline:
                return sorted(wanted & now), missing
            await asyncio.sleep(POLL_SECONDS)

    async def run(self) -> RebootReport:
        started = time.monotonic()
        # One read of the Node serves both its recorded reboot (an annotation) and the readiness rules.
        current = await self._node_object_if_any()
        if current is None:
            raise RebootRefusedError(
                self.node, f"there is no Node named {self.node} in the cluster; run up to join it", put_back=True
            )
        node = NodeStatus.from_object(current)
        recorded: str | None = (current["metadata"].get("annotations") or {}).get(REBOOT_ANNOTATION)
        resumed = recorded is not None
        # Checked on every call, a resume included: what held when the reboot began may not hold now.
        problems = await self._refusals(node, resuming=resumed)
        if recorded is not None:
            if problems:
                raise RebootRefusedError(
                    self.node,
                    "the reboot recorded on its Node is not resumed: "
                    + "; ".join(problems)
                    + f". {self.node} stays as the reboot left it (cordoned, recorded as rebooting); once that is "
                    f"fixed, reboot {self.node} again to finish",
                    put_back=False,
                )
            record = json.loads(recorded)
            self.progress(f"[{self.node}] resuming the reboot recorded on its Node")
        else:
            if problems:
                raise RebootRefusedError(
                    self.node, "reboot refused, nothing changed: " + "; ".join(problems), put_back=True
                )
            await self._move_pinned_copies(put_back=True)
            record = {
                "boot": await _boot_marker(self.worker),
                "workloads": [[w.kind, w.namespace, w.name] for w in await ready_workloads(self.api)],
            }
            await self._record(record)
        if resumed and "issued_at" not in record:
            await self._move_pinned_copies(put_back=False)  # a move cut short is finished first
        before = [Workload(*item) for item in record["workloads"]]
        await self.api.cordon(self.node, True)
        evicted: list[str] = []
        if "issued_at" not in record:
            evicted = await self._drain()
            await self._reboot_host(record)
        elif await self._still_on(record["boot"]):
            self.progress(f"[{self.node}] the recorded reboot did not happen; rebooting now")
            await self._reboot_host(record)
        deadline = time.monotonic() + self.ready_timeout
        await self._wait_back(record, deadline)
        await self.api.cordon(self.node, False)
        await self._record(None)
        self.progress(f"[{self.node}] uncordoned; waiting for {len(before)} workload(s) to be ready again")
        ready_again, not_ready = await self._wait_workloads(before, deadline)
        return RebootReport(
            node=self.node,
            resumed=resumed,
            evicted=tuple(evicted),
            seconds=time.monotonic() - started,
            ready_again=tuple(ready_again),
            not_ready=tuple(not_ready),
        )


async def reboot_worker(
    server: SshTarget,
    worker: SshTarget,
    *,
    api_wait: float,
    drain_timeout: float = DRAIN_TIMEOUT_SECONDS,
    ready_timeout: float = READY_TIMEOUT_SECONDS,
    progress: Progress | None = None,
    longhorn_minimal_available: int | None = None,
) -> RebootReport:
    """Reboot one worker (see the module docstring); the Kubernetes calls go through the
    server's `k3s kubectl` over SSH, as every node operation's do."""
    say = progress or (lambda _line: None)
    async with open_session(server) as session:
        api = ClusterApi(session, say, api_wait)
        return await Reboot(
            api,
            session,
            worker,
            drain_timeout=drain_timeout,
            ready_timeout=ready_timeout,
            progress=say,
            longhorn_minimal_available=longhorn_minimal_available,
        ).run()
