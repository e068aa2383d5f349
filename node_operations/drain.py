"""What a drain moves and what holds it back, as `kubectl drain` sees a node: the reboot and
the removal list what they evict before `ClusterApi.drain`, and explain a drain that did
not finish with `blocking_budgets`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from remote_access.kube import ClusterApi, Repeat


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions) against a pod's labels."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


async def pods_to_evict(api: ClusterApi, node: str) -> list[dict[str, Any]]:
    """The pods a drain evicts from the node: not DaemonSet-managed, not static (mirror) pods."""
    out = await api.kubectl(
        ["get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "json"], repeat=Repeat.READ
    )
    pods = []
    for pod in json.loads(out).get("items", []):
        metadata = pod.get("metadata", {})
        owners = metadata.get("ownerReferences") or []
        if any(owner.get("kind") == "DaemonSet" for owner in owners):
            continue
        if "kubernetes.io/config.mirror" in (metadata.get("annotations") or {}):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        pods.append(pod)
    return pods


async def names_to_evict(api: ClusterApi, node: str) -> list[str]:
    """`namespace/name` of each pod a drain evicts from the node."""
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in await pods_to_evict(api, node)]


async def blocking_budgets(api: ClusterApi, node: str) -> list[str]:
    """Each pod left on the node, with the disruption budgets that allow no eviction of it."""
    left = await pods_to_evict(api, node)
    out = await api.kubectl(["get", "poddisruptionbudgets", "-A", "-o", "json"], repeat=Repeat.READ)
    budgets = json.loads(out).get("items", [])
    lines = []
    for pod in left:
        metadata = pod["metadata"]
        holding = [
            f"{budget['metadata']['namespace']}/{budget['metadata']['name']} "
            f"(allows {int((budget.get('status') or {}).get('disruptionsAllowed') or 0)} disruption(s))"
            for budget in budgets
            if budget["metadata"].get("namespace") == metadata.get("namespace")
            and selector_matches((budget.get("spec") or {}).get("selector") or {}, metadata.get("labels") or {})
        ]
        if holding:
            held = f"held by PodDisruptionBudget {', '.join(holding)}"
        elif not metadata.get("ownerReferences"):
            held = (
                "has no controller (a drain would delete it for good: delete it yourself or run it under a Deployment)"
            )
        else:
            held = "not evicted in time"
        lines.append(f"pod {metadata.get('namespace')}/{metadata.get('name')} {held}")
    return lines
