"""The fence's decision per workload whose pods on the fenced worker use Longhorn volumes, and
the start of what it stopped.

A Longhorn volume keeps copies (replicas) on several nodes; the one on the fenced worker may be
the newest. Starting the workload elsewhere from a copy that missed its last writes loses those
writes without a word, so before the worker is tainted out of service each such workload is
judged by the copies of its volumes on the *other* nodes (Longhorn's replica fields):

- **current**: a copy healthy since it last failed (`healthyAt` set, `failedAt` empty) holds every
  write the volume took, as far as Longhorn heard, and it is current only while its node is Ready
  and not fenced (no `hk3s.dev/fenced-at`, no out-of-service taint) and Longhorn hears the
  volume's engine. Longhorn's manager marks a copy failed only once it notices its node went (the
  manager that owns the volume may have run on the fenced worker itself), so its fields alone can
  call a copy on a dead node current; a workload started from it would not start, or would start
  on whatever copy is left. And the copies' fields change only from the engine's own report: the
  engine runs where the volume is attached (the fenced worker, for its pods' volumes), and once
  its node goes silent Longhorn reads it `unknown` and changes no copy (longhorn-manager
  `controller/instance_handler.go`, `controller/volume_controller.go`
  `ReconcileEngineReplicaState`), while that engine may have dropped the other copies and gone on
  writing alone. So while the engine reads `unknown` (or `running` on a node that cannot serve),
  every copy on another node may be older (`unheard_engines`); the stop record keeps that
  (`ENGINE_UNKNOWN_KEY`), since the engine reads `stopped` once the volume is detached. A copy
  that is not current but held data counts as one that may be older. With a current copy of every
  one of its volumes the workload may start elsewhere: Kubernetes deletes its pods once the node
  is tainted, and its controller starts them on another node. The copies are read again right
  before the taint (`WorkloadDecision.recheck`): one let go whose verdict turned worse meanwhile
  is stopped then.
- **stale**: copies elsewhere that were healthy once but failed since (`failedAt` set), or are not
  current for the reasons above, may be older than the lost one. The workload stays stopped until
  the operator accepts that (`hk3s:fences.<worker>.accept_stale_data`); the report lists every
  copy with its `lastHealthyAt` and `lastFailedAt`.
- **only copy**: no other node ever held a healthy copy. The workload stays stopped until the
  worker rejoins; no consent starts it, since there is nothing to start it from.
A workload takes the worst verdict among its volumes. A copy never healthy holds no data and
does not count.

Stopping means what the workload's controller can be told: a Deployment, StatefulSet or a
ReplicaSet no Deployment owns is scaled to zero, a Job is suspended. A controller cannot leave
out one pod, so a StatefulSet stops whole, its pods on other nodes too. A stopped workload's
owners are walked to the top, since an owner left running starts it again: a Job's CronJob is
suspended too (else it makes the next Job on another node, on the copy that may be stale), with a
record of its own, before the Job; a workload controlled by anything else (an operator's custom
resource, which scales its Deployment or StatefulSet back) is not scaled, since that would not
hold, and is named instead (`WorkloadReport.unheld`, the Node's `NODE_UNHELD_ANNOTATION`, which
`status(check_hosts=True)` reads): the operator stops it or accepts what starts. The stop and its record
are one merge patch of the owner (`STOPPED_ANNOTATION`: the worker, why, the former replica count
or suspension, the volumes), so an interrupted run finds either both or neither; a resumed fence
keeps the record's verdict and does not judge that owner again. Before its stop each owner is held
(node_operations/fence_holds.py: the API server then refuses a scale-up or un-suspend of it from
outside), and every start removes the hold before its patch. The Node carries a summary
(`NODE_STOPPED_ANNOTATION`) for the operator. A pod with Longhorn volumes and no owner the
program can stop (a bare pod, a DaemonSet's, another controller's) is named in a warning: the
taint deletes it and the program cannot say whether something starts it on an older copy.

Starting (`start_stopped`: after consent, or at the lift) judges a stopped workload again by its
recorded volumes: current copies, or with consent stale ones, let it start; at the lift the
rejoined worker's copies count again, and the worker's copy that failed last (no other failed
later) is the newest one, since the workload was stopped from then on.

After the taint the fence deletes no pod itself: Kubernetes deletes them (taint eviction, then the
pod garbage collector for pods terminating on an out-of-service node) and only then releases their
volumes. Its attach-detach controller keeps a pod's volume attached to the pod's node until the
pod is terminated or gone (pkg/controller/volume/attachdetach/util/util.go, DetermineVolumeAction),
so a pod Kubernetes has not deleted still holds its VolumeAttachment: a deletion by the fence
"once the volume is detached" would wait on a state Kubernetes does not produce.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from node_operations.fence_holds import Held, hold, hold_entries, read_holds, release
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from node_operations.longhorn_objects import longhorn_items
from node_operations.volume_copies import NODE_UNHELD_ANNOTATION
from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import SshTarget, open_session

# On an owner the fence stopped: JSON {"node", "reason", "replicas" | "suspend", "volumes"}.
STOPPED_ANNOTATION = "hk3s.dev/fence-stopped"
# In that record: {volume: node} of the volumes whose engine Longhorn could not hear at the stop.
ENGINE_UNKNOWN_KEY = "engine_unknown_on"
# On the fenced Node: JSON {"Kind namespace/name": reason} of what its fence keeps stopped.
NODE_STOPPED_ANNOTATION = "hk3s.dev/fence-stopped-workloads"
LONGHORN_DRIVER = "driver.longhorn.io"
# The owners the fence can stop: kind -> the kubectl resource and how it is stopped.
# The command that starts one workload a fence stopped (node_operations/workload_start.py).
START_COMMAND = "scripts/hk3s workload start"
SCALED = {"Deployment": "deployment", "StatefulSet": "statefulset", "ReplicaSet": "replicaset"}
SUSPENDED = {"Job": "job", "CronJob": "cronjob"}
# The owners above a stoppable workload the fence stops too: (kind, its controller's kind). Any
# other controller above a workload is one the program cannot stop.
STOPPABLE_PARENTS = {("ReplicaSet", "Deployment"), ("Job", "CronJob")}

Progress = Callable[[str], None]


class Verdict(enum.IntEnum):
    """A volume's (and a workload's, the worst of its volumes) verdict; higher is worse."""

    MOVES = 0
    STALE = 1
    ONLY_COPY = 2


REASON = {Verdict.STALE: "stale", Verdict.ONLY_COPY: "only-copy"}


@dataclass(frozen=True)
class Copy:
    """One replica of a Longhorn volume, by Longhorn's own fields."""

    node: str
    healthy_at: str = ""
    failed_at: str = ""
    last_healthy_at: str = ""
    last_failed_at: str = ""
    unavailable: str = ""  # why its node cannot serve it now (NotReady, fenced); "" when it can
    # The node of its volume's engine when Longhorn cannot hear that engine (state unknown, or so
    # recorded by the fence) and this copy is on another node: its fields may be behind the data.
    engine_unheard_on: str | None = None

    @classmethod
    def of(
        cls,
        replica: Mapping[str, Any],
        unavailable: Mapping[str, str] | None = None,
        unheard: Mapping[str, str] | None = None,
    ) -> Copy:
        spec = replica.get("spec") or {}
        node = str(spec.get("nodeID") or "")
        engine_node = (unheard or {}).get(str(spec.get("volumeName") or ""))
        return cls(
            node=node,
            healthy_at=str(spec.get("healthyAt") or ""),
            failed_at=str(spec.get("failedAt") or ""),
            last_healthy_at=str(spec.get("lastHealthyAt") or ""),
            last_failed_at=str(spec.get("lastFailedAt") or ""),
            unavailable=(unavailable or {}).get(node, ""),
            engine_unheard_on=engine_node if engine_node is not None and engine_node != node else None,
        )

    @property
    def current(self) -> bool:
        """Healthy since it last failed, on a node that is Ready and not fenced, and its fields
        heard from the volume's engine (not one Longhorn lost: see `engine_unheard_on`): it holds
        every write the volume took and can be started from now."""
        return bool(
            self.node
            and self.healthy_at
            and not self.failed_at
            and not self.unavailable
            and self.engine_unheard_on is None
        )

    @property
    def held_data(self) -> bool:
        """Placed and healthy at some time (a copy never healthy holds nothing)."""
        return bool(self.node and (self.healthy_at or self.last_healthy_at))

    def line(self) -> str:
        if self.current:
            state = "current"
        elif self.failed_at:
            state = "failed"
        elif self.unavailable:
            state = f"not current: {self.unavailable}"
        else:
            state = f"may be older: {unheard_why(self.engine_unheard_on or '')}"
        return (
            f"{self.node} ({state}; lastHealthyAt {self.last_healthy_at or 'never'}, "
            f"lastFailedAt {self.last_failed_at or 'never'})"
        )


