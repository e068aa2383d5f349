"""The fence's judgements: down long enough, a worker that does not answer, its kubelet, and
which pods the out-of-service taint takes off the node. The fence itself runs in the lab
(tests/lab/test_fence.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from node_operations.fence import (
    OUT_OF_SERVICE,
    FenceRefusedError,
    FenceReport,
    KubeletDial,
    ReadyCondition,
    address_refusal,
    down_refusal,
    kubelet_refusal,
    owner_of,
    routed_dial_judgement,
    tolerates,
    unreachable_refusal,
)
from node_operations.refusal import refusal_code

NOW = datetime(2026, 12, 3, 18, 0, 0, tzinfo=UTC)


def _node(status: str | None, seconds_ago: float = 0) -> dict[str, object]:
    if status is None:
        return {"status": {"conditions": []}}
    since = (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{"type": "Ready", "status": status, "lastTransitionTime": since}]}}


def test_only_a_worker_notready_for_a_minute_may_be_fenced() -> None:
    assert down_refusal("w1", ReadyCondition.of(_node("False", 61)), NOW) is None
    assert down_refusal("w1", ReadyCondition.of(_node("Unknown", 60)), NOW) is None
    short = down_refusal("w1", ReadyCondition.of(_node("Unknown", 12)), NOW)
    assert short is not None
    assert "w1 has been NotReady for only 12 s (since 17:59:48 UTC)" in short
    assert "at least 60 s" in short and "hk3s:fences.w1" in short and "in 48 s" in short
    ready = down_refusal("w1", ReadyCondition.of(_node("True", 3600)), NOW)
    assert ready is not None and ready.startswith("w1 is Ready") and "hk3s:fences.w1" in ready
    unknown = down_refusal("w1", ReadyCondition.of(_node(None)), NOW)
    assert unknown is not None and "no Ready condition" in unknown


def test_a_refusal_is_tagged_and_says_nothing_changed() -> None:
    error = FenceRefusedError("w1", "w1 is Ready")
    assert refusal_code(str(error)) == "fence"
    assert "fencing is refused: w1 is Ready. Nothing was changed" in str(error)


def test_a_worker_that_does_not_answer_needs_the_powered_off_confirmation() -> None:
    refusal = unreachable_refusal("w2", "connection refused", powered_off=False)
    assert refusal is not None
    assert "w2 does not answer over SSH (connection refused)" in refusal
    assert "hk3s:fences.w2.powered_off: true" in refusal and "node fence w2 --powered-off" in refusal
    assert unreachable_refusal("w2", "connection refused", powered_off=True) is None


def test_only_silence_lets_the_fence_go_on() -> None:
    silent = [
        KubeletDial("no answer within 5 s: nothing answered", silent=True),
        KubeletDial("no machine answered ARP for the address on the server's link", silent=True),
    ]
    for dial in silent:
        assert kubelet_refusal("w2", "203.0.113.7", dial) is None


@pytest.mark.parametrize(
    "dial",
    [
        KubeletDial("a TCP reset answered (connection refused): ...", reset=True),
        KubeletDial("an ICMP host-unreachable answered (no route to host): something answered"),
    ],
)
def test_an_answer_of_any_kind_refuses_naming_it(dial: KubeletDial) -> None:
    """A reset or an ICMP error for the worker's address means a machine there may be up."""
    refusal = kubelet_refusal("w2", "203.0.113.7", dial)
    assert refusal is not None and f"was answered: {dial.seen}" in refusal
    assert "Only a dial that nothing answers shows the host off" in refusal and "hcloud_server" in refusal


ROUTER, SERVER, WORKER = "10.0.0.1", "10.0.0.2", "10.0.0.3"


def _routed(outcome: str, *senders: str, code: int = 1) -> dict[str, object]:
    """host_scripts/icmp_answers.py's report of a dial of the worker's kubelet through ROUTER."""
    return {"outcome": outcome, "icmp": [{"from": sender, "type": 3, "code": code} for sender in senders]}


