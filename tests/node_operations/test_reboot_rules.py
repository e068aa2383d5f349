"""The reboot's pure rules: which workloads count as ready, which disruption budgets a
pod falls under (Kubernetes' label-selector semantics), and which nodes refuse a reboot or its
resume. No host involved."""

from __future__ import annotations

from node_operations.drain import selector_matches
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from node_operations.reboot import _workload_ready, reboot_refusals
from remote_access.kube import NodeStatus, Taint


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


def _node(
    name: str,
    *,
    ready: bool = True,
    cordoned: bool = False,
    fence_recorded: bool = False,
    out_of_service: bool = False,
) -> NodeStatus:
    return NodeStatus(
        name=name,
        ready=ready,
        ready_reason="" if ready else "NodeStatusUnknown",
        unschedulable=cordoned,
        annotations={FENCE_ANNOTATION: "2026-12-04T23:00:00Z"} if fence_recorded else {},
        taints=[Taint(OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute")] if out_of_service else [],
    )


def test_a_worker_whose_node_records_a_fence_is_not_rebooted_whatever_the_stack_file_says() -> None:
    # The stack file may no longer name the fence (its entry removed, the lift not yet run): the
    # Node's record is the fence's own, and it says the host is held down on purpose.
    refusals = reboot_refusals(_node("w1", fence_recorded=True), [_node("w2")], resuming=False)
    assert len(refusals) == 1 and refusals[0].startswith(f"w1 has a fence recorded on its Node ({FENCE_ANNOTATION}"), (
        refusals
    )
    assert "hk3s:fences.w1" in refusals[0]
    # Resuming does not make it rebootable either.
    assert reboot_refusals(_node("w1", fence_recorded=True), [_node("w2")], resuming=True) == refusals


def test_a_fenced_worker_is_not_down_for_another_workers_reboot() -> None:
    fenced = _node("w2", ready=False, cordoned=True, fence_recorded=True, out_of_service=True)
    assert reboot_refusals(_node("w1"), [_node("srv"), fenced], resuming=False) == []
    assert reboot_refusals(_node("w1", ready=False, cordoned=True), [_node("srv"), fenced], resuming=True) == []


def test_a_fence_not_finished_still_counts_as_a_node_down() -> None:
    # Recorded, but no out-of-service taint yet: its host may still run and its workloads are not
    # started elsewhere yet.
    half = _node("w2", ready=False, fence_recorded=True)
    refusals = reboot_refusals(_node("w1"), [half], resuming=False)
    assert len(refusals) == 1 and "w2's fence is recorded but not finished" in refusals[0], refusals
    assert "run up to finish it" in refusals[0]


def test_a_node_down_or_cordoned_refuses_a_reboot_and_its_resume_alike() -> None:
    others = [_node("srv"), _node("w2", ready=False), _node("w3", cordoned=True)]
    for this, resuming in ((_node("w1"), False), (_node("w1", ready=False, cordoned=True), True)):
        refusals = reboot_refusals(this, others, resuming=resuming)
        assert len(refusals) == 2, refusals
        assert refusals[0].startswith("w2 is NotReady (NodeStatusUnknown): never two nodes down at once")
        assert refusals[1].startswith("w3 is cordoned") and "k3s kubectl uncordon w3" in refusals[1]


def test_only_a_resumed_reboot_may_find_its_own_worker_not_ready() -> None:
    # A reboot under way leaves its worker down; a new one needs it Ready.
    assert reboot_refusals(_node("w1", ready=False), [], resuming=True) == []
    refusals = reboot_refusals(_node("w1", ready=False), [], resuming=False)
    assert len(refusals) == 1 and refusals[0].startswith("w1 is NotReady (NodeStatusUnknown)"), refusals
