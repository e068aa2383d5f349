"""The fault campaign's parts that need no lab (bench/campaign.py): a seed gives one schedule, the
shrinker keeps only the steps the violation needs, a bootstrap token is live until its expiration,
firewall rules compare by what they let in. The replay the shrinker calls is a function of the
schedule here (no cluster runs: the lab test tests/lab/test_campaign.py runs one): the shrinking is
the part under test."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.campaign import (
    AUDIT_LOG_IN_HOST,
    CI_FAULTS,
    CI_OPERATIONS,
    FAULTS,
    OPERATIONS,
    Cluster,
    Step,
    StepReport,
    Violation,
    live_tokens,
    make_schedule,
    port_sources,
    shrink,
    write_partial,
)
from node_operations.fence_workloads import STOPPED_ANNOTATION
from node_operations.firewall_plan import PortRule
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT


def test_a_seed_gives_one_schedule_with_the_faults_asked_for() -> None:
    first, again, other = make_schedule(7, 20), make_schedule(7, 20), make_schedule(8, 20)
    assert first == again and first != other
    assert sum(step.fault is not None for step in first) == 20
    assert {step.op for step in first} <= set(OPERATIONS) and {s.fault for s in first} - {None} <= set(FAULTS)
    cheap = make_schedule(7, 20, CI_OPERATIONS, CI_FAULTS)
    assert {s.op for s in cheap} <= set(CI_OPERATIONS) and {s.fault for s in cheap} - {None} <= set(CI_FAULTS)


def test_a_schedule_round_trips_through_the_json_a_report_prints() -> None:
    schedule = make_schedule(3, 5)
    assert [Step(**step.to_json()) for step in schedule] == schedule


def test_the_shrinker_keeps_only_the_steps_the_violation_needs() -> None:
    """The violation shows when a fence and a give-up both happen before the last step; every other
    step is dropped, the last (where it showed) kept."""
    ops = ["add", "fence", "labels", "reboot", "give_up", "labels", "remove"]
    schedule = [Step(op=op, pick=i) for i, op in enumerate(ops)]

    def replay(candidate: list[Step]) -> Violation | None:
        names = [step.op for step in candidate[:-1]]
        if "fence" in names and "give_up" in names:
            return Violation("node_per_worker", "a Node of a given-up worker")
        if "add" in names:
            return Violation("firewall", "another invariant: not the same finding")
        return None

    shortest = shrink(schedule, Violation("node_per_worker", "x"), replay, lambda line: None)
    assert [step.op for step in shortest] == ["fence", "give_up", "remove"]


def test_a_run_cut_off_keeps_every_step_it_finished(tmp_path: Path) -> None:
    """A long run writes its result after each step, whole (a reader never sees half a file), and
    marked unfinished until the run ends."""
    schedule = make_schedule(5, 4)
    out = tmp_path / "campaign.json"
    reports = []
    for index, step in enumerate(schedule[:3]):
        report = StepReport(index, step, target="w1", fault_fired=step.fault is not None)
        report.verdicts["converges"] = "ok"
        reports.append(report)
        write_partial(out, 5, schedule, reports, 0.0)
        kept = json.loads(out.read_text())
        assert kept["finished"] is False and kept["steps"] == index + 1 and kept["steps_planned"] == len(schedule)
        assert [Step(**r["step"]) for r in kept["reports"]] == schedule[: index + 1]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["campaign.json"]


def test_a_token_is_live_until_its_expiration() -> None:
    def secret(token: str, node: str, expiration: str) -> dict[str, object]:
        data = {"description": node, "expiration": expiration}
        encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
        return {"metadata": {"name": f"bootstrap-token-{token}"}, "data": encoded}

    out = json.dumps(
        {"items": [secret("aaaaaa", "w1", "2999-01-01T00:00:00Z"), secret("bbbbbb", "w2", "2001-01-01T00:00:00Z")]}
    )
    assert live_tokens(out) == {"aaaaaa": "w1"}


def test_firewall_rules_compare_by_what_they_let_in() -> None:
    split = [PortRule("10250", "tcp", ("10.0.0.2/32",), "kubelet"), PortRule("10250", "tcp", ("10.0.0.3/32",), "x")]
    merged = [PortRule("10250", "tcp", ("10.0.0.3/32", "10.0.0.2/32"), "kubelet")]
    assert port_sources(split) == port_sources(merged)
    assert port_sources(split) != port_sources(split[:1])


def test_a_long_schedule_shrinks_to_the_one_step_that_matters_in_few_tries() -> None:
    schedule = [Step(op="labels", pick=i) for i in range(40)]
    tries: list[int] = []

    def replay(candidate: list[Step]) -> Violation | None:
        tries.append(len(candidate))
        return Violation("converges", "x") if any(step.pick == 5 for step in candidate[:-1]) else None

    shortest = shrink(schedule, Violation("converges", "x"), replay, lambda line: None)
    assert [step.pick for step in shortest] == [5, 39]
    assert len(tries) < 40, tries  # dropping one step at a time would take 39 runs


def audit_event(verb: str, resource: str, name: str, stamp: str, user: str, **fields: Any) -> dict[str, Any]:
    """One audit.k8s.io/v1 Event as the kube-apiserver writes it at ResponseComplete (the fields the
    campaign reads: k8s.io/apiserver pkg/apis/audit/v1 types.go)."""
    subresource = fields.pop("subresource", "")
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "RequestResponse",
        "stage": "ResponseComplete",
        "verb": verb,
        "requestURI": f"/api/v1/{resource}/{name}",
        "user": {"username": user},
        "objectRef": {"resource": resource, "namespace": "default" if resource == "pods" else "", "name": name}
        | ({"subresource": subresource} if subresource else {}),
        "responseStatus": {"metadata": {}, "code": 200},
        "stageTimestamp": stamp,
        **fields,
    }


def node_object(name: str, fenced: bool) -> dict[str, Any]:
    taints = [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}] if fenced else []
    annotations = {FENCE_ANNOTATION: "2026-12-06T07:00:00Z"} if fenced else {}
    return {"metadata": {"name": name, "annotations": annotations}, "spec": {"taints": taints}}


def pod_delete(name: str, node: str, stamp: str, user: str, grace: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/__internal"}
    if grace is not None:
        options["gracePeriodSeconds"] = grace
    return audit_event(
        "delete", "pods", name, stamp, user, requestObject=options, responseObject={"spec": {"nodeName": node}}
    )


def test_the_audit_log_tells_a_force_deletion_on_a_fenced_node_from_one_on_a_node_that_is_not(
    tmp_path: Path,
) -> None:
    """The audit log is written by hand here, in the kube-apiserver's format (the lab test
    tests/lab/test_campaign.py reads a real one): the judgment of each deletion is under test."""
    server = SimpleNamespace(name="srv", root=tmp_path)
    cluster = Cluster(None, None, server, {}, "image")  # type: ignore[arg-type]
    gc = "system:serviceaccount:kube-system:pod-garbage-collector"
    events = [
        audit_event(
            "patch", "nodes", "w1", "2026-12-06T07:00:01.000000Z", "admin", responseObject=node_object("w1", True)
        ),
        pod_delete("a", "w1", "2026-12-06T07:00:02.000000Z", gc, 0),  # fenced: the pod GC's part
        pod_delete("b", "w2", "2026-12-06T07:00:03.000000Z", "system:node:w2", 0),  # the kubelet's confirmation
        pod_delete("c", "w2", "2026-12-06T07:00:04.000000Z", "admin", None),  # graceful
        audit_event("delete", "nodes", "w3", "2026-12-06T07:00:05.000000Z", "admin"),
        pod_delete("d", "w3", "2026-12-06T07:00:06.000000Z", gc, 0),  # an orphan of a deleted Node
    ]
    log = tmp_path / AUDIT_LOG_IN_HOST.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    cluster.check_force_deletes()
    with log.open("a") as handle:
        handle.write(json.dumps(pod_delete("e", "w2", "2026-12-06T07:00:07.000000Z", "admin", 0)) + "\n")
        lifted = audit_event(
            "patch", "nodes", "w1", "2026-12-06T07:00:08.000000Z", "admin", responseObject=node_object("w1", False)
        )
        handle.write(json.dumps(lifted) + "\n")
        handle.write(json.dumps(pod_delete("f", "w1", "2026-12-06T07:00:09.000000Z", gc, 0)) + "\n")
    with pytest.raises(Violation) as found:
        cluster.check_force_deletes()
    assert found.value.invariant == "force_delete"
    lines = found.value.detail.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("pod default/e on w2 deleted with grace 0 by admin"), lines
    assert lines[1].startswith(f"pod default/f on w1 deleted with grace 0 by {gc}"), lines


def test_the_audit_log_names_a_pod_made_for_a_workload_while_a_fence_held_it(tmp_path: Path) -> None:
    """As above, an audit log written by hand in the kube-apiserver's format: a pod the ReplicaSet
    controller makes for app-0 before the fence's stop record and after `workload start` removed it
    is fine; one made while the record is on is named."""
    server = SimpleNamespace(name="srv", root=tmp_path)
    cluster = Cluster(None, None, server, {}, "image")  # type: ignore[arg-type]

    def deployment(stamp: str, held: bool) -> dict[str, Any]:
        annotations = {STOPPED_ANNOTATION: json.dumps({"node": "w1", "reason": "stale"})} if held else {}
        obj = {"metadata": {"name": "app-0", "namespace": "default", "annotations": annotations}}
        return audit_event("patch", "deployments", "app-0", stamp, "admin", responseObject=obj)

    def pod(stamp: str, name: str) -> dict[str, Any]:
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-0-5d8f9c7b6", "controller": True}
        request = {"metadata": {"name": name, "ownerReferences": [owner]}}
        return audit_event(
            "create",
            "pods",
            name,
            stamp,
            "system:serviceaccount:kube-system:replicaset-controller",
            requestObject=request,
        )

    events = [
        pod("2026-12-06T07:00:01.000000Z", "app-0-5d8f9c7b6-aaaaa"),
        deployment("2026-12-06T07:00:02.000000Z", True),
        pod("2026-12-06T07:00:03.000000Z", "app-0-5d8f9c7b6-bbbbb"),
        deployment("2026-12-06T07:00:04.000000Z", False),
        pod("2026-12-06T07:00:05.000000Z", "app-0-5d8f9c7b6-ccccc"),
    ]
    log = tmp_path / AUDIT_LOG_IN_HOST.lstrip("/")
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    cluster.check_force_deletes()
    assert cluster.audit_held_problems == [
        "a pod app-0-5d8f9c7b6-bbbbb of default/Deployment/app-0 created at 2026-12-06T07:00:03.000000Z while held stopped"
    ]
