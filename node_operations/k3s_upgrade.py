"""Upgrading k3s on the workers once the server runs the new release: one worker at a time.

An upgrade is not a rejoin. A joined worker already holds its node certificate, its config
and its place in every firewall; what changes is the k3s binary. So a worker's upgrade is:
the new binary (uploaded or downloaded, checksum verified by k3s_install.sh), the agent
restarted on it with its config untouched, and the Node Ready at the new version. No join
token, no validation taint, no validation pod: those check a new node, and the node is not new.

The rules, and why:
- The server first: its Node must be Ready at the new version before any worker moves
  (Kubernetes' version-skew policy: a kubelet may never be newer than the API server).
- One worker at a time, in the stack's order, each Ready at the new version before the next
  moves: a worker that does not come back stops the upgrade there, naming it, and the workers
  after it keep running the previous release, untouched.
- A patch release moves in place, pods running. A minor release cordons and drains the
  worker first (Kubernetes' documented procedure for a kubelet's minor upgrade), unless
  hk3s:cluster.drain_on_minor_upgrade is false; the worker is uncordoned once Ready at the
  new version (unless it was cordoned before the upgrade began).
- Before any worker moves, every node must be Ready (the server, the workers still to move and
  those already moved): an upgrade never adds a second node down to one that is down already.
  Each worker's Node is read again just before its turn, since the first reading is minutes old
  by then: one that went NotReady meanwhile stops the run there, untouched (no record, no cordon,
  its binary as it was); one fenced meanwhile is left alone and listed.
- Right before a worker is taken down (its agent stopped for the new binary, after its drain),
  every other node is read again, its kubelet asked itself through the API server
  (node_operations.nodes_up): a Node reads Ready for the node monitor's grace period after its
  agent stopped, so a worker that stopped right after its own move would pass a reading of the
  Nodes alone. A node down stops the run there: the worker is uncordoned again (unless it was
  cordoned before), its agent and binary untouched, and the workers after it too. A worker left
  down half-way by an interrupted run is finished all the same: that brings a node back.
- A fenced worker (in hk3s:fences, or its fence recorded on its Node) is left alone and listed:
  its agent is held down on purpose, it may be powered off, and the fence's record is the
  promise that nothing runs there until it rejoins. It is not "down" in the sense above either:
  the upgrade goes on around it.
- A worker's upgrade is recorded on its Node (an annotation) before anything changes, so an
  interrupted run (a SIGKILL) is resumed by the next one: a worker already at the new version
  is never moved again, one left half-way is finished, none is skipped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from node_operations.fence import FENCE_ANNOTATION
from node_operations.join import PERMITS_CONFIGMAP, grant_join_permits
from node_operations.k3s_install import K3sBinary, install_k3s
from node_operations.k3s_release import K3S_VERSION
from node_operations.nodes_up import kubelet_silence, nodes_down
from remote_access.kube import ClusterApi, NodeStatus, Repeat
from remote_access.ssh import RemoteCommandError, SshError, SshSession, SshTarget, open_session

UPGRADE_ANNOTATION = "hk3s.dev/k3s-upgrade"
AGENT_UNIT = "k3s-agent"
READY_TIMEOUT_SECONDS = 300.0
DRAIN_TIMEOUT_SECONDS = 300.0
POLL_SECONDS = 2.0
# An agent that systemd restarted this often on the new binary without its Node coming back
# will not come back by waiting: the upgrade stops at once instead of at the deadline.
FAILED_STARTS = 3

Progress = Callable[[str], None]


class UpgradeStoppedError(SshError):
    """A worker's upgrade could not finish; the message names the worker, what happened,
    which workers were left at the previous release, and what to do."""


def release_step(old: str, new: str) -> Literal["patch", "minor", "none"]:
    """How far `new` is from `old`: a new minor release, a patch (or k3s build) of the same
    minor, or none. Versions that are not k3s releases count as a minor step (the safer one)."""
    if old == new:
        return "none"
    old_match, new_match = K3S_VERSION.match(old), K3S_VERSION.match(new)
    if not old_match or not new_match:
        return "minor"
    return "patch" if old_match.groups()[:2] == new_match.groups()[:2] else "minor"


@dataclass(frozen=True)
class UpgradeReport:
    """What an upgrade run did, per worker."""

    version: str
    upgraded: tuple[str, ...]
    already: tuple[str, ...]
    not_joined: tuple[str, ...]
    fenced: tuple[str, ...] = ()
    # The fenced workers whose Node runs another release than `version`: moved once unfenced.
    behind: tuple[str, ...] = ()
    # Each of those with the release its Node runs (for the skew check of the next upgrade's plan).
    behind_releases: tuple[tuple[str, str], ...] = ()

    def summary(self) -> str:
        parts = [f"{len(self.upgraded)} worker(s) moved to {self.version}"]
        if self.already:
            parts.append(f"already there: {', '.join(self.already)}")
        if self.not_joined:
            parts.append(f"not joined yet (they join at {self.version}): {', '.join(self.not_joined)}")
        if self.fenced:
            parts.append(f"fenced, left alone at their release: {', '.join(self.fenced)}")
        if self.behind:
            parts.append(
                f"moved to {self.version} in the first up after their fence is lifted: {', '.join(self.behind)}"
            )
        return "; ".join(parts)


@dataclass(frozen=True)
class UpgradeSettings:
    """How the workers move."""

    binary: K3sBinary
    drain_on_minor: bool = True
    api_wait: float = 120.0
    ready_timeout: float = READY_TIMEOUT_SECONDS
    drain_timeout: float = DRAIN_TIMEOUT_SECONDS
    fenced: frozenset[str] = frozenset()  # the workers hk3s:fences names


def _record_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    text = (obj.get("metadata", {}).get("annotations") or {}).get(UPGRADE_ANNOTATION)
    return json.loads(text) if text else None


class WorkerUpgrade:
    """One worker's move to the new release (see the module docstring)."""

    def __init__(self, api: ClusterApi, worker: SshTarget, settings: UpgradeSettings, progress: Progress) -> None:
        self.api, self.worker, self.settings = api, worker, settings
        self.node, self.version = worker.node, settings.binary.version
        self.progress = progress

    async def _node(self) -> dict[str, Any]:
        node: dict[str, Any] = json.loads(
            await self.api.kubectl(["get", "node", self.node, "-o", "json"], repeat=Repeat.READ)
        )
        return node

    async def _record(self, record: dict[str, Any] | None) -> None:
        value = json.dumps(record, sort_keys=True) if record is not None else None
        # A merge patch of a fixed value (null removes the key): the same result however often it runs.
        patch = {"metadata": {"annotations": {UPGRADE_ANNOTATION: value}}}
        await self.api.kubectl(
            ["patch", "node", self.node, "--type", "merge", "-p", json.dumps(patch)], repeat=Repeat.IDEMPOTENT
        )

    async def _stop_if_another_down(self, record: dict[str, Any], *, resumed: bool, drained: bool) -> None:
        """Every other node read again right before this worker is taken down, its kubelet asked
        itself (see the module docstring); a node down stops the run here, the worker put back."""
        nodes = json.loads(await self.api.kubectl(["get", "nodes", "-o", "json"], repeat=Repeat.READ))["items"]
        me = next((NodeStatus.from_object(item) for item in nodes if item["metadata"]["name"] == self.node), None)
        if resumed and (me is None or not me.ready or await kubelet_silence(self.api, self.node) is not None):
            # Left down half-way by an interrupted run: finishing it brings a node back, it takes none down.
            return
        others = [
            NodeStatus.from_object(item)
            for item in nodes
            if item["metadata"]["name"] != self.node and not left_alone(item["metadata"]["name"], item, self.settings)
        ]
        down = await nodes_down(self.api, others)
        if not down:
            return
        if drained and not record["was_cordoned"]:
            await self.api.cordon(self.node, False)
        if not resumed:
            await self._record(None)
        raise UpgradeStoppedError(
            self.node,
            f"the upgrade to {self.version} stopped before this worker was taken down: {'; '.join(down)}; never two "
            f"nodes down at once, so {self.node} was not taken down (its agent and binary as they were, at "
            f"{record['from']}{'; uncordoned again' if drained and not record['was_cordoned'] else ''}), nor were "
            "the workers after it. Bring the node back (or fence it), then run up again to go on",
        )

    async def run(self, record: dict[str, Any], *, resumed: bool) -> None:
        if resumed:
            self.progress(f"[{self.node}] resuming the upgrade recorded on its Node")
        else:
            await self._record(record)
        if record["drain"]:
            await self.api.cordon(self.node, True)
            await self._drain(record)
        await self._stop_if_another_down(record, resumed=resumed, drained=record["drain"])
        async with open_session(self.worker) as session:
            restarts = await _restarts(session)
            self.progress(f"[{self.node}] upgrading k3s {record['from']} -> {self.version}")
            results = await install_k3s(
                session, "agent", self.settings.binary, None, lambda line: self.progress(f"[{self.node}] {line}")
            )
            if results.get("service") == "running" and await _runs_replaced_binary(session):
                # A run killed between the binary's swap and the restart left the agent on the old
                # binary (its file replaced under it): restart it now, once.
                self.progress(f"[{self.node}] the agent still runs the previous binary: restarting it")
                await session.run(["systemctl", "restart", "--no-block", AGENT_UNIT], deadline=30)
            await self._wait_ready(session, restarts, record)
        if record["drain"] and not record["was_cordoned"]:
            await self.api.cordon(self.node, False)
        await self._record(None)
        self.progress(f"[{self.node}] Ready at {self.version}")

    async def _drain(self, record: dict[str, Any]) -> None:
        self.progress(f"[{self.node}] cordoned and draining before a minor upgrade (DaemonSet pods stay)")
        try:
            await self.api.drain(self.node, self.settings.drain_timeout)
        except RemoteCommandError as error:
            # Nothing moved yet on this worker: put it back as it was.
            if not record["was_cordoned"]:
                await self.api.cordon(self.node, False)
            await self._record(None)
            raise UpgradeStoppedError(
                self.node,
                f"the drain before its minor upgrade to {self.version} did not finish "
                f"({error.stderr_tail.strip()[-400:] or 'no output'}); it is uncordoned again and still runs "
                f"{record['from']}. Move or delete what blocks the drain (a pod with no controller, a "
                "PodDisruptionBudget that allows no disruption), or set hk3s:cluster.drain_on_minor_upgrade: false "
                "to move workers without a drain, then run up again",
            ) from None

    async def _wait_ready(self, session: SshSession, restarts: int, record: dict[str, Any]) -> None:
        deadline = time.monotonic() + self.settings.ready_timeout
        while True:
            status = NodeStatus.from_object(await self._node())
            if status.ready and status.kubelet_version == self.version:
                return
            failed_starts = await _restarts(session) - restarts
            if failed_starts >= FAILED_STARTS or time.monotonic() > deadline:
                why = (
                    f"its agent failed {failed_starts} times on the new binary"
                    if failed_starts >= FAILED_STARTS
                    else f"it was not Ready at {self.version} within {self.settings.ready_timeout:.0f} s"
                )
                log = await session.run(
                    ["journalctl", "-u", AGENT_UNIT, "--no-pager", "-n", "8", "-o", "cat"], deadline=30, check=False
                )
                held = " and stays cordoned" if record["drain"] else ""
                raise UpgradeStoppedError(
                    self.node,
                    f"the upgrade to {self.version} stopped here: {why} (Node: "
                    f"{'Ready' if status.ready else 'NotReady'}, kubelet {status.kubelet_version or 'unknown'}). "
                    f"The worker is recorded as upgrading{held}; the workers after it were not touched. Find the "
                    f"cause in its agent's log (journalctl -u {AGENT_UNIT}), fix it, then run up again to finish. "
                    f"Last log lines: {' | '.join(log.stdout.strip().splitlines()[-8:])}",
                )
            await asyncio.sleep(POLL_SECONDS)