@dataclass(frozen=True)
class VolumeCopies:
    """A Longhorn volume a workload uses, through its claim, and every copy of it."""

    volume: str
    claim: str  # namespace/name
    copies: tuple[Copy, ...] = ()

    def verdict(self, worker: str, *, worker_back: bool = False) -> Verdict:
        """The volume's verdict with `worker` fenced (or, `worker_back`, rejoining)."""
        copies = self.copies
        if worker_back:
            # Rejoined and validated Ready: its fence record is removed only after this judgement.
            # Its engine is heard again too: the worker's own copies count, as the newest.
            copies = tuple(
                dataclasses.replace(
                    c,
                    unavailable="" if c.node == worker else c.unavailable,
                    engine_unheard_on=None if c.engine_unheard_on == worker else c.engine_unheard_on,
                )
                for c in copies
            )
        held = [c for c in copies if c.held_data]
        others = [c for c in held if c.node != worker]
        if any(c.current for c in (held if worker_back else others)):
            return Verdict.MOVES
        mine = [c for c in held if c.node == worker]
        if worker_back and mine:
            # The workload was stopped when the worker went down: a worker's copy that failed no
            # earlier than every other copy took the last writes.
            newest_mine = max(c.last_failed_at or c.failed_at for c in mine)
            if all((c.last_failed_at or c.failed_at) <= newest_mine for c in others):
                return Verdict.MOVES
        return Verdict.STALE if others else Verdict.ONLY_COPY

    def line(self) -> str:
        copies = ", ".join(c.line() for c in self.copies if c.held_data) or "none"
        return f"volume {self.volume} (claim {self.claim}): copies on {copies}"

    def engine_unheard_on(self) -> str | None:
        """The node of the volume's engine Longhorn cannot hear (None when it hears it)."""
        return next((c.engine_unheard_on for c in self.copies if c.engine_unheard_on is not None), None)


