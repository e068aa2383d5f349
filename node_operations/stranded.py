"""What `status` reads from the cluster now: each node's state, and the workloads stranded on a
worker that stopped reporting, with the nodes that hold a current copy of their data.

When a worker goes NotReady, Kubernetes keeps its pods and volumes where they were: it cannot tell
a dead host from one cut off that may still write to its volumes, so the program moves nothing
on its own. The operator decides, and needs to know what waits on the worker and where its data
could start from: each workload whose pods on the worker use Longhorn volumes (the ones the fence
judges, node_operations/fence_workloads.py; a pod Kubernetes evicted, Terminating until the
worker's kubelet confirms, still counts), each volume's current copies elsewhere (healthy since
it last failed, on a node that is Ready and not fenced: `Copy.current`), and the command that
fences the worker. Read-only: nothing here changes the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from node_operations.fence_workloads import REASON, WorkloadDecision, read_json
from node_operations.health import live_state
from remote_access.kube import ClusterApi, NodeStatus
from remote_access.ssh import SshTarget, open_session

# The CLI's command that fences a worker (docs/fencing.md).
FENCE_COMMAND = "scripts/hk3s node fence {worker}"


@dataclass(frozen=True)
class StrandedVolume:
    """A Longhorn volume of a stranded workload: where a current copy of it is now."""

    volume: str
    claim: str  # namespace/name
    current_on: list[str]
    """The nodes other than the worker holding a current copy (empty: none, so the workload
    cannot start elsewhere on this volume's data as it is now)."""


@dataclass(frozen=True)
class StrandedWorkload:
    """A workload whose pods wait on a NotReady worker, and what a fence would do with it."""

    worker: str
    workload: str  # "Kind namespace/name" of the controller a fence stops, or "pod namespace/name"
    pods: list[str]
    volumes: list[StrandedVolume]
    verdict: str
    """What a fence would decide now: `moves` (a current copy of every volume elsewhere),
    `stale` (only copies that may be older), `only-copy` (no other node ever held its data),
    `unjudged` (a pod with no owner the fence can stop)."""

    def line(self) -> str:
        volumes = "; ".join(
            f"volume {v.volume} (claim {v.claim}): current copy on {', '.join(v.current_on) or 'no other node'}"
            for v in self.volumes
        )
        return f"{self.workload} (pods {', '.join(self.pods)}) on {self.worker} [{self.verdict}]: {volumes}"


@dataclass(frozen=True)
class DownWorker:
    """A worker that is NotReady and not fenced, its stranded workloads and what to run."""

    name: str
    workloads: list[StrandedWorkload] = field(default_factory=list)

    @property
    def command(self) -> str:
        return FENCE_COMMAND.format(worker=self.name)

    def advice(self) -> str:
        return (
            f"{self.name} is NotReady and not fenced: its pods and volumes stay where they are. Once it has been "
            f"NotReady for a minute and you know its host is down, fence it: {self.command} "
            f"(or set hk3s:fences.{self.name} in the stack file and run up); to bring it back, start its k3s agent"
        )


def down_and_unfenced(nodes: dict[str, NodeStatus], workers: list[str]) -> list[str]:
    """The workers the cluster sees NotReady that no fence holds (a fenced one reads OutOfService)."""
    return [name for name in workers if name in nodes and live_state(nodes[name]).startswith("NotReady")]


async def stranded_on(api: ClusterApi, worker: str) -> list[StrandedWorkload]:
    """The workloads whose pods on `worker` use Longhorn volumes, judged as the fence would judge
    them now (WorkloadDecision's reading, without its stops)."""
    # Pods being deleted count too: Kubernetes evicts the pods of a NotReady node once their
    # toleration of its unreachable or not-ready taint runs out (300 s unless the pod says
    # otherwise), and each stays Terminating until the worker's kubelet confirms, which it cannot
    # while down. Its containers may still run there and its volumes stay attached there (the
    # attach-detach controller releases them only once the pod is gone or reported terminated),
    # so the workload is as stranded as before.
    pods = (await read_json(api, "pods", "-A", "--field-selector", f"spec.nodeName={worker}")).get("items") or []
    decision = WorkloadDecision(api, worker, lambda _line: None, accept_stale_data=False)
    found = []
    for owner, workload in (await decision.workloads(pods)).items():
        volumes = [
            StrandedVolume(v.volume, v.claim, sorted({c.node for c in v.copies if c.current and c.node != worker}))
            for v in workload.volumes.values()
        ]
        verdict = workload.verdict(worker)
        found.append(StrandedWorkload(worker, str(owner), sorted(workload.pods), volumes, REASON.get(verdict, "moves")))
    found += [StrandedWorkload(worker, f"pod {label}", [label], [], "unjudged") for label in decision.unjudged_pods]
    return sorted(found, key=lambda item: item.workload)


async def read_cluster(
    server: SshTarget, workers: list[str], api_wait: float
) -> tuple[dict[str, NodeStatus], list[DownWorker]]:
    """Every Node by name, and each recorded worker that is NotReady and not fenced with its
    stranded workloads: one session on the server, read-only."""
    async with open_session(server) as session:
        api = ClusterApi(session, api_wait=api_wait)
        nodes = {node.name: node for node in await api.nodes()}
        down = [DownWorker(name, await stranded_on(api, name)) for name in down_and_unfenced(nodes, workers)]
    return nodes, down