async def _restarts(session: SshSession) -> int:
    result = await session.run(["systemctl", "show", "-p", "NRestarts", "--value", AGENT_UNIT], deadline=30)
    return int(result.stdout.strip() or 0)


async def _runs_replaced_binary(session: SshSession) -> bool:
    """Whether the agent's running process runs a binary file that was replaced since it started."""
    script = f'pid=$(systemctl show -p MainPID --value {AGENT_UNIT}); [ "$pid" != 0 ] && readlink "/proc/$pid/exe"'
    result = await session.run(["sh", "-c", script], deadline=30, check=False)
    return result.stdout.strip().endswith("(deleted)")


async def wait_server_at(api: ClusterApi, server: str, version: str, timeout: float) -> None:
    """The server's Node Ready at `version`: until then no worker moves."""
    deadline = time.monotonic() + timeout
    while True:
        status = await api.get_node(server)
        if status is not None and status.ready and status.kubelet_version == version:
            return
        if time.monotonic() > deadline:
            found = f"Ready={status.ready}, kubelet {status.kubelet_version}" if status else "no Node"
            raise UpgradeStoppedError(
                server,
                f"the server's Node is not Ready at {version} within {timeout:.0f} s ({found}); no worker was "
                "upgraded. Check k3s on the server (journalctl -u k3s), then run up again",
            )
        await asyncio.sleep(POLL_SECONDS)


