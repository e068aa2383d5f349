"""Start one workload a fence stopped (`scripts/hk3s workload start NAMESPACE/KIND/NAME`,
`ClusterStack.start_workload`), by the operator's word rather than at a lift.

A fence keeps a workload stopped while no other node holds a current copy of its volumes; only
its lift (the worker back) or `accept_stale_data` on that fence starts it again. When the worker
never comes back (given up with `node remove --force`), or a copy elsewhere turned current after
the fence, nothing else would start it. The rules, and why:

- **Only a workload a fence stopped**: its owner carries the fence's record
  (`fence_workloads.STOPPED_ANNOTATION`), which keeps its former size or suspension and its
  volumes. Anything else is refused: without a record there is nothing to restore. A ReplicaSet
  a Deployment owns carries a copy of the Deployment's record; the Deployment is the one stopped.
- **Judged as the fence judges**: a copy is current when it is healthy since it last failed on a
  node that is Ready and not fenced (`fence_workloads.Copy.current`, read through
  `fence_workloads.copies_now` as the fence reads it); a node no longer in the cluster (a worker
  given up) is not Ready, so it cannot serve one. The fenced worker's own copies count once it is
  Ready and unfenced again: they are then current like any other.
- **With a current copy of every volume** it starts: one merge patch restores its size (or
  suspension) and drops the record, so it is never started without its record going too. Its
  hold (node_operations/fence_holds.py) goes first, in a request of its own: the admission policy
  refuses the start patch while the hold stands. A workload held with no record (made again since
  the fence stopped it) only loses its hold: there is nothing to restore.
- **Copies that may be older** (healthy once, failed since): refused, naming each volume and
  its copies with their timestamps, unless the operator accepts them (`--accept-stale-data`).
- **No copy elsewhere that ever held data**: refused even with consent, as the fence does; there
  is nothing to start it from.
A refusal changes nothing. The fenced Node's summary (`NODE_STOPPED_ANNOTATION`), while the Node
exists, loses the started workload's entry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from node_operations.fence_holds import HOLDS_CONFIGMAP, read_holds, release
from node_operations.fence_holds import start_command as hold_start_command
from node_operations.fence_workloads import (
    NODE_STOPPED_ANNOTATION,
    REASON,
    SCALED,
    START_COMMAND,
    STOPPED_ANNOTATION,
    SUSPENDED,
    Owner,
    Verdict,
    VolumeCopies,
    controller_of,
    copies_now,
    read_json,
    read_stoppable,
    recorded_volumes,
    start_command,
    start_patch,
    stop_record,
)
from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import SshError, SshTarget, open_session

Progress = Callable[[str], None]
COMMAND = START_COMMAND


class WorkloadStartRefusedError(SshError):
    """The workload was not started and nothing changed; the message says why and the fix."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(node, f"{message}. Nothing was changed")


@dataclass(frozen=True)
class WorkloadRef:
    """NAMESPACE/KIND/NAME, as the command takes it (KIND as Kubernetes spells it: Deployment)."""

    namespace: str
    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> WorkloadRef:
        parts = text.split("/")
        kinds = {k.lower(): k for k in (*SCALED, *SUSPENDED)}
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{text!r} is not NAMESPACE/KIND/NAME (e.g. default/Deployment/db)")
        kind = kinds.get(parts[1].lower())
        if kind is None:
            raise ValueError(
                f"{text!r}: a fence stops only {', '.join(sorted(kinds.values()))}, not {parts[1]!r}; "
                "give NAMESPACE/KIND/NAME of one of them"
            )
        return cls(parts[0], kind, parts[2])

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


def current_now(volume: VolumeCopies, worker: str) -> Verdict:
    """The fence's verdict on `volume` with `worker` fenced, except that a copy current now counts
    wherever it is (the worker's too, once its Node is Ready and unfenced: `Copy.current` holds
    the rest of the rule)."""
    if any(c.current for c in volume.copies if c.held_data):
        return Verdict.MOVES
    return volume.verdict(worker)


