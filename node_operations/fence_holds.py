"""Fence holds: while a fence keeps a workload stopped, the cluster refuses to start it from outside.

A fence stops a workload by scaling its owner to zero or suspending it (fence_workloads), when no
other node holds a current copy of its volumes. Nothing in Kubernetes keeps it there: Argo CD's or
Flux's self-heal, a CI job's `kubectl apply`, KEDA or `kubectl scale` put `replicas` (or a Job's or
CronJob's `suspend: false`) back, and its pods start on copies that may be older than the lost one.
None of them sets an ownerReference the fence could see. So the fence holds what it stops: a
ValidatingAdmissionPolicy the program installs refuses, for every owner listed in the ConfigMap
hk3s-fence-holds, an update that raises its replicas or lifts its suspension, naming the fence,
`scripts/hk3s workload start` and `--accept-stale-data`. What the real API server allows, and why
the rule is built so:

- `kubectl scale`, KEDA and the HPA go through the scale subresource (`deployments/scale`, ...),
  where admission sees an autoscaling/v1 Scale, not the Deployment: the Scale carries only the
  name, namespace, uid and resourceVersion of its object (kubernetes `pkg/registry/apps/deployment/
  storage/storage.go` `scaleFromDeployment`), not its annotations, and its `spec.replicas` is left
  out when zero (`omitempty`). The fence's record on the owner (an annotation) is therefore not
  what the policy reads: the hold is a ConfigMap entry, the policy's parameter, keyed by what both
  kinds of request carry, `<resource>.<namespace>.<name>` (request.resource.resource,
  request.namespace, request.name).
- Only an increase is refused (replicas above the old count, a suspension lifted): the fence's own
  stop, a scale down and every other change pass, and so do the controllers' writes (status goes
  through the status subresource, which is not matched).
- The binding allows requests when the ConfigMap is missing (`parameterNotFoundAction: Allow`):
  with Deny every Deployment update of the cluster would be refused. Removing the ConfigMap or the
  binding lifts every hold; `status` then names a held workload that runs (`held_running`).
- The sanctioned starts remove the hold before their start patch, in a request of their own:
  `workload start`, the start at the lift and the one with `accept_stale_data`. The fence adds the
  hold before its stop: a run cut between them leaves a hold on a workload not stopped yet, which
  the resumed fence stops (or, judging it free to move now, releases).
- A Deployment's ReplicaSets that ran its pods on the worker are held too: scaling one directly
  would start pods until the Deployment's controller scales it back.

Each entry's value is `<fenced worker> <reason> <namespace>/<Kind>/<name>`: the fence, why it
holds, and the workload `workload start` takes (a ReplicaSet's is its Deployment).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import RemoteCommandError

HOLDS_CONFIGMAP = "hk3s-fence-holds"
HOLD_POLICY = "hk3s-fence-holds"
# The command that starts a held workload (node_operations/workload_start.py).
START_COMMAND = "scripts/hk3s workload start"
# The kinds a fence stops, each with its resource as admission names it (request.resource.resource):
# scaled to zero, or suspended (fence_workloads.SCALED, SUSPENDED).
SCALED_RESOURCES = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}
SUSPENDED_RESOURCES = {"Job": "jobs", "CronJob": "cronjobs"}
RESOURCES = {**SCALED_RESOURCES, **SUSPENDED_RESOURCES}


def start_command(stack: str) -> str:
    """`scripts/hk3s --stack STACK workload start` (without --stack when the stack is not known)."""
    return START_COMMAND.replace("hk3s ", f"hk3s --stack {stack} ") if stack else START_COMMAND


@dataclass(frozen=True)
class Held:
    """One object a fence holds: KIND NAMESPACE/NAME, and the workload `workload start` takes for it."""

    kind: str
    namespace: str
    name: str
    workload: str  # NAMESPACE/KIND/NAME

    @property
    def key(self) -> str:
        """Its ConfigMap key, as the policy builds it from a request."""
        return f"{RESOURCES[self.kind]}.{self.namespace}.{self.name}"


def hold_policy(stack: str) -> str:
    """The policy, its binding and its (empty) ConfigMap; `stack` is named in its refusal."""
    command = start_command(stack)
    kinds = ", ".join(f"'{resource}': '{kind}'" for kind, resource in sorted(RESOURCES.items()))
    scaled = ", ".join(f"'{resource}'" for resource in sorted(SCALED_RESOURCES.values()))
    return f"""\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {HOLD_POLICY}
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
      - apiGroups: ["apps"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: [{", ".join(f"{r}, {r}/scale" for r in sorted(SCALED_RESOURCES.values()))}]
      - apiGroups: ["batch"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: [{", ".join(sorted(SUSPENDED_RESOURCES.values()))}]
  variables:
    - name: key
      expression: "request.resource.resource + '.' + request.namespace + '.' + request.name"
    - name: hold
      expression: "has(params.data) && variables.key in params.data ? params.data[variables.key].split(' ') : []"
    - name: scaled
      expression: "request.resource.resource in [{scaled}]"
  validations:
    - expression: >-
        size(variables.hold) < 3 ||
        (variables.scaled
          ? (has(object.spec.replicas) ? object.spec.replicas : 0) <=
            (has(oldObject.spec.replicas) ? oldObject.spec.replicas : 0)
          : !(has(oldObject.spec.suspend) && oldObject.spec.suspend) ||
            (has(object.spec.suspend) && object.spec.suspend))
      message: >-
        this workload is held stopped by a fence (ConfigMap kube-system/{HOLDS_CONFIGMAP}); start it with
        {command} NAMESPACE/KIND/NAME (--accept-stale-data to start it from copies that may be older)
      messageExpression: >-
        {{{kinds}}}[request.resource.resource] + ' ' + request.namespace + '/' + request.name +
        ' is held stopped by the fence of ' + variables.hold[0] + ' (' + variables.hold[1] +
        ': no node that is Ready and not fenced holds a current copy of its Longhorn volumes), so it is not ' +
        (variables.scaled ? 'scaled up' : 'resumed') + ' from outside (a GitOps sync, kubectl apply or scale,' +
        ' an autoscaler). To start it from copies that may be older than the one on ' + variables.hold[0] +
        ', run {command} ' + variables.hold[2] + ' --accept-stale-data (without it once a copy elsewhere is' +
        ' current); or lift the fence once ' + variables.hold[0] + ' is back, which starts it'
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {HOLD_POLICY}
spec:
  policyName: {HOLD_POLICY}
  validationActions: [Deny]
  paramRef:
    name: {HOLDS_CONFIGMAP}
    namespace: kube-system
    parameterNotFoundAction: Allow
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {HOLDS_CONFIGMAP}
  namespace: kube-system
"""


def hold_entries(held: Iterable[Held], worker: str, reason: str) -> dict[str, str]:
    """The ConfigMap entries holding `held` for `worker`'s fence (`reason`: stale, only-copy)."""
    return {h.key: f"{worker} {reason} {h.workload}" for h in held}


async def read_holds(api: ClusterApi) -> dict[str, str]:
    """The holds now (none when the ConfigMap is missing)."""
    out = await api.kubectl(
        ["get", "configmap", HOLDS_CONFIGMAP, "-n", "kube-system", "-o", "json", "--ignore-not-found"],
        repeat=Repeat.READ,
    )
    data = (json.loads(out).get("data") or {}) if out.strip() else {}
    return {str(k): str(v) for k, v in data.items()}


async def hold(api: ClusterApi, stack: str, entries: Mapping[str, str]) -> None:
    """Install the policy (kept at every stop, as the join keeps its permit policy) and add
    `entries`; idempotent."""
    await api.apply(hold_policy(stack))
    await api.patch_merge("configmap", HOLDS_CONFIGMAP, "kube-system", {"data": dict(entries)})


async def release(api: ClusterApi, workload: str) -> None:
    """Remove every hold naming `workload` (NAMESPACE/KIND/NAME) as the one to start, its
    ReplicaSets' too; idempotent, and a no-op where nothing holds it."""
    names = [key for key, value in (await read_holds(api)).items() if value.split(" ")[-1] == workload]
    if not names:
        return
    try:
        await api.patch_merge("configmap", HOLDS_CONFIGMAP, "kube-system", {"data": dict.fromkeys(names)})
    except RemoteCommandError as error:
        if "NotFound" not in str(error):
            raise
