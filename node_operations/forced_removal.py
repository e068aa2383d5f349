"""Give a fenced worker up (hk3s:fences.<worker>.force_remove, CLI `node remove NAME --force`):
deregister it without a drain or a copy moved, for a host that is powered off or gone for good.

A normal removal (node_operations.worker_removal) needs the worker to answer: it moves the
copies off, drains and wipes the host. A worker that is gone for good cannot be drained, and
the fence has already proved it stopped and let its workloads start elsewhere. What is left
is its registration. The rules, and why:

1. **Only a worker whose fence completed**: its Node must carry the fence's record and the
   out-of-service taint, which the fence puts on only once the host is proven stopped (stopped
   over SSH with nothing left on it, powered off through the Hetzner API with its status off and
   its kubelet silent, or confirmed powered off with its kubelet silent). Deleting a Node is a
   force-deletion of its pods (the pod garbage collector deletes at once the pods of a Node that
   is gone), so a fence that was recorded but stopped before that proof (a power-off action that
   failed, a process left on the host) gives nothing up: the host may still run and write.
   Deregistering a worker that was never fenced would let Kubernetes forget a host that may
   still be writing.
2. **A host that still answers must be held by the fence**: its agent kept down by the
   fence's systemd drop-in and not running. A host that answers and runs its agent (powered
   back on after a fence that confirmed it off, say) is refused: remove it without force
   (drained, copies moved, wiped), or fence it again.
3. **Deregister**: the name's join permit is revoked first, then the Node, its Longhorn node and
   k3s's node password go. The host is left as it is, its data included: a copy only it held
   stays on its disk for a person to salvage, and the drop-in (where the fence could write one)
   keeps its agent down. The peers' firewalls drop it after this (the roster runs before every
   firewall change).
4. **The name is unusable until it joins again**: the host keeps its kubelet certificate (valid
   a year, and Kubernetes revokes no client certificate), and NodeRestriction lets a kubelet
   create its own Node. A host powered on again, where a firewall still lets it reach the API,
   would bring its Node back. The join-permit admission refuses a kubelet's Node with no permit,
   and only a join of the name grants one again, so the revoked permit is the deny record: the
   old kubelet's Node (and one made with any live bootstrap token) is refused and never exists to
   take pods (node_operations.join_permits). A k3s-side refusal (the node password) cannot hold
   it: the old host knows its password, and the record goes here so a new host can take the name.
Every step is idempotent: a worker already deregistered is reported gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from node_operations.fence import FENCE_ANNOTATION, OUT_OF_SERVICE
from node_operations.join_permits import revoke_join_permit
from node_operations.refusal import tagged
from node_operations.worker_removal import ANSWER_SECONDS, LONGHORN_NAMESPACE, LONGHORN_NODE_CRD, RemovalRefusedError
from node_operations.workload_start import read_stopped_lines
from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import SshError, SshTarget, open_session

# The fence's drop-in (host_scripts/k3s_fence.sh): while it exists the agent does not start.
FENCE_DROP_IN = "/etc/systemd/system/k3s-agent.service.d/hk3s-fence.conf"
HELD_CHECK = (
    f"test -s {FENCE_DROP_IN} && echo drop-in=present || echo drop-in=absent; "
    "systemctl is-active k3s-agent >/dev/null 2>&1 && echo agent=active || echo agent=inactive"
)

Progress = Callable[[str], None]


def not_held(node: str, held: str) -> str:
    """Why an answering host is not given up, and what to do."""
    return tagged(
        "giving the worker up is refused: its host answers over SSH and the fence does not hold it "
        f"stopped ({held}). Remove it without force (node remove {node}: drained, copies moved, wiped), or fence "
        "it again. Nothing was changed",
        "removal",
    )


async def fence_hold(worker: SshTarget) -> str | None:
    """None when the host does not answer or the fence holds it stopped; else what the host says."""
    try:
        async with open_session(worker) as session:
            result = await session.run(["sh", "-c", HELD_CHECK], deadline=ANSWER_SECONDS)
    except SshError:
        return None  # it does not answer: the completed fence proved it stopped (judge_give_up checks that)
    said = result.stdout.split()
    if said == ["drop-in=present", "agent=inactive"]:
        return None
    return ", ".join(said) or "no answer to the check"


def incomplete_fence(node: str, found: dict[str, Any]) -> str | None:
    """Why the worker whose Node is `found` cannot be given up by what its Node says (None when its
    fence is recorded and completed: the out-of-service taint is on)."""
    annotations = found["metadata"].get("annotations") or {}
    recorded = annotations.get(FENCE_ANNOTATION)
    if not recorded:
        return tagged(
            f"giving the worker up is refused: {node} is not fenced (no fence recorded on its Node). Fence it first "
            f"(hk3s:fences.{node}, CLI node fence {node}), or remove it without force. Nothing was changed",
            "removal",
        )
    taints = (found.get("spec") or {}).get("taints") or []
    if any(t.get("key") == OUT_OF_SERVICE.key and t.get("effect") == OUT_OF_SERVICE.effect for t in taints):
        return None
    return tagged(
        f"giving the worker up is refused: the fence of {node} recorded at {recorded} did not complete, so its host "
        "is not proven stopped and may still run and write (the fence taints the Node "
        f"{OUT_OF_SERVICE.key} only once the host was stopped over SSH with nothing left, powered off through the "
        "Hetzner API, or confirmed powered off with its kubelet silent; its Node has no such taint). Finish the "
        f"fence first: run up again with hk3s:fences.{node} (scripts/hk3s up), which resumes it and names what stops "
        "it; give the worker up once it reports fenced. Nothing was changed",
        "removal",
    )


async def judge_give_up(api: ClusterApi, worker: SshTarget) -> dict[str, Any] | None:
    """The worker's Node when it may be given up (None when it has no Node left); raises
    RemovalRefusedError, changing nothing, when its fence is missing or incomplete, or when its
    host answers and the fence does not hold it stopped."""
    out = await api.kubectl(["get", "node", worker.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
    if not out.strip():
        return None
    found: dict[str, Any] = json.loads(out)
    if (refusal := incomplete_fence(worker.node, found)) is not None:
        raise RemovalRefusedError(worker.node, refusal)
    held = await fence_hold(worker)
    if held is not None:
        raise RemovalRefusedError(worker.node, not_held(worker.node, held))
    return found


async def check_give_up(server: SshTarget, worker: SshTarget, *, api_wait: float, progress: Progress) -> None:
    """`judge_give_up` through the server's API, before anything of the run changes."""
    async with open_session(server) as session:
        await judge_give_up(ClusterApi(session, progress=progress, api_wait=api_wait), worker)


