"""Which of a worker's taints a rejoin removes: only what an earlier config set and this one
dropped, keyed as Kubernetes keys taints (key and effect). Pure rule, no host involved."""

from __future__ import annotations

from providers.node_join import NodeJoinProvider, removed_taints


def test_a_dropped_taint_is_removed_and_a_new_value_is_not() -> None:
    old = ["dedicated=web:NoSchedule", "spot:PreferNoSchedule", "gpu=true:NoExecute"]
    new = ["dedicated=api:NoSchedule", "gpu=true:NoSchedule"]
    # dedicated keeps its key and effect (overwritten with the new value); spot went; gpu's
    # NoExecute went (its NoSchedule is a different taint).
    assert removed_taints(old, new) == ("gpu:NoExecute", "spot:PreferNoSchedule")
    assert removed_taints([], new) == ()
    assert removed_taints(old, old) == ()


def test_a_state_without_taints_sees_no_change_and_a_taint_change_rejoins() -> None:
    olds = {"node": "w1", "labels": {}, "k3s_version": "v1.36.1+k3s1"}
    provider = NodeJoinProvider()
    assert not provider.diff("w1-join", olds, {**olds, "taints": []}).changes
    changed = provider.diff("w1-join", {**olds, "taints": ["a=b:NoSchedule"]}, {**olds, "taints": []})
    assert changed.changes and not changed.replaces
