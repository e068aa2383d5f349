"""Who may reach Longhorn's pods: NetworkPolicies the program keeps in longhorn-system.

Longhorn's manager API (9500, the `longhorn-backend` Service) and its UI have no authentication
(longhorn/longhorn #1983, #3829): any pod that reaches them can delete volumes or point the backup
target at a bucket of its own, and the instance managers' gRPC ports were CVE-2021-36779. So the
manager, the UI and the instance managers admit only:

- Longhorn's own pods (every pod of longhorn-system: the manager, UI, CSI plugin and sidecars,
  driver deployer, instance, backing-image and share managers, recurring jobs);
- the node the pod runs on: k3s's network-policy controller (kube-router's, pkg/agent/netpol)
  always admits traffic from the pod's local node ("rule to permit the traffic traffic to pods
  when source is the pod's local node"), so the kubelet's probes and the node's iSCSI initiator
  pass;
- on the manager, the conversion and admission webhooks' ports (9501, 9502) from anywhere: the
  API server calls them from the server's host, and Longhorn's own chart leaves them open the same
  way (chart/templates/network-policies/webhook-network-policy.yaml);
- on the manager and UI, the pods of the namespaces hk3s:storage.longhorn_api_clients names.

The selectors are Longhorn's own (its chart's network-policies templates): `app: longhorn-manager`,
`app: longhorn-ui`, `longhorn.io/component: instance-manager`. Other pods of longhorn-system (the
share managers serving RWX volumes over NFS to the nodes) are left as Longhorn leaves them. The
policies are the program's, not the chart's `networkPolicies` values, so they hold whatever chart
version the stack installs (the values differ between releases).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

WEBHOOK_PORTS = (9501, 9502)
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def longhorn_network_policies(api_clients: Sequence[str]) -> dict[str, Any]:
    """The NetworkPolicies' specs by name (all in longhorn-system)."""
    own_pods: dict[str, Any] = {"podSelector": {}}
    clients: list[dict[str, Any]] = (
        [
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": sorted(api_clients)}]
                }
            }
        ]
        if api_clients
        else []
    )
    webhooks = {"ports": [{"protocol": "TCP", "port": port} for port in WEBHOOK_PORTS]}
    return {
        "hk3s-longhorn-manager": {
            "podSelector": {"matchLabels": {"app": "longhorn-manager"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [own_pods, *clients]}, webhooks],
        },
        "hk3s-longhorn-ui": {
            "podSelector": {"matchLabels": {"app": "longhorn-ui"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [own_pods, *clients]}],
        },
        "hk3s-longhorn-instance-manager": {
            "podSelector": {"matchLabels": {"longhorn.io/component": "instance-manager"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [own_pods]}],
        },
    }