def unheard_why(engine_node: str) -> str:
    """Why a copy's fields may be behind the data while its volume's engine is not heard."""
    where = f" on {engine_node}" if engine_node else ""
    return (
        f"the volume's engine{where} reads unknown to Longhorn, which has heard nothing from it since its node went "
        "silent, while it may have gone on writing without this copy"
    )


def recorded_volumes(record: Mapping[str, Any], copies: Mapping[str, tuple[Copy, ...]]) -> list[VolumeCopies]:
    """The volumes of a fence's stop record with their copies now. A volume whose engine the
    fence found unheard keeps that mark (`ENGINE_UNKNOWN_KEY`) while the record lasts: once the
    volume is detached Longhorn reads its engine stopped, but it still never heard what that
    engine wrote."""
    recorded = record.get(ENGINE_UNKNOWN_KEY) or {}
    found = []
    for volume, claim in record.get("volumes") or []:
        these = copies.get(volume, ())
        if isinstance(recorded, dict) and volume in recorded:
            node = str(recorded[volume])
            these = tuple(
                c
                if c.engine_unheard_on is not None or c.node == node
                else dataclasses.replace(c, engine_unheard_on=node)
                for c in these
            )
        found.append(VolumeCopies(volume, claim, these))
    return found


@dataclass(frozen=True)
class Owner:
    """A controller the fence can stop."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def resource(self) -> str:
        return {**SCALED, **SUSPENDED}[self.kind]

    @property
    def ref(self) -> str:
        """NAMESPACE/KIND/NAME, as `workload start` takes it."""
        return f"{self.namespace}/{self.kind}/{self.name}"


@dataclass
class Workload:
    """The pods of one owner on the worker and the Longhorn volumes they use."""

    owner: Owner
    pods: list[str] = field(default_factory=list)
    volumes: dict[str, VolumeCopies] = field(default_factory=dict)
    controllers: set[str] = field(default_factory=set)  # its pods' own controllers ("ReplicaSet ns/name")

    def verdict(self, worker: str, *, worker_back: bool = False) -> Verdict:
        return max((v.verdict(worker, worker_back=worker_back) for v in self.volumes.values()), default=Verdict.MOVES)


def start_command(owner: Owner) -> str:
    """The command line that starts `owner`, a workload a fence stopped, with its record."""
    return f"{START_COMMAND} {owner.namespace}/{owner.kind}/{owner.name}"


def why_stopped(owner: Owner, verdict: Verdict, worker: str, volumes: list[VolumeCopies], *, worker_back: bool) -> str:
    """The report's line for a workload that stays stopped."""
    if worker_back:
        lines = "; ".join(v.line() for v in volumes)
        if verdict is Verdict.STALE:
            # `workload start` judges it by the same rule and drops its record in the same patch
            # that starts it, so nobody edits the record by hand.
            how = f"Check its data, then start it from them with {start_command(owner)} --accept-stale-data"
        else:
            how = "No copy of its data is left anywhere: restore its data, then start it yourself"
        return (
            f"{owner} stays stopped although {worker} rejoined: no current copy, and the worker's is not the "
            f"newest: {lines}. {how}"
        )
    if verdict is Verdict.ONLY_COPY:
        only = ", ".join(v.volume for v in volumes if v.verdict(worker) is Verdict.ONLY_COPY)
        return (
            f"{owner} stays stopped until {worker} rejoins: the only copy of {only} is on {worker} (lift the fence "
            "once the worker is back: it starts then)"
        )
    lines = "; ".join(v.line() for v in volumes if v.verdict(worker) is Verdict.STALE)
    return (
        f"{owner} stays stopped: no other node holds a current copy, and these may be older than the one on "
        f"{worker}: {lines}. To start it from them, run {start_command(owner)} --accept-stale-data (this one), "
        f"or set hk3s:fences.{worker}.accept_stale_data: true and run up (every one); otherwise it starts when "
        f"{worker} rejoins"
    )


