"""Join permits: a kubelet may create only a Node whose name holds a permit.

A join token is made for one node, but k3s would let its agent register any name. So Node
creation by a kubelet is admitted only for names listed in the ConfigMap hk3s-join-permits (a
ValidatingAdmissionPolicy the program installs). The join grants its node a permit and keeps it
while the Node exists, since its kubelet creates the Node at every start; the server's own node
holds one too, for the same reason (its k3s restarts at an upgrade or a configuration change).

The permit goes with the Node: a removal and a give-up revoke it before they delete the Node.
What the real pieces allow, and why that is the rule:
- k3s binds a bootstrap token to no name: any live token (one a join of another node holds for
  its ten minutes, say) gets its agent a kubelet certificate for whatever name it asks for, and
  with it the kubelet creates that Node. A name left in the permits would take such a Node, under
  whatever taints that agent's config says (no validation taint).
- A removed or given-up host keeps its kubelet certificate (k3s signs it for a year; Kubernetes
  has no revocation of client certificates). NodeRestriction lets a kubelet create its own Node,
  so the certificate alone brings the Node back wherever a firewall still lets the host reach the
  API: a given-up host is left as it is and may be powered on again, its agent unheld when its
  fence only confirmed it off.
Both creations are the kubelet's (group system:nodes), so this admission judges both: with no
permit for the name, the Node is refused ("holds no join permit") and never exists to take pods.
The permit's absence is the deny record: only a join of that name grants it again (join_server;
an upgrade grants the server's own), so a removed or given-up name stays unusable until the
program joins it again. Revoking before the Node goes leaves no moment with the Node gone and the
name still admitted; a run cut between the two finishes both when it runs again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from remote_access.kube import ClusterApi, Repeat, merge_patch_args
from remote_access.ssh import RemoteCommandError

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
        'node ' + object.metadata.name + ' holds no join permit: only a join of ' + object.metadata.name +
        ' by the program grants one (the token was made for another node, or the worker was removed or given
        up). To bring it back, list it in hk3s:workers and run pulumi up'
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


async def revoke_join_permit(cluster: ClusterApi, node: str) -> None:
    """Take `node`'s join permit away (see the module docstring); idempotent. A cluster with no
    permits ConfigMap holds no permit to revoke: where the policy is installed it then refuses
    every kubelet's Node (parameterNotFoundAction: Deny), and where it is not, no join made one."""
    try:
        await cluster.patch_merge("configmap", PERMITS_CONFIGMAP, "kube-system", {"data": {node: None}})
    except RemoteCommandError as error:
        if "NotFound" not in str(error):
            raise