def refusal(owner: Owner, worker: str, verdict: Verdict, volumes: list[VolumeCopies]) -> str:
    """Why `owner` is not started (its verdict STALE without consent, or ONLY_COPY)."""
    if verdict is Verdict.ONLY_COPY:
        only = ", ".join(v.volume for v in volumes if current_now(v, worker) is Verdict.ONLY_COPY)
        return (
            f"{owner} is not started: no node but {worker} ever held a copy of {only}, so there is nothing to start "
            f"it from (no consent changes that). Bring {worker} back and lift its fence, which starts it; if {worker} "
            "is gone for good, restore the volume's data (its host was left as it is), then start it yourself"
        )
    lines = "; ".join(v.line() for v in volumes if current_now(v, worker) is Verdict.STALE)
    return (
        f"{owner} is not started: no node that is Ready and not fenced holds a current copy, and these may be older "
        f"than the one on {worker}: {lines}. To start it from them, run {start_command(owner)} --accept-stale-data"
    )


async def start_workload(
    api: ClusterApi, ref: WorkloadRef, *, accept_stale_data: bool, progress: Progress, server: str
) -> str:
    """Start the workload `ref` a fence stopped (see the module docstring); the report's line.
    Raises WorkloadStartRefusedError, changing nothing, when it may not start."""
    owner = Owner(ref.kind, ref.namespace, ref.name)
    out = await api.kubectl(
        ["get", owner.resource, owner.name, "-n", owner.namespace, "-o", "json", "--ignore-not-found"],
        repeat=Repeat.READ,
    )
    if not out.strip():
        raise WorkloadStartRefusedError(server, f"the cluster has no {owner}: check NAMESPACE/KIND/NAME ({ref})")
    obj: dict[str, Any] = json.loads(out)
    record = stop_record(obj)
    above = controller_of(obj)
    if ref.kind == "ReplicaSet" and above is not None and above[0] == "Deployment" and record is not None:
        raise WorkloadStartRefusedError(
            server,
            f"{owner} belongs to Deployment {ref.namespace}/{above[1]}, which the fence stopped (the ReplicaSet "
            f"carries a copy of its record): run {COMMAND} {ref.namespace}/Deployment/{above[1]}",
        )
    if record is None or not record.get("node"):
        if any(value.split(" ")[-1] == owner.ref for value in (await read_holds(api)).values()):
            # Held with no record to restore from: the object was made again (or its record removed by
            # hand) since the fence stopped it. The hold alone would refuse its scale-ups for ever.
            await release(api, owner.ref)
            return (
                f"{owner} carries no {STOPPED_ANNOTATION} record (made again since a fence stopped it, or the "
                f"record removed): its hold ({HOLDS_CONFIGMAP} in kube-system) is removed, nothing else changed"
            )
        raise WorkloadStartRefusedError(
            server, f"{owner} was not stopped by a fence (no {STOPPED_ANNOTATION} record on it): nothing to start"
        )
    worker = str(record["node"])
    nodes = (await read_json(api, "nodes")).get("items") or []
    copies = await copies_now(api)
    volumes = recorded_volumes(record, copies)
    verdict = max((current_now(v, worker) for v in volumes), default=Verdict.MOVES)
    if verdict is Verdict.ONLY_COPY or (verdict is Verdict.STALE and not accept_stale_data):
        raise WorkloadStartRefusedError(server, refusal(owner, worker, verdict, volumes))
    await release(api, owner.ref)  # first: the fence's hold refuses the start patch (fence_holds)
    await api.patch_merge(owner.resource, owner.name, owner.namespace, start_patch(owner, record))
    consent = " (stale copies accepted: --accept-stale-data)" if verdict is Verdict.STALE else ""
    progress(f"{owner} started again{consent}")
    await forget_in_summary(api, worker, str(owner), nodes)
    size = (
        f"suspend: {str(bool(record.get('suspend'))).lower()}"
        if owner.kind in SUSPENDED
        else f"replicas: {int(record.get('replicas', 1))}"
    )
    how = "; ".join(v.line() for v in volumes) or "no volume recorded"
    return f"{owner} started again ({size}), stopped by the fence of {worker}: {how}{consent}"


