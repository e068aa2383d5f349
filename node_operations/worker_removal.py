"""Remove a worker from the cluster: its copies moved off first, drained, wiped, deregistered.

The order, and why:
1. The worker must answer over SSH. A removal takes k3s and its data off the host; a host
   that does not answer may still be running and writing, so it is fenced first (the fence
   proves it is stopped), never removed as if it were gone.
2. Copies first (only where Longhorn runs): the worker's Longhorn node stops taking new
   copies (`spec.allowScheduling: false`) and its copies are evicted
   (`spec.evictionRequested: true`), which makes Longhorn build each copy healthy on another
   node before it drops the one here. The removal waits until the worker holds none. It is
   refused before anything changes when the other nodes cannot take them (no eligible node
   for a volume, or no room), naming the volumes: a drain would otherwise leave a volume
   with its last copy on a host about to be wiped.
3. Drain (PodDisruptionBudgets respected, DaemonSet pods stay, emptyDir data goes as with
   any drain). A drain that cannot finish names the pods and budgets; the worker stays
   cordoned, and the next run resumes the removal.
4. Wipe the host (k3s stopped and uninstalled, its data, the program's drop-ins): the agent
   must be gone before its Node is deleted, or it would register the Node again.
5. Deregister: the name's join permit is revoked first, then the Node, its Longhorn node and
   k3s's node password go. Without the permit no kubelet can create the Node again (any live
   bootstrap token would otherwise register the name, see node_operations.join_permits), and
   the name joins again later only through a join, as a new host.
Every step is idempotent, so a removal cut anywhere (even SIGKILL) finishes when it runs
again, and removing a worker that is already gone changes nothing. The peers' firewalls drop
the worker after this has finished (the caller orders that); for a node whose firewall the
operator runs, the report lists the addresses and ports to remove there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from node_operations.drain import blocking_budgets, names_to_evict
from node_operations.health import FENCE_ANNOTATION
from node_operations.join_permits import revoke_join_permit
from node_operations.longhorn_objects import LONGHORN_NAMESPACE, Disk, disks, longhorn_items
from node_operations.refusal import tagged
from node_operations.teardown import wipe_node
from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import RemoteCommandError, SshError, SshSession, SshTarget, open_session

LONGHORN_NODE_CRD = "nodes.longhorn.io"
DRAIN_TIMEOUT_SECONDS = 300.0
ANSWER_SECONDS = 20.0
# Moving copies copies data over the network: a 100 GiB volume at 100 MB/s takes 17 min.
COPIES_TIMEOUT_SECONDS = 3600.0
POLL_SECONDS = 2.0

Progress = Callable[[str], None]


class RemovalRefusedError(SshError):
    """The removal was refused or stopped; the message says what is left and the next step."""


@dataclass(frozen=True)
class PeerFirewall:
    """A node whose firewall the operator runs, and the ports the leaving worker was admitted to."""

    node: str
    ports: tuple[str, ...]


@dataclass
class RemovalReport:
    """What the removal did."""

    node: str
    copies_moved: int = 0
    pods_evicted: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    wiped: bool = False
    already_gone: bool = False
    operator_firewalls: list[PeerFirewall] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report, one line per fact."""
        if self.already_gone:
            return [f"{self.node} was already removed: nothing left to do"]
        lines = [
            f"removed: {self.copies_moved} copies moved off, {len(self.pods_evicted)} pod(s) evicted, host wiped, "
            "Node deregistered (its join permit revoked)"
        ]
        sources = ", ".join(self.addresses) or "its addresses"
        for peer in self.operator_firewalls:
            lines.append(
                f"{peer.node} runs a firewall you manage: remove the rules that admit {sources} "
                f"to {', '.join(peer.ports)}"
            )
        return lines


