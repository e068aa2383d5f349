"""Join permits: a kubelet may create only a Node whose name holds a permit.

A join token is made for one node, but k3s would let its agent register any name. So Node
creation by a kubelet is admitted only for names listed in the ConfigMap hk3s-join-permits (a
ValidatingAdmissionPolicy the program installs). The join grants its node a permit and keeps it
while the Node exists, since its kubelet creates the Node at every start; the server's own node
holds one too, for the same reason (its k3s restarts at an upgrade or a configuration change).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from remote_access.kube import ClusterApi, Repeat, merge_patch_args

PERMITS_CONFIGMAP = "hk3s-join-permits"
PERMIT_POLICY = "hk3s-node-join-permits"

JOIN_PERMIT_POLICY = f"""\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {PERMIT_POLICY}
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["nodes"]
  validations:
    - expression: >-
        !('system:nodes' in request.userInfo.groups) ||
        (has(params.data) && object.metadata.name in params.data)
      messageExpression: >-
        'node ' + object.metadata.name + ' holds no join permit: its join token was made for another node'
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {PERMIT_POLICY}
spec:
  policyName: {PERMIT_POLICY}
  validationActions: [Deny]
  paramRef:
    name: {PERMITS_CONFIGMAP}
    namespace: kube-system
    parameterNotFoundAction: Deny
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {PERMITS_CONFIGMAP}
  namespace: kube-system
"""


def permits_patch_args(nodes: Sequence[str]) -> list[str]:
    """The merge patch granting `nodes` their join permit, stamped with the time it was granted."""
    granted = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    patch: dict[str, Any] = {"data": dict.fromkeys(nodes, granted)}
    return merge_patch_args("configmap", PERMITS_CONFIGMAP, "kube-system", patch)


async def grant_join_permits(cluster: ClusterApi, nodes: Sequence[str]) -> None:
    """Grant `nodes` their join permit (see the module docstring); idempotent."""
    await cluster.kubectl(permits_patch_args(nodes), repeat=Repeat.IDEMPOTENT)