async def forget_in_summary(api: ClusterApi, worker: str, owner: str, nodes: list[dict[str, Any]]) -> None:
    """Drop `owner` from the fenced Node's summary of what its fence keeps stopped (when the Node is left)."""
    node = next((n for n in nodes if (n.get("metadata") or {}).get("name") == worker), None)
    if node is None:
        return
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_STOPPED_ANNOTATION) or "{}"
    try:
        summary = json.loads(text)
    except ValueError:
        return
    if not isinstance(summary, dict) or owner not in summary:
        return
    summary.pop(owner)
    # Removed when nothing is left stopped, as the fence's own summary is.
    left = json.dumps(summary, sort_keys=True) if summary else None
    patch = {"metadata": {"annotations": {NODE_STOPPED_ANNOTATION: left}}}
    await api.kubectl(["patch", "node", worker, "--type", "merge", "-p", json.dumps(patch)], repeat=Repeat.IDEMPOTENT)


def stopped_lines(objects: Sequence[Mapping[str, Any]], worker: str) -> list[str]:
    """A line per workload `worker`'s fence keeps stopped, with the command that starts it."""
    lines = []
    for obj in objects:
        record = stop_record(obj)
        above = controller_of(obj)
        if record is None or record.get("node") != worker:
            continue
        if obj.get("kind") == "ReplicaSet" and above is not None and above[0] == "Deployment":
            continue  # a copy of its Deployment's record
        meta = obj["metadata"]
        owner = Owner(str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))
        reason = str(record.get("reason") or "")
        fix = " --accept-stale-data" if reason == REASON[Verdict.STALE] else ""
        lines.append(
            f"{owner} stays stopped by the fence ({reason}); nothing starts it on its own: start it with "
            f"{start_command(owner)}{fix} (refused, changing nothing, while no copy elsewhere may serve it)"
        )
    return sorted(lines)


async def read_stopped_lines(api: ClusterApi, worker: str) -> list[str]:
    """`stopped_lines` of every owner kind a fence stops, read through the API."""
    return stopped_lines(await read_stoppable(api), worker)


async def start_workload_through(
    server: SshTarget, ref: WorkloadRef, *, accept_stale_data: bool, api_wait: float, progress: Progress
) -> str:
    """`start_workload` through the server's API."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        return await start_workload(
            api, ref, accept_stale_data=accept_stale_data, progress=progress, server=server.node
        )


def runs(obj: Mapping[str, Any]) -> str:
    """How a stoppable owner runs now ("" when it does not): replicas wanted or pods left, its
    suspension lifted or Jobs active."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if obj.get("kind") in SUSPENDED:
        active = status.get("active")
        count = len(active) if isinstance(active, list) else int(active or 0)
        parts = [*([] if spec.get("suspend") else ["suspend: false"]), *([f"{count} active"] if count else [])]
    else:
        wanted, pods = int(spec.get("replicas") or 0), int(status.get("replicas") or 0)
        parts = [*([f"replicas: {wanted}"] if wanted else []), *([f"{pods} pod(s)"] if pods else [])]
    return ", ".join(parts)


def held_running(objects: Sequence[Mapping[str, Any]], stack: str) -> list[str]:
    """A line per workload a fence stopped (its record on it) that runs anyway: something started it
    past the hold (node_operations/fence_holds.py), or while the hold was missing."""
    lines = []
    for obj in objects:
        record = stop_record(obj)
        above = controller_of(obj)
        if record is None or not record.get("node"):
            continue
        if obj.get("kind") == "ReplicaSet" and above is not None and above[0] == "Deployment":
            continue  # a copy of its Deployment's record: the Deployment is named
        how = runs(obj)
        if not how:
            continue
        meta = obj["metadata"]
        owner = Owner(str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))
        worker = str(record["node"])
        lines.append(
            f"{owner} is held stopped by the fence of {worker} ({record.get('reason')}) but runs anyway ({how}): "
            f"something started it past the hold, on copies that may be older than the one on {worker}. Scale it "
            f"to 0 (or suspend it) and check its data; to start it from them, run "
            f"{hold_start_command(stack)} {owner.ref} --accept-stale-data"
        )
    return sorted(lines)


async def read_held_running(api: ClusterApi, stack: str) -> list[str]:
    """`held_running` of every owner kind a fence stops, read through the API."""
    return held_running(await read_stoppable(api), stack)


async def held_running_through(server: SshTarget, stack: str, api_wait: float) -> list[str]:
    """`read_held_running` through the server's API (for `status`)."""
    async with open_session(server) as session:
        return await read_held_running(ClusterApi(session, api_wait=api_wait), stack)