def copies_that_cannot_move(
    leaving: Collection[str],
    volumes: Sequence[Mapping[str, Any]],
    replicas: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    minimal_available_percent: int,
) -> list[str]:
    """Each volume with a copy on a `leaving` node that no staying node can take, with the
    reason. A node can take it when it accepts copies (`spec.allowScheduling`, no eviction asked), carries
    every tag of the volume's `nodeSelector`, holds no copy of the volume yet (two copies
    never share a node), and has a disk with room for it; copies placed earlier in this
    judgement count against that room."""
    holders: dict[str, set[str]] = {}
    for replica in replicas:
        spec = replica.get("spec") or {}
        holders.setdefault(str(spec.get("volumeName")), set()).add(str(spec.get("nodeID")))
    node_disks = {node["metadata"]["name"]: disks(node) for node in nodes}
    problems = []
    for volume in sorted(volumes, key=lambda v: str(v["metadata"]["name"])):
        name = str(volume["metadata"]["name"])
        moving = holders.get(name, set()) & set(leaving)
        if not moving:
            continue
        spec = volume.get("spec") or {}
        size, selector = int(spec.get("size") or 0), set(spec.get("nodeSelector") or [])
        tagged = [
            node
            for node in nodes
            if node["metadata"]["name"] not in leaving
            and node["metadata"]["name"] not in holders.get(name, set())
            and (node.get("spec") or {}).get("allowScheduling", True)
            and not (node.get("spec") or {}).get("evictionRequested")
            and selector <= set((node.get("spec") or {}).get("tags") or [])
        ]
        wanted = f" with tags {', '.join(sorted(selector))}" if selector else ""
        if len(tagged) < len(moving):
            problems.append(
                f"volume {name}: {len(moving)} copies to move, {len(tagged)} other node(s){wanted} accept a copy "
                "and do not hold one already"
            )
            continue
        for _copy in moving:
            room = [
                (node["metadata"]["name"], index)
                for node in tagged
                for index, disk in enumerate(node_disks[node["metadata"]["name"]])
                if disk.takes(size, minimal_available_percent)
            ]
            if not room:
                problems.append(f"volume {name}: no node it may use has room for its {size / 2**30:.1f} GiB")
                break
            chosen, index = room[0]
            disk = node_disks[chosen][index]
            node_disks[chosen][index] = Disk(
                disk.available - size, disk.maximum, disk.reserved, disk.scheduled + size, disk.schedulable
            )
            tagged = [node for node in tagged if node["metadata"]["name"] != chosen]
    return problems


