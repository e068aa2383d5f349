"""The reboot's pure rules: which workloads count as ready, and which disruption budgets a
pod falls under (Kubernetes' label-selector semantics). No host involved."""

from __future__ import annotations

from node_operations.drain import selector_matches
from node_operations.reboot import _workload_ready


def test_a_workload_is_ready_when_every_replica_or_scheduled_pod_is() -> None:
    assert _workload_ready("Deployment", {"spec": {"replicas": 4}, "status": {"readyReplicas": 4}})
    assert not _workload_ready("Deployment", {"spec": {"replicas": 4}, "status": {"readyReplicas": 3}})
    assert _workload_ready("Deployment", {"spec": {"replicas": 0}, "status": {}})
    # spec.replicas defaults to 1.
    assert not _workload_ready("StatefulSet", {"spec": {}, "status": {}})
    assert _workload_ready("DaemonSet", {"status": {"desiredNumberScheduled": 3, "numberReady": 3}})
    assert not _workload_ready("DaemonSet", {"status": {"desiredNumberScheduled": 3, "numberReady": 2}})


def test_a_budgets_selector_matches_as_kubernetes_matches_it() -> None:
    labels = {"app": "web", "tier": "front"}
    assert selector_matches({"matchLabels": {"app": "web"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "db"}}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}, labels
    )
    assert selector_matches({"matchExpressions": [{"key": "app", "operator": "Exists"}]}, labels)
    assert not selector_matches({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, labels)
    # Both parts must hold.
    assert not selector_matches(
        {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["back"]}]},
        labels,
    )