Plan = tuple[SshTarget, dict[str, Any], bool]


def plan_moves(
    nodes: dict[str, dict[str, Any]], workers: Sequence[SshTarget], settings: UpgradeSettings
) -> tuple[list[Plan], list[str], list[str]]:
    """Per worker, in order: its move (the record it is moved under, and whether that record was
    left by an interrupted run), or that it runs the release already, or that it has not joined."""
    version = settings.binary.version
    plans: list[Plan] = []
    already, not_joined = [], []
    for worker in workers:
        obj = nodes.get(worker.node)
        if obj is None:
            not_joined.append(worker.node)
            continue
        status, record = NodeStatus.from_object(obj), _record_of(obj)
        if record is None and status.kubelet_version == version:
            already.append(worker.node)
            continue
        resumed = record is not None and record.get("to") == version
        if record is None or not resumed:
            # A record of an earlier, unfinished target: this target's move starts over from
            # the Node as it is, keeping whether the operator had cordoned it.
            earlier = record or {}
            drain = settings.drain_on_minor and release_step(status.kubelet_version, version) == "minor"
            record = {
                "from": status.kubelet_version,
                "to": version,
                "drain": drain,
                "was_cordoned": earlier.get("was_cordoned", status.unschedulable),
            }
        plans.append((worker, record, resumed))
    return plans, already, not_joined