class WorkerRemoval:
    """One worker's removal (see the module docstring)."""

    def __init__(
        self,
        api: ClusterApi,
        worker: SshTarget,
        *,
        longhorn: bool,
        minimal_available_percent: int,
        operator_firewalls: Sequence[PeerFirewall],
        progress: Progress,
        drain_timeout: float = DRAIN_TIMEOUT_SECONDS,
        copies_timeout: float = COPIES_TIMEOUT_SECONDS,
        also_leaving: Collection[str] = (),
    ) -> None:
        self.api, self.worker, self.node = api, worker, worker.node
        self.longhorn, self.minimal_available_percent = longhorn, minimal_available_percent
        self.drain_timeout, self.copies_timeout = drain_timeout, copies_timeout
        self.report = RemovalReport(worker.node, operator_firewalls=list(operator_firewalls))
        self.progress = progress
        # Workers leaving in the same run: never a place for this one's copies.
        self.also_leaving = tuple(also_leaving)

    async def _items(self, kind: str) -> list[dict[str, Any]]:
        return await longhorn_items(self.api, kind)

    async def _longhorn_node(self) -> bool:
        """Whether Longhorn knows this worker (its CRD installed and a Longhorn node for it)."""
        if not self.longhorn:
            return False
        out = await self.api.kubectl(
            ["get", LONGHORN_NODE_CRD, self.node, "-n", LONGHORN_NAMESPACE, "-o", "name", "--ignore-not-found"],
            repeat=Repeat.READ,
        )
        return bool(out.strip())

    async def _copies_here(self) -> list[str]:
        return sorted(
            str(replica["metadata"]["name"])
            for replica in await self._items("replicas.longhorn.io")
            if (replica.get("spec") or {}).get("nodeID") == self.node
        )

    async def _move_copies(self) -> None:
        """Refused before anything changed when a copy has nowhere to go; else stop new
        copies here, ask Longhorn to evict, and wait until none is left."""
        stuck = copies_that_cannot_move(
            {self.node, *self.also_leaving},
            await self._items("volumes.longhorn.io"),
            await self._items("replicas.longhorn.io"),
            await self._items(LONGHORN_NODE_CRD),
            self.minimal_available_percent,
        )
        if stuck:
            raise RemovalRefusedError(
                self.node,
                "its copies cannot move: "
                + "; ".join(stuck)
                + ". Nothing was changed; add a node that can hold copies (or free space), then remove it again",
            )
        # Counted before the eviction is asked for: Longhorn may move a small copy before the next read.
        self.report.copies_moved = len(await self._copies_here())
        patch = {"spec": {"allowScheduling": False, "evictionRequested": True}}
        await self.api.patch_merge(LONGHORN_NODE_CRD, self.node, LONGHORN_NAMESPACE, patch)
        left = await self._copies_here()
        deadline = time.monotonic() + self.copies_timeout
        while left:
            self.progress(f"moving copies off: {len(left)} left ({', '.join(left[:5])})")
            if time.monotonic() > deadline:
                raise RemovalRefusedError(
                    self.node,
                    f"its copies did not move within {self.copies_timeout:.0f} s ({', '.join(left)} left); it takes "
                    "no new copies and stays in the cluster. Run the removal again to keep waiting",
                )
            await asyncio.sleep(POLL_SECONDS)
            left = await self._copies_here()

    async def _drain(self) -> None:
        self.report.pods_evicted = await names_to_evict(self.api, self.node)
        self.progress(f"draining: {len(self.report.pods_evicted)} pod(s) to evict (DaemonSet pods stay)")
        try:
            await self.api.drain(self.node, self.drain_timeout)
        except RemoteCommandError:
            held = await blocking_budgets(self.api, self.node)
            raise RemovalRefusedError(
                self.node,
                f"the drain did not finish within {self.drain_timeout:.0f} s: "
                + ("; ".join(held) or "the pods were not evicted in time")
                + f". {self.node} stays cordoned; scale the workload up or relax its budget and run the removal "
                "again, or put the worker back in hk3s:workers to keep it (its rejoin uncordons it)",
            ) from None

    async def _deregister(self) -> None:
        # The permit before the Node: no moment with the Node gone and the name still admitted.
        await revoke_join_permit(self.api, self.node)
        await self.api.kubectl(["delete", "node", self.node, "--ignore-not-found"], repeat=Repeat.IDEMPOTENT)
        if self.longhorn:
            await self.api.kubectl(
                ["delete", LONGHORN_NODE_CRD, self.node, "-n", LONGHORN_NAMESPACE, "--ignore-not-found"],
                repeat=Repeat.IDEMPOTENT,
            )
        await self.api.delete_node_password(self.node)

    async def run(self) -> RemovalReport:
        # One login to the worker serves the check that it answers and the wipe.
        async with contextlib.AsyncExitStack() as stack:
            try:
                session = await stack.enter_async_context(open_session(self.worker))
                await session.run(["true"], deadline=ANSWER_SECONDS)
            except SshError as error:
                return await self._silent(str(error))
            return await self._remove(session)

    async def _silent(self, silent: str) -> RemovalReport:
        if await self.api.get_node(self.node) is None:
            # Its Node was deleted some other way (by hand, say): the name must not stay admitted.
            await revoke_join_permit(self.api, self.node)
            self.progress(f"not registered and not reachable ({silent}): nothing left to remove")
            self.report.already_gone = True
            return self.report
        raise RemovalRefusedError(self.node, not_answering(self.node, silent))

    async def _remove(self, session: SshSession) -> RemovalReport:
        raw = await self.api.kubectl(["get", "node", self.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
        if raw.strip() and FENCE_ANNOTATION in (json.loads(raw)["metadata"].get("annotations") or {}):
            # Its workloads were let go by the fence and may run elsewhere on copies of its data:
            # a drain and a wipe are not how it leaves. It rejoins first, or is given up.
            raise RemovalRefusedError(
                self.node,
                tagged(
                    f"removing the worker is refused: {self.node} is fenced. Give it up without a drain "
                    f"(hk3s:fences.{self.node}.force_remove, CLI node remove {self.node} --force), or lift the "
                    "fence first (it rejoins) and remove it then. Nothing was changed",
                    "removal",
                ),
            )
        node = await self.api.get_node(self.node)
        if node is not None:
            self.report.addresses = sorted(
                {address for kind, address in node.addresses.items() if kind in ("InternalIP", "ExternalIP")}
            )
            if await self._longhorn_node():
                await self._move_copies()
            await self.api.cordon(self.node, True)
            await self._drain()
        try:
            outcome = await wipe_node(self.worker, self.progress, session)
        except SshError:  # the login dropped during a long drain: log in again
            outcome = await wipe_node(self.worker, self.progress)
        if outcome.unreachable:
            raise RemovalRefusedError(self.node, f"the wipe could not log in ({outcome.unreachable}); run it again")
        self.report.wiped = True
        self.progress(outcome.report())
        await self._deregister()
        self.report.already_gone = node is None and not outcome.removed
        return self.report


async def remove_worker(
    server: SshTarget,
    worker: SshTarget,
    *,
    longhorn: bool,
    minimal_available_percent: int,
    operator_firewalls: Sequence[PeerFirewall],
    api_wait: float,
    progress: Progress,
    also_leaving: Collection[str] = (),
) -> RemovalReport:
    """Remove `worker` through the server's API (see the module docstring); `also_leaving`
    are the workers that leave in the same run (no place for its copies)."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        removal = WorkerRemoval(
            api,
            worker,
            longhorn=longhorn,
            minimal_available_percent=minimal_available_percent,
            operator_firewalls=operator_firewalls,
            progress=progress,
            also_leaving=also_leaving,
        )
        return await removal.run()


def not_answering(node: str, why: str) -> str:
    """Why a worker that does not answer is not removed, and what to do."""
    return (
        f"does not answer over SSH ({why}); a worker is removed only while it answers, since a host that is "
        f"down may still be writing: bring it back, or fence it first (hk3s:fences.{node})"
    )


async def worker_answers(worker: SshTarget, deadline: float = ANSWER_SECONDS) -> str | None:
    """None when the worker's host answers over SSH, else why not."""
    try:
        async with open_session(worker) as session:
            await session.run(["true"], deadline=deadline)
    except SshError as error:
        return str(error)
    return None
