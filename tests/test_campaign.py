"""The fault campaign's parts that need no lab (bench/campaign.py): a seed gives one schedule, the
shrinker keeps only the steps the violation needs, a bootstrap token is live until its expiration,
firewall rules compare by what they let in. The replay the shrinker calls is a function of the
schedule here (no cluster runs: the lab test tests/lab/test_campaign.py runs one): the shrinking is
the part under test."""

from __future__ import annotations

import base64
import json

from bench.campaign import (
    CI_FAULTS,
    CI_OPERATIONS,
    FAULTS,
    OPERATIONS,
    Step,
    Violation,
    live_tokens,
    make_schedule,
    port_sources,
    shrink,
)
from node_operations.firewall_plan import PortRule


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