def test_behind_a_router_only_an_error_from_the_worker_itself_is_an_answer() -> None:
    """A router whose ARP for the address got no answer says "host unreachable" itself (Linux's
    arp_error_report -> dst_link_failure): nothing answered for the address. The same error from
    one of the worker's own addresses (its firewall's reject) is the worker answering."""

    def judged(report: dict[str, object]) -> KubeletDial:
        return routed_dial_judgement(WORKER, {WORKER, "203.0.113.3"}, ROUTER, SERVER, report)

    router = judged(_routed("EHOSTUNREACH", ROUTER, ROUTER))
    assert router.silent and kubelet_refusal("w2", WORKER, router) is None
    assert f"only {ROUTER}, a router on the way, answered: host-unreachable for {WORKER}" in router.seen
    for own in (WORKER, "203.0.113.3"):
        itself = judged(_routed("EHOSTUNREACH", ROUTER, own))
        assert not itself.silent and itself.ran, itself
        assert f"an ICMP host-unreachable answered from {own} itself" in itself.seen
        refusal = kubelet_refusal("w2", WORKER, itself)
        assert refusal is not None and "was answered: an ICMP host-unreachable answered from" in refusal
    prohibited = judged(_routed("EHOSTUNREACH", WORKER, code=13))
    assert not prohibited.silent and "admin-prohibited answered from" in prohibited.seen
    # The server's own kernel saying its router does not answer ARP: the address was never dialled.
    unsent = judged(_routed("EHOSTUNREACH", SERVER))
    assert not unsent.ran and not unsent.silent and f"for its router {ROUTER}" in unsent.seen
    assert judged(_routed("connected")).connected and judged(_routed("ECONNREFUSED")).reset
    assert judged(_routed("no answer")).silent
    # An error with no ICMP seen to say who sent it is no proof either way.
    unseen = judged(_routed("EHOSTUNREACH"))
    assert not unseen.ran and not unseen.silent


def test_a_kubelet_that_answers_or_a_check_that_did_not_run_refuses() -> None:
    answers = kubelet_refusal("w2", "203.0.113.7", KubeletDial("the connection opened", connected=True))
    assert answers is not None and "w2's kubelet still answers at 203.0.113.7:10250" in answers
    broken = kubelet_refusal(
        "w2", "203.0.113.7", KubeletDial("the dial did not run as meant (bash: Invalid argument)", ran=False)
    )
    assert broken is not None and "did not run as meant (the dial did not run as meant (bash" in broken
    unroutable = kubelet_refusal("w2", "203.0.113.7", KubeletDial("the server has no route", ran=False))
    assert unroutable is not None and "not known to be silent" in unroutable


def test_the_kubelet_check_needs_an_ipv4_address() -> None:
    assert address_refusal("w2", "203.0.113.7") is None
    for address in ("2001:db8::7", "w2.example.com", ""):
        refusal = address_refusal("w2", address)
        assert refusal is not None and "is not an IPv4 address" in refusal and "hk3s:workers" in refusal


def test_which_pods_the_out_of_service_taint_takes() -> None:
    def pod(*tolerations: dict[str, str]) -> dict[str, object]:
        return {"spec": {"tolerations": list(tolerations)}}

    # The defaults every pod gets (not-ready, unreachable for 300 s) do not keep it there.
    assert not tolerates(
        pod({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}), OUT_OF_SERVICE
    )
    assert tolerates(pod({"operator": "Exists"}), OUT_OF_SERVICE)
    assert tolerates(pod({"key": OUT_OF_SERVICE.key, "operator": "Exists"}), OUT_OF_SERVICE)
    assert tolerates(pod({"key": OUT_OF_SERVICE.key, "value": "nodeshutdown", "effect": "NoExecute"}), OUT_OF_SERVICE)
    assert not tolerates(pod({"key": OUT_OF_SERVICE.key, "value": "other", "effect": "NoExecute"}), OUT_OF_SERVICE)
    assert not tolerates(pod({"operator": "Exists", "effect": "NoSchedule"}), OUT_OF_SERVICE)
    assert not tolerates({"spec": {}}, OUT_OF_SERVICE)


def test_the_report_names_where_each_workload_runs_now() -> None:
    pod = {"metadata": {"namespace": "default", "name": "web-1", "ownerReferences": [
        {"kind": "ReplicaSet", "name": "web-5d", "controller": True}]}}  # fmt: skip
    assert owner_of(pod) == "ReplicaSet default/web-5d"
    assert owner_of({"metadata": {"namespace": "default", "name": "bare"}}) is None
    report = FenceReport(
        "w1",
        recorded_at="2026-12-03T18:00:00Z",
        down_seconds=75,
        stopped_by="ssh",
        pods_deleted=["default/web-1", "default/bare"],
        running_now={"ReplicaSet default/web-5d": ["web-2 on w3 (Running)"]},
        not_restarted=["default/bare"],
    )
    lines = report.lines()
    assert lines[0].startswith("fenced (recorded 2026-12-03T18:00:00Z, NotReady for 75 s): stopped over SSH")
    assert "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in lines[0] and "2 pod(s) deleted" in lines[0]
    assert "ReplicaSet default/web-5d now runs: web-2 on w3 (Running)" in lines
    assert "deleted with no controller to start them again: default/bare" in lines