Turn = Literal["move", "fenced", "not_ready", "missing"]


def worker_turn(obj: dict[str, Any] | None, node: str, settings: UpgradeSettings, *, resumed: bool) -> Turn:
    """What a worker's Node, read just before its turn, allows: its move; none, as it is fenced
    (left alone); none, as it went NotReady (the run stops: it is not touched); none, as its Node is
    gone. A worker left half-way by an interrupted run may be NotReady: it is the one to finish."""
    if obj is None:
        return "missing"
    if node in settings.fenced or FENCE_ANNOTATION in (obj.get("metadata", {}).get("annotations") or {}):
        return "fenced"
    if not NodeStatus.from_object(obj).ready and not resumed:
        return "not_ready"
    return "move"


def not_ready_stop(status: NodeStatus, version: str, *, moved: Sequence[str], after: Sequence[str]) -> str:
    """The stop before a worker that went NotReady during the run (the error names the worker):
    what holds and what to do."""
    done = f"Moved to {version} in this run: {', '.join(moved)}" if moved else f"No worker moved to {version} yet"
    rest = f"; not touched either: {', '.join(after)}" if after else ""
    return (
        f"the upgrade to {version} stopped here: it went NotReady ({status.ready_reason or 'no heartbeat'}) "
        f"since the run began, before its turn, and was not touched (no record, no cordon; it still runs "
        f"{status.kubelet_version or 'its release'}). {done}{rest}. Only Ready workers are upgraded, never two "
        f"nodes down at once: bring it back (journalctl -u {AGENT_UNIT} on it) or fence it "
        f"(hk3s:fences.{status.name}), then run up again to go on"
    )


def left_alone(name: str, obj: dict[str, Any], settings: UpgradeSettings) -> bool:
    """Whether a node is fenced (in hk3s:fences, or its fence recorded on its Node): held down on
    purpose, so not "down" for the rule that no second node goes down (see the module docstring)."""
    return name in settings.fenced or FENCE_ANNOTATION in (obj.get("metadata", {}).get("annotations") or {})


def fenced_workers(
    nodes: dict[str, dict[str, Any]], workers: Sequence[SshTarget], settings: UpgradeSettings
) -> list[str]:
    """The workers an upgrade leaves alone: fenced in the stack's settings, or by the fence's
    record on their Node (a fence under way whose entry the settings no longer hold)."""
    return [worker.node for worker in workers if left_alone(worker.node, nodes.get(worker.node) or {}, settings)]


async def _nodes(api: ClusterApi) -> dict[str, dict[str, Any]]:
    items = json.loads(await api.kubectl(["get", "nodes", "-o", "json"], repeat=Repeat.READ))["items"]
    return {item["metadata"]["name"]: item for item in items}


