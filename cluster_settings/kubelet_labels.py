"""The kubelet's rule for the labels a node may give itself with ``--node-labels``.

k3s writes every ``--node-label`` of its config into the kubelet's ``--node-labels`` at each
start, and the kubelet refuses to start when one of them is in the ``kubernetes.io`` or
``k8s.io`` namespace (the domain itself or any subdomain of it) and is not one it may set on
its own Node; k3s's agent then exits and systemd restarts it in a loop.  The rule, as
Kubernetes states it:

- cmd/kubelet/app/options/options.go, ``ValidateKubeletFlags``: a key with
  ``isKubernetesLabel(k) && !IsKubeletLabel(k)`` fails with "unknown 'kubernetes.io' or
  'k8s.io' labels specified with --node-labels"; ``isKubernetesLabel`` is a namespace equal
  to ``kubernetes.io``/``k8s.io`` or ending in ``.kubernetes.io``/``.k8s.io``;
- staging/src/k8s.io/kubelet/pkg/apis/well_known_labels.go, ``IsKubeletLabel``: the key is
  one of ``kubeletLabels`` or its namespace is ``kubelet.kubernetes.io`` or
  ``node.kubernetes.io`` or ends in ``.kubelet.kubernetes.io``/``.node.kubernetes.io``.

So ``node-role.kubernetes.io/...`` and ``node-restriction.kubernetes.io/...`` (the
NodeRestriction admission plugin's namespace, for labels only an administrator may set) are
refused, and so is any ``<team>.kubernetes.io/...``.  The lab's k3s stand-in applies the same
rule (lab/k3s_standin/node.go, ``kubeletRestrictedLabel``).
"""

from __future__ import annotations

# well_known_labels.go `kubeletLabels` (v1.LabelHostname, LabelTopologyZone/Region, the beta
# failure-domain zone/region, LabelInstanceType and its stable form, the OS and Arch labels
# in their GA and beta forms).
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    }
)
# well_known_labels.go `kubeletLabelNamespaces` (v1.LabelNamespaceSuffixKubelet, ...Node).
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")
KUBERNETES_NAMESPACES = ("kubernetes.io", "k8s.io")


def _namespace(key: str) -> str:
    prefix, slash, _ = key.partition("/")
    return prefix if slash else ""


def _in(namespace: str, domain: str) -> bool:
    return namespace == domain or namespace.endswith("." + domain)


def kubelet_refuses_label(key: str) -> bool:
    """Whether the kubelet refuses to start with this key in ``--node-labels``."""
    namespace = _namespace(key)
    if not any(_in(namespace, domain) for domain in KUBERNETES_NAMESPACES):
        return False
    if key in KUBELET_LABELS:
        return False
    return not any(_in(namespace, allowed) for allowed in KUBELET_LABEL_NAMESPACES)
