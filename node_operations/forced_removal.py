"""Give a fenced worker up (hk3s:fences.<worker>.force_remove, CLI `node remove NAME --force`):
deregister it without a drain or a copy moved, for a host that is powered off or gone for good.

A normal removal (node_operations.worker_removal) needs the worker to answer: it moves the
copies off, drains and wipes the host. A worker that is gone for good cannot be drained, and
the fence has already proved it stopped and let its workloads start elsewhere. What is left
is its registration. The rules, and why:

1. **Only a fenced worker**: its Node must carry the fence's record. Deregistering a worker
   that was never fenced would let Kubernetes forget a host that may still be writing.
2. **A host that still answers must be held by the fence**: its agent kept down by the
   fence's systemd drop-in and not running. A host that answers and runs its agent (powered
   back on after a fence that confirmed it off, say) is refused: remove it without force
   (drained, copies moved, wiped), or fence it again.
3. **Deregister**: the Node, its Longhorn node and k3s's node password go. The host is left as
   it is, its data included: a copy only it held stays on its disk for a person to salvage,
   and the drop-in keeps its agent down. The peers' firewalls drop it after this (the roster
   runs before every firewall change).
Every step is idempotent: a worker already deregistered is reported gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from node_operations.fence import FENCE_ANNOTATION
from node_operations.refusal import tagged
from node_operations.worker_removal import ANSWER_SECONDS, LONGHORN_NAMESPACE, LONGHORN_NODE_CRD, RemovalRefusedError
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
        return None  # it does not answer: the fence proved it stopped (or the operator, powered off)
    said = result.stdout.split()
    if said == ["drop-in=present", "agent=inactive"]:
        return None
    return ", ".join(said) or "no answer to the check"


async def give_up_worker(
    server: SshTarget, worker: SshTarget, *, longhorn: bool, api_wait: float, progress: Progress
) -> str:
    """Deregister the fenced `worker` through the server's API (see the module docstring); the
    report's line."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        out = await api.kubectl(["get", "node", worker.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
        if out.strip():
            annotations = json.loads(out)["metadata"].get("annotations") or {}
            if FENCE_ANNOTATION not in annotations:
                raise RemovalRefusedError(
                    worker.node,
                    tagged(
                        f"giving the worker up is refused: {worker.node} is not fenced (no fence recorded on its "
                        f"Node). Fence it first (hk3s:fences.{worker.node}, CLI node fence {worker.node}), or "
                        "remove it without force. Nothing was changed",
                        "removal",
                    ),
                )
            held = await fence_hold(worker)
            if held is not None:
                raise RemovalRefusedError(worker.node, not_held(worker.node, held))
            await api.kubectl(["delete", "node", worker.node, "--ignore-not-found"], repeat=Repeat.IDEMPOTENT)
        if longhorn:
            await api.kubectl(
                ["delete", LONGHORN_NODE_CRD, worker.node, "-n", LONGHORN_NAMESPACE, "--ignore-not-found"],
                repeat=Repeat.IDEMPOTENT,
            )
        await api.delete_node_password(worker.node)
    if not out.strip():
        return "given up: no Node was left; its Longhorn node and node password are gone too"
    return (
        f"given up (fenced since {annotations[FENCE_ANNOTATION]}): its Node, Longhorn node and node password are "
        "gone, without a drain; the host was left as it is (its data and the fence's drop-in)"
    )