async def give_up_worker(
    server: SshTarget, worker: SshTarget, *, longhorn: bool, api_wait: float, progress: Progress
) -> str:
    """Deregister the fenced `worker` through the server's API (see the module docstring); the
    report's line."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        # Judged again here, right before the Node goes: the check ran before the run's other changes.
        found = await judge_give_up(api, worker)
        # The permit before the Node: no moment with the Node gone and the name still admitted.
        await revoke_join_permit(api, worker.node)
        if found is not None:
            await api.kubectl(["delete", "node", worker.node, "--ignore-not-found"], repeat=Repeat.IDEMPOTENT)
        if longhorn:
            await api.kubectl(
                ["delete", LONGHORN_NODE_CRD, worker.node, "-n", LONGHORN_NAMESPACE, "--ignore-not-found"],
                repeat=Repeat.IDEMPOTENT,
            )
        await api.delete_node_password(worker.node)
        # What its fence stopped stays stopped: no lift will come to start it, so each is named
        # with the command that judges and starts it.
        for line in await read_stopped_lines(api, worker.node):
            progress(line)
    if found is None:
        return "given up: no Node was left; its join permit, Longhorn node and node password are gone too"
    recorded = found["metadata"]["annotations"][FENCE_ANNOTATION]
    return (
        f"given up (fenced since {recorded}): its join permit, Node, Longhorn node and node password are "
        "gone, without a drain; the host was left as it is (its data and the fence's drop-in); its name "
        "registers no Node until it joins again"
    )