async def upgrade_workers(
    server: SshTarget, workers: Sequence[SshTarget], settings: UpgradeSettings, progress: Progress
) -> UpgradeReport:
    """Move every joined worker to `settings.binary.version`, in the order given, one at a
    time, once the server's Node is Ready at that version (see the module docstring)."""
    version = settings.binary.version
    async with open_session(server) as session:
        api = ClusterApi(session, progress, settings.api_wait)
        nodes = await _nodes(api)
        fenced = fenced_workers(nodes, workers, settings)
        workers = [worker for worker in workers if worker.node not in fenced]
        plans, already, not_joined = plan_moves(nodes, workers, settings)
        if not plans:
            behind = behind_release(nodes, fenced, version)
            return UpgradeReport(
                version, (), tuple(already), tuple(not_joined), tuple(fenced), behind, releases_of(nodes, behind)
            )
        permits = ["get", "configmap", PERMITS_CONFIGMAP, "-n", "kube-system", "--ignore-not-found", "-o", "name"]
        if (await api.kubectl(permits, repeat=Repeat.READ)).strip():
            # A cluster whose first join predates the server's own permit: the restarted server's
            # kubelet creates its Node again, which the join-permit policy admits only with one.
            await grant_join_permits(api, (server.node,))
        await wait_server_at(api, server.node, version, settings.ready_timeout)
        # Read again: the workers' Nodes as they are once the server runs the release.
        nodes = await _nodes(api)
        plans, already, not_joined = plan_moves(nodes, workers, settings)
        # Every node, the server and the workers already moved included (fenced ones are left alone);
        # a worker left half-way by an interrupted run may be NotReady: it is the one to finish.
        finishing = {w.node for w, _, resumed in plans if resumed}
        down = [
            status
            for name, obj in nodes.items()
            if not left_alone(name, obj, settings)
            and name not in finishing
            and not (status := NodeStatus.from_object(obj)).ready
        ]
        if down:
            names = ", ".join(f"{n.name} ({n.ready_reason or 'no heartbeat'})" for n in down)
            raise UpgradeStoppedError(
                down[0].name,
                f"NotReady before the upgrade to {version}: {names}; no worker was upgraded (the server already "
                "runs it). A worker moves only while every node is Ready, never two nodes down at once: bring it "
                "back (or fence a worker that is gone: hk3s:fences.NAME), then run up again",
            )
        moved: list[str] = []
        for index, (worker, record, resumed) in enumerate(plans):
            # Read again just before its turn: the workers before it took minutes, and a worker
            # that went down meanwhile must not be the second node down (see the module docstring).
            obj = await api.kubectl(
                ["get", "node", worker.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ
            )
            now = json.loads(obj) if obj.strip() else None
            turn = worker_turn(now, worker.node, settings, resumed=resumed)
            if turn == "fenced":
                progress(f"[{worker.node}] fenced since the run began: left alone at its release")
                fenced.append(worker.node)
                continue
            after = [w.node for w, _, _ in plans[index + 1 :]]
            if turn == "missing":
                raise UpgradeStoppedError(
                    worker.node,
                    f"the upgrade to {version} stopped here: its Node is gone from the cluster since the run began "
                    f"(moved in this run: {', '.join(moved) or 'none'}; not touched: {', '.join(after) or 'none'}). "
                    "Find out why (a give-up, a kubectl delete node), then run up again to go on",
                )
            if turn == "not_ready" and now is not None:
                status = NodeStatus.from_object(now)
                raise UpgradeStoppedError(worker.node, not_ready_stop(status, version, moved=moved, after=after))
            await WorkerUpgrade(api, worker, settings, progress).run(record, resumed=resumed)
            moved.append(worker.node)
    behind = behind_release(nodes, fenced, version)
    return UpgradeReport(
        version, tuple(moved), tuple(already), tuple(not_joined), tuple(fenced), behind, releases_of(nodes, behind)
    )


def releases_of(nodes: dict[str, dict[str, Any]], names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Each named node with the release its Node runs (its kubelet's version)."""
    return tuple((name, NodeStatus.from_object(nodes[name]).kubelet_version) for name in names if name in nodes)


def behind_release(nodes: dict[str, dict[str, Any]], fenced: Sequence[str], version: str) -> tuple[str, ...]:
    """The fenced workers whose Node runs another release than `version` (the upgrade left them
    there): each is moved by the first run after its fence is lifted."""
    return tuple(
        name for name in fenced if name in nodes and NodeStatus.from_object(nodes[name]).kubelet_version != version
    )