def why_unheld(owner: str, by: str, verdict: Verdict, worker: str, volumes: list[VolumeCopies]) -> str:
    """The report's (and `status`'s) line for a workload the fence may not start elsewhere but
    cannot hold stopped: its owner `by` would start it again."""
    if verdict is Verdict.ONLY_COPY:
        only = ", ".join(v.volume for v in volumes if v.verdict(worker) is Verdict.ONLY_COPY)
        what = f"with none of its data (the only copy of {only} is on {worker})"
    else:
        lines = "; ".join(v.line() for v in volumes if v.verdict(worker) is Verdict.STALE)
        what = f"on copies that may be older than the one on {worker}: {lines}"
    return (
        f"{owner} is owned by {by}, which the fence cannot stop (it would start {owner} again), so it was left "
        f"as it is and may start elsewhere {what}. Stop {by} yourself (its own way: scale it to 0 or pause it), "
        f"then lift the fence once {worker} is back; or check its data and accept what starts"
    )


@dataclass
class WorkloadReport:
    """What the decision did: where workloads may go, what stays stopped and why, warnings."""

    moving: dict[str, str] = field(default_factory=dict)  # owner -> its volumes' current copies
    stopped: dict[str, str] = field(default_factory=dict)  # owner -> why it stays stopped
    started: dict[str, str] = field(default_factory=dict)  # owner -> from which copies
    unjudged: list[str] = field(default_factory=list)  # warnings: pods the program cannot judge
    # Workloads that may not start elsewhere but whose owner the fence cannot stop: owner -> why.
    unheld: dict[str, str] = field(default_factory=dict)
    # The controllers of the pods of workloads kept stopped ("ReplicaSet ns/name"): none runs anew.
    stopped_controllers: set[str] = field(default_factory=set)

    def lines(self) -> list[str]:
        lines = [f"{owner} may start elsewhere: {how}" for owner, how in sorted(self.moving.items())]
        lines += [f"{owner} started again: {how}" for owner, how in sorted(self.started.items())]
        lines += list(self.stopped[owner] for owner in sorted(self.stopped))
        lines += [f"not held stopped: {self.unheld[owner]}" for owner in sorted(self.unheld)]
        lines += [f"warning: {line}" for line in self.unjudged]
        return lines


@dataclass
class ClaimMap:
    """The cluster's claims bound to Longhorn volumes, read once."""

    longhorn: dict[str, str]  # "namespace/claim" -> Longhorn volume name
    bound: dict[str, str]  # "namespace/claim" -> its PersistentVolume's name

    @classmethod
    def of(cls, claims: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> ClaimMap:
        handles = {
            v["metadata"]["name"]: str(v["spec"]["csi"].get("volumeHandle") or "")
            for v in volumes
            if ((v.get("spec") or {}).get("csi") or {}).get("driver") == LONGHORN_DRIVER
        }
        longhorn, bound = {}, {}
        for claim in claims:
            pv = str((claim.get("spec") or {}).get("volumeName") or "")
            if handles.get(pv):
                name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                longhorn[name], bound[name] = handles[pv], pv
        return cls(longhorn, bound)

    @classmethod
    async def read(cls, api: ClusterApi) -> ClaimMap:
        claims, volumes = await read_json(api, "pvc", "-A"), await read_json(api, "pv")
        return cls.of(claims.get("items") or [], volumes.get("items") or [])

    def volumes_of(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """The pod's Longhorn volumes: claim ("namespace/name") -> volume (generic ephemeral
        volumes included: their claim is named `<pod>-<volume>`)."""
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        found = {}
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            if volume.get("persistentVolumeClaim"):
                claim = f"{namespace}/{volume['persistentVolumeClaim']['claimName']}"
            elif volume.get("ephemeral"):
                claim = f"{namespace}/{name}-{volume['name']}"
            else:
                continue
            if claim in self.longhorn:
                found[claim] = self.longhorn[claim]
        return found


def copies_by_volume(
    replicas: list[dict[str, Any]],
    unavailable: Mapping[str, str] | None = None,
    unheard: Mapping[str, str] | None = None,
) -> dict[str, tuple[Copy, ...]]:
    """Each volume's copies; `unavailable` (node -> why, `unavailable_nodes`) marks the copies
    whose node cannot serve them now, `unheard` (volume -> its engine's node, `unheard_engines`)
    the copies whose fields may be behind their volume's engine."""
    found: dict[str, list[Copy]] = {}
    for replica in replicas:
        volume = str((replica.get("spec") or {}).get("volumeName") or "")
        found.setdefault(volume, []).append(Copy.of(replica, unavailable, unheard))
    return {volume: tuple(copies) for volume, copies in found.items()}


def unheard_engines(engines: list[dict[str, Any]], unavailable: Mapping[str, str] | None = None) -> dict[str, str]:
    """volume -> node of each volume whose engine Longhorn cannot hear: one that reads `unknown`,
    or reads `running` on a node that cannot serve (`unavailable_nodes`: the manager that would
    mark it unknown may have run on that node itself, and another takes it over only later).
    Longhorn marks a started engine's instance unknown when its node is down or cut off
    (longhorn-manager controller/instance_handler.go), and then changes none of its volume's
    copies (controller/volume_controller.go ReconcileEngineReplicaState returns at once): the
    engine may have dropped the other copies and gone on writing without them, unseen, so their
    healthy fields prove nothing."""
    found = {}
    for engine in engines:
        spec, status = engine.get("spec") or {}, engine.get("status") or {}
        state, node = status.get("currentState"), str(spec.get("nodeID") or "")
        if spec.get("volumeName") and (state == "unknown" or (state == "running" and node in (unavailable or {}))):
            found[str(spec["volumeName"])] = node
    return found


def unavailable_nodes(nodes: list[dict[str, Any]], replicas: list[dict[str, Any]]) -> dict[str, str]:
    """The nodes whose copies cannot be current, with why: NotReady (a copy there cannot be
    started from, and Longhorn may not have marked it failed yet), fenced (its fence record),
    tainted out of service, or gone from the cluster (a node the copies name that has no Node: a
    worker given up or deleted is not Ready either)."""
    found = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        conditions = (node.get("status") or {}).get("conditions") or []
        taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
        if FENCE_ANNOTATION in (meta.get("annotations") or {}):
            found[str(meta["name"])] = f"its node is fenced ({FENCE_ANNOTATION})"
        elif OUT_OF_SERVICE_TAINT in taints:
            found[str(meta["name"])] = f"its node is tainted {OUT_OF_SERVICE_TAINT}"
        elif next((c.get("status") for c in conditions if c.get("type") == "Ready"), "") != "True":
            found[str(meta["name"])] = "its node is NotReady"
    known = {str((n.get("metadata") or {}).get("name")) for n in nodes}
    for replica in replicas:
        node_id = str((replica.get("spec") or {}).get("nodeID") or "")
        if node_id and node_id not in known:
            found[node_id] = "its node is not in the cluster"
    return found


async def copies_now(api: ClusterApi) -> dict[str, tuple[Copy, ...]]:
    """Every volume's copies as they stand now, those on nodes that cannot serve them marked so
    (`unavailable_nodes`), and those whose volume's engine Longhorn cannot hear (`unheard_engines`).
    The one reading of the rule "a current copy is healthy now, as its engine last told Longhorn
    while Longhorn could hear it, on a node that is Ready and not fenced": the fence, `status` and
    `workload start` all judge through it."""
    nodes = (await read_json(api, "nodes")).get("items") or []
    replicas = await longhorn_items(api, "replicas.longhorn.io")
    engines = await longhorn_items(api, "engines.longhorn.io")
    unavailable = unavailable_nodes(nodes, replicas)
    return copies_by_volume(replicas, unavailable, unheard_engines(engines, unavailable))


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller, or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref["kind"]), str(ref["name"])
    return None


def pod_label(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def stoppable_owner(pod: Mapping[str, Any], replicaset: Mapping[str, Any] | None) -> Owner | None:
    """The controller the fence can stop for `pod` (`replicaset`: its ReplicaSet, when that is its
    controller): a ReplicaSet's Deployment, else the ReplicaSet itself, a StatefulSet or a Job;
    None for a pod with no controller or another kind's (a DaemonSet's, an operator's)."""
    ref, namespace = controller_of(pod), pod["metadata"]["namespace"]
    if ref is None:
        return None
    kind, name = ref
    if kind == "ReplicaSet":
        if replicaset is None:
            return None  # gone: nothing to scale
        above = controller_of(replicaset)
        if above is not None and above[0] != "Deployment":
            return None  # another controller scales this ReplicaSet and would undo a scale
        kind, name = above or (kind, name)
    return Owner(kind, namespace, name) if kind in SCALED or kind in SUSPENDED else None


def parent_of(owner: Owner, obj: Mapping[str, Any]) -> Owner | str | None:
    """What controls `owner` (its object `obj`): the parent the fence stops too (a Job's CronJob,
    a ReplicaSet's Deployment), the name of a controller it cannot stop ("App default/db"), or
    None at the top."""
    ref = controller_of(obj)
    if ref is None:
        return None
    kind, name = ref
    if (owner.kind, kind) in STOPPABLE_PARENTS:
        return Owner(kind, owner.namespace, name)
    return f"{kind} {owner.namespace}/{name}"


def stopped_by(obj: Mapping[str, Any], worker: str) -> Owner | None:
    """The owner `obj` is, when `worker`'s fence stopped it (its record on it)."""
    record = stop_record(obj)
    if record is None or record.get("node") != worker:
        return None
    # A Deployment's ReplicaSets carry copies of its annotations: the Deployment is the one stopped.
    # A CronJob's Job carries a record of its own (the CronJob's annotations are not copied).
    above = controller_of(obj)
    if obj.get("kind") == "ReplicaSet" and above is not None and above[0] == "Deployment":
        return None
    meta = obj["metadata"]
    return Owner(str(obj["kind"]), meta["namespace"], meta["name"])


def stop_patch(
    owner: Owner, obj: Mapping[str, Any], worker: str, verdict: Verdict, volumes: list[VolumeCopies]
) -> dict[str, Any]:
    """One merge patch that records the stop on the owner and stops it (so neither happens alone)."""
    spec = obj.get("spec") or {}
    record: dict[str, Any] = {
        "node": worker,
        "reason": REASON[verdict],
        "volumes": [[v.volume, v.claim] for v in volumes],
    }
    unheard = {v.volume: node for v in volumes if (node := v.engine_unheard_on()) is not None}
    if unheard:
        record[ENGINE_UNKNOWN_KEY] = unheard
    if owner.kind in SUSPENDED:
        record["suspend"] = bool(spec.get("suspend"))
        change: dict[str, Any] = {"suspend": True}
    else:
        record["replicas"] = int(spec["replicas"]) if spec.get("replicas") is not None else 1
        change = {"replicas": 0}
    return {"metadata": {"annotations": {STOPPED_ANNOTATION: json.dumps(record, sort_keys=True)}}, "spec": change}


def start_patch(owner: Owner, record: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that starts a stopped owner as it was and drops the record, at once."""
    change = (
        {"suspend": bool(record.get("suspend"))}
        if owner.kind in SUSPENDED
        else {"replicas": int(record.get("replicas", 1))}
    )
    return {"metadata": {"annotations": {STOPPED_ANNOTATION: None}}, "spec": change}


def stop_record(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fence's record on an owner, or None (a record that is not JSON is not the fence's)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(STOPPED_ANNOTATION)
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


async def read_json(api: ClusterApi, *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json`, read (repeated through an API outage)."""
    found: dict[str, Any] = json.loads(await api.kubectl(["get", *args, "-o", "json"], repeat=Repeat.READ))
    return found


async def read_stoppable(api: ClusterApi) -> list[dict[str, Any]]:
    """Every object, in every namespace, of the kinds a fence stops (scaled or suspended)."""
    kinds = ",".join(sorted({*SCALED.values(), *SUSPENDED.values()}))
    return list((await read_json(api, kinds, "-A")).get("items") or [])


class WorkloadDecision:
    """The decision for one fenced worker, through the server's API."""

    def __init__(
        self, api: ClusterApi, worker: str, progress: Progress, *, accept_stale_data: bool, stack: str = ""
    ) -> None:
        self.api, self.worker, self.progress = api, worker, progress
        self.accept_stale_data = accept_stale_data
        self.stack = stack  # named in the hold's refusal (node_operations/fence_holds.py)
        self.report = WorkloadReport()
        self.unjudged_pods: list[str] = []  # pods with Longhorn volumes and no owner the fence can stop
        self.let_go: dict[Owner, Workload] = {}  # judged free to start elsewhere (judged again: `recheck`)

    async def _owner(self, pod: Mapping[str, Any]) -> Owner | None:
        ref = controller_of(pod)
        replicaset = None
        if ref is not None and ref[0] == "ReplicaSet":
            out = await self.api.kubectl(
                ["get", "replicaset", ref[1], "-n", pod["metadata"]["namespace"], "-o", "json", "--ignore-not-found"],
                repeat=Repeat.READ,
            )
            replicaset = json.loads(out) if out.strip() else None
        return stoppable_owner(pod, replicaset)

    async def _object(self, owner: Owner) -> dict[str, Any] | None:
        out = await self.api.kubectl(
            ["get", owner.resource, owner.name, "-n", owner.namespace, "-o", "json", "--ignore-not-found"],
            repeat=Repeat.READ,
        )
        return json.loads(out) if out.strip() else None

    async def _owners_above(
        self, owner: Owner, obj: Mapping[str, Any]
    ) -> tuple[list[tuple[Owner, dict[str, Any]]], str]:
        """The owners above `owner` the fence stops too, top first, with their objects; and the
        name of a controller above them the program cannot stop ("" when there is none)."""
        above: list[tuple[Owner, dict[str, Any]]] = []
        current, current_obj = owner, obj
        while (parent := parent_of(current, current_obj)) is not None:
            if isinstance(parent, str):
                return above, parent
            parent_obj = await self._object(parent)
            if parent_obj is None:
                break  # gone: nothing above starts it again
            above.insert(0, (parent, parent_obj))
            current, current_obj = parent, parent_obj
        return above, ""

    async def workloads(self, pods: list[dict[str, Any]]) -> dict[Owner, Workload]:
        """The worker's pods with Longhorn volumes, by owner; the ones without one named in warnings
        (and in `unjudged_pods`). Read-only: `status` reads the stranded workloads through it."""
        workloads: dict[Owner, Workload] = {}
        if not pods:
            return workloads
        claims = await ClaimMap.read(self.api)
        with_volumes = [(pod, claims.volumes_of(pod)) for pod in pods]
        with_volumes = [(pod, used) for pod, used in with_volumes if used]
        if not with_volumes:
            return workloads
        copies = await copies_now(self.api)
        for pod, used in with_volumes:
            owner = await self._owner(pod)
            if owner is None:
                ref = controller_of(pod)
                by = f"owned by {ref[0]} {ref[1]}" if ref else "no owner"
                self.unjudged_pods.append(pod_label(pod))
                self.report.unjudged.append(
                    f"pod {pod_label(pod)} uses Longhorn volume(s) {', '.join(sorted(used.values()))} on {self.worker} "
                    f"and has no owner the fence can stop ({by}): Kubernetes deletes it with the fence, and whatever "
                    "starts it again may use a copy older than the one on the worker; check its data yourself"
                )
                continue
            workload = workloads.setdefault(owner, Workload(owner))
            workload.pods.append(pod_label(pod))
            ref = controller_of(pod)
            workload.controllers.add(f"{ref[0]} {pod['metadata']['namespace']}/{ref[1]}" if ref else str(owner))
            for claim, volume in used.items():
                workload.volumes[volume] = VolumeCopies(volume, claim, copies.get(volume, ()))
        return workloads

    async def decide(self, pods: list[dict[str, Any]]) -> WorkloadReport:
        """Judge the worker's leaving pods (before the taint); stop what may not start elsewhere,
        held stopped (fence_holds) before its stop."""
        workloads = await self.workloads(pods)
        holds = await read_holds(self.api) if workloads else {}
        for owner, workload in workloads.items():
            obj = await self._object(owner)
            if obj is None:
                self.report.unjudged.append(f"{owner} (pods {', '.join(workload.pods)}) could not be read")
                continue
            record, verdict = stop_record(obj), workload.verdict(self.worker)
            volumes = list(workload.volumes.values())
            above, unstoppable = await self._owners_above(owner, obj)
            if record is not None:
                # Stopped already: by an earlier run of this fence (start_stopped judges it), or by
                # another worker's fence, whose record keeps the count to restore.
                self.report.stopped_controllers |= workload.controllers
                if record.get("node") != self.worker:
                    self.report.stopped[str(owner)] = f"{owner} stays stopped by the fence of {record.get('node')}"
                continue
            if self._may_move(verdict):
                how = "; ".join(v.line() for v in volumes)
                consent = " (stale copies accepted: accept_stale_data)" if verdict is Verdict.STALE else ""
                self.report.moving[str(owner)] = how + consent
                if any(value.split(" ")[-1] == owner.ref for value in holds.values()):
                    # Held by a run of this fence cut before its stop: free to move now.
                    await release(self.api, owner.ref)
                self.let_go[owner] = workload
                continue
            await self._stop(workload, obj, above, unstoppable, verdict)
        await self._record_unheld()
        await self.start_stopped(worker_back=False)
        return self.report

    def _may_move(self, verdict: Verdict) -> bool:
        return verdict is Verdict.MOVES or (verdict is Verdict.STALE and self.accept_stale_data)

    async def _stop(
        self,
        workload: Workload,
        obj: dict[str, Any],
        above: list[tuple[Owner, dict[str, Any]]],
        unstoppable: str,
        verdict: Verdict,
    ) -> None:
        """Stop `workload` (its object `obj`) and the owners `above` it, each with its record; or,
        with a controller above it the program cannot stop, name it instead."""
        owner, volumes = workload.owner, list(workload.volumes.values())
        if unstoppable:
            # Its controller would start it again: a stop there would not hold, so it is named.
            self.report.unheld[str(owner)] = why_unheld(str(owner), unstoppable, verdict, self.worker, volumes)
            self.progress(f"{owner} not stopped: owned by {unstoppable}, which the fence cannot stop")
            return
        self.report.stopped_controllers |= workload.controllers
        # Held before it is stopped, so no moment leaves it stopped and free to be scaled up.
        held = [Held(o.kind, o.namespace, o.name, o.ref) for o, _obj in [*above, (owner, obj)]]
        if owner.kind == "Deployment":
            for controller in sorted(workload.controllers):
                kind, _, at = controller.partition(" ")
                namespace, _, name = at.partition("/")
                if kind == "ReplicaSet":
                    held.append(Held(kind, namespace, name, owner.ref))
        await hold(self.api, self.stack, hold_entries(held, self.worker, REASON[verdict]))
        # Top first, each with its own record: a record on the workload says its owners hold too.
        for parent, parent_obj in [*above, (owner, obj)]:
            if (stop_record(parent_obj) or {}).get("node") == self.worker:
                continue  # stopped by an earlier run of this fence, cut before the workload's stop
            patch = stop_patch(parent, parent_obj, self.worker, verdict, volumes)
            await self.api.patch_merge(parent.resource, parent.name, parent.namespace, patch)
            how = "suspended" if parent.kind in SUSPENDED else "scaled to 0"
            self.progress(f"{parent} {how}: {REASON[verdict]} ({', '.join(workload.volumes)})")

    async def recheck(self) -> WorkloadReport:
        """Judge again, from the copies as they stand now, every workload `decide` let go, right
        before the taint: a copy may have failed, or its node gone, while the fence stopped the
        others (each a patch through the API) or waited on the host. One whose verdict no longer
        lets it start elsewhere is stopped as `decide` would have stopped it."""
        if not self.let_go:
            return self.report
        copies = await copies_now(self.api)
        changed = False
        for owner, workload in list(self.let_go.items()):
            workload.volumes = {
                name: VolumeCopies(name, v.claim, copies.get(name, ())) for name, v in workload.volumes.items()
            }
            verdict = workload.verdict(self.worker)
            if self._may_move(verdict):
                continue
            del self.let_go[owner]
            self.report.moving.pop(str(owner), None)
            obj = await self._object(owner)
            if obj is None:
                self.report.unjudged.append(f"{owner} (pods {', '.join(workload.pods)}) could not be read")
                continue
            self.progress(f"{owner} judged again before the taint: {REASON[verdict]} now")
            above, unstoppable = await self._owners_above(owner, obj)
            await self._stop(workload, obj, above, unstoppable, verdict)
            changed = True
        if changed:
            await self._record_unheld()
            await self.start_stopped(worker_back=False)  # the reasons and the Node's summary
        return self.report

    async def _record_unheld(self) -> None:
        """Add the workloads the fence cannot hold stopped to the Node's list (kept across a resumed
        fence, whose pods may be gone by then; the lift removes it), for `status` to name."""
        if not self.report.unheld:
            return
        node = await read_json(self.api, "node", self.worker)
        text = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_UNHELD_ANNOTATION) or "{}"
        try:
            known = json.loads(text)
        except ValueError:
            known = {}
        merged = {**(known if isinstance(known, dict) else {}), **self.report.unheld}
        patch = {"metadata": {"annotations": {NODE_UNHELD_ANNOTATION: json.dumps(merged, sort_keys=True)}}}
        await self.api.kubectl(
            ["patch", "node", self.worker, "--type", "merge", "-p", json.dumps(patch)], repeat=Repeat.IDEMPOTENT
        )

    async def _stopped(self) -> list[tuple[Owner, dict[str, Any]]]:
        """Every owner this worker's fence keeps stopped, with its record."""
        found = []
        for obj in await read_stoppable(self.api):
            owner, record = stopped_by(obj, self.worker), stop_record(obj)
            if owner is not None and record is not None:
                found.append((owner, record))
        return found

    async def start_stopped(self, *, worker_back: bool) -> WorkloadReport:
        """Start each workload the fence stopped whose volumes now allow it (current copies, or
        stale ones with consent; with `worker_back`, the rejoined worker's too); the rest stay
        stopped, each with its reason. The Node's summary follows."""
        stopped = await self._stopped()
        copies = await copies_now(self.api) if stopped else {}
        still: dict[str, str] = {}
        for owner, record in stopped:
            volumes = recorded_volumes(record, copies)
            verdict = max((v.verdict(self.worker, worker_back=worker_back) for v in volumes), default=Verdict.MOVES)
            if verdict is Verdict.MOVES or (verdict is Verdict.STALE and self.accept_stale_data):
                await release(self.api, owner.ref)  # first: the hold refuses the start patch
                await self.api.patch_merge(owner.resource, owner.name, owner.namespace, start_patch(owner, record))
                consent = " (stale copies accepted: accept_stale_data)" if verdict is Verdict.STALE else ""
                self.report.started[str(owner)] = "; ".join(v.line() for v in volumes) + consent
                self.progress(f"{owner} started again{consent}")
                continue
            self.report.stopped[str(owner)] = why_stopped(owner, verdict, self.worker, volumes, worker_back=worker_back)
            still[str(owner)] = REASON[verdict]
        # The Node's summary of what its fence keeps stopped (removed when nothing is).
        summary = json.dumps(still, sort_keys=True) if still else None
        patch = {"metadata": {"annotations": {NODE_STOPPED_ANNOTATION: summary}}}
        await self.api.kubectl(
            ["patch", "node", self.worker, "--type", "merge", "-p", json.dumps(patch)], repeat=Repeat.IDEMPOTENT
        )
        return self.report


async def start_with_consent(server: SshTarget, worker: str, *, api_wait: float, progress: Progress) -> WorkloadReport:
    """accept_stale_data given to a fence done: start what it stopped for stale copies (judged again)."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        return await WorkloadDecision(api, worker, progress, accept_stale_data=True).start_stopped(worker_back=False)
