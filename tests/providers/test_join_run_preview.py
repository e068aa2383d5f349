"""What a preview plans for the resources that run after every run of a worker's join (the disk
probe, the Longhorn node role): a new run where the join runs again, none where the join's update
does not run it (labels and taints through the API, a release K3sUpgrade moved, a new login key).

In a preview the join's `join_run` is unknown whenever the join updates (a dynamic provider has no
preview of its update: the engine hands back the new inputs as its outputs); the engine's diff of
the join judges whether it runs again, and the dependents' diffs read that judgement. The engine is
not run here: the diffs are called as the engine calls them, with its placeholder for an unknown
value (tests/lab/test_preview_matches_up.py runs the real engine and CLI on a lab cluster). No host
is asked: a diff that would log in fails the test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pulumi.runtime.rpc import UNKNOWN

from providers import base, node_join
from providers.base import join_runs_again
from providers.disk_probe import DiskProbeProvider
from providers.longhorn_node_role import LonghornNodeRoleProvider
from providers.node_join import HOST_CHANGED, NodeJoinProvider
from remote_access.kube import NodeStatus
from tests.providers.joined_worker import JOINED_WORKER

RUN = "2026-12-06T10:00:00+00:00"
JOINED = {**JOINED_WORKER, "taints": [], "join_run": RUN}
INPUTS = {key: value for key, value in JOINED.items() if key not in ("state", "machine_id", "join_run")}
PROBED = {
    "node": "w1",
    "address": "198.51.100.7",
    "private_key": "key",
    "disk_path": "/var/lib/longhorn",
    "ignore_slow_disk": False,
    "threshold_ms": 10.0,
    "join_run": RUN,
    "eligible": True,
}
PROBE_INPUTS = {key: value for key, value in PROBED.items() if key != "eligible"}
ROLE = {
    "node": "srv",
    "address": "198.51.100.2",
    "private_key": "key",
    "longhorn_node": "w1",
    "server": False,
    "holds_copies": True,
    "join_run": RUN,
    "tags": [],
    "allow_scheduling": True,
}
ROLE_INPUTS = {key: value for key, value in ROLE.items() if key not in ("tags", "allow_scheduling")}


@pytest.fixture(autouse=True)
def no_judgement_yet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(base, "_RUNS_AGAIN", {})

    async def no_host(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a diff asked a host")

    monkeypatch.setattr(node_join, "read_node", no_host)
    monkeypatch.setattr(node_join, "joined_host_changed", no_host)
    yield


def planned() -> tuple[bool, bool]:
    """The preview's plan for the worker's disk probe and Longhorn node role, after the engine's
    diff of its join: whether each is updated, with the join's run unknown."""
    probe = DiskProbeProvider().diff("w1-disk", dict(PROBED), {**PROBE_INPUTS, "join_run": UNKNOWN})
    role = LonghornNodeRoleProvider().diff("w1-longhorn-role", dict(ROLE), {**ROLE_INPUTS, "join_run": UNKNOWN})
    return bool(probe.changes), bool(role.changes)


def judge(olds: dict[str, Any], news: dict[str, Any]) -> bool:
    return bool(NodeJoinProvider().diff("w1-join", olds, news).changes)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"labels": {"tier": "db"}}, id="labels"),
        pytest.param({"taints": ["dedicated=db:NoSchedule"]}, id="taints"),
        pytest.param({"k3s_version": UNKNOWN}, id="release-moved-by-k3s-upgrade"),
        pytest.param({"private_key": "rotated"}, id="login-key"),
        pytest.param({"teardown_allowed": True}, id="teardown-allowed"),
        pytest.param({"labels": {"tier": "db"}, "private_key": "rotated"}, id="labels-and-login-key"),
    ],
)
def test_an_update_of_the_join_that_does_not_run_it_plans_no_new_probe_or_role(change: dict[str, Any]) -> None:
    assert judge(dict(JOINED), {**INPUTS, **change})
    assert join_runs_again("w1") is False
    assert planned() == (False, False)


@pytest.mark.parametrize(
    "olds, change",
    [
        pytest.param(JOINED, {"registry": "registry.example.com"}, id="registry"),
        pytest.param(JOINED, {"ca_hash": UNKNOWN}, id="an-input-not-known-yet"),
        pytest.param(JOINED, {"labels": {"tier": "db"}, "k3s_version": UNKNOWN}, id="labels-and-release"),
        pytest.param({**JOINED, HOST_CHANGED: "another machine"}, {}, id="rebuilt-host-found-by-refresh"),
        pytest.param({**JOINED, "state": "missing"}, {}, id="node-deleted-found-by-refresh"),
    ],
)
def test_a_join_that_runs_again_plans_a_new_probe_and_role(olds: dict[str, Any], change: dict[str, Any]) -> None:
    assert judge(dict(olds), {**INPUTS, **change})
    assert join_runs_again("w1") is True
    assert planned() == (True, True)


def test_a_replaced_join_plans_a_new_probe_and_role(monkeypatch: pytest.MonkeyPatch) -> None:
    # A joined worker's replacement asks the server whether it is fenced (it is not, here).
    async def unfenced(_server: Any, node: str, _wait: float) -> NodeStatus:
        return NodeStatus(name=node, ready=True, kubelet_version="v1.36.1+k3s1")

    monkeypatch.setattr(node_join, "read_node", unfenced)
    assert NodeJoinProvider().diff("w1-join", dict(JOINED), {**INPUTS, "address": "198.51.100.9"}).replaces
    assert join_runs_again("w1") is True
    assert planned() == (True, True)


def test_without_a_judgement_of_the_join_a_preview_plans_the_run() -> None:
    # The join's diff ran in no process this one knows of: nobody can tell, so the run is planned.
    assert join_runs_again("w1") is None
    assert planned() == (True, True)


def test_a_join_with_nothing_to_change_is_judged_not_to_run() -> None:
    assert not judge(dict(JOINED), dict(INPUTS))
    assert join_runs_again("w1") is False


def test_a_known_new_run_of_the_join_is_a_new_probe_and_role_whatever_the_judgement() -> None:
    # In the up the join has run: its new stamp decides, not the preview's judgement.
    judge(dict(JOINED), {**INPUTS, "labels": {"tier": "db"}})
    assert join_runs_again("w1") is False
    probe = DiskProbeProvider().diff("w1-disk", dict(PROBED), {**PROBE_INPUTS, "join_run": "later"})
    role = LonghornNodeRoleProvider().diff("w1-longhorn-role", dict(ROLE), {**ROLE_INPUTS, "join_run": "later"})
    assert probe.changes and role.changes and not probe.replaces and not role.replaces


def test_the_diffs_an_update_asks_itself_leave_the_judgement_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """An update asks its own diff (which inputs changed besides the labels): those questions are
    not the engine's diff, and do not overwrite what the engine's diff judged."""
    judge(dict(JOINED), {**INPUTS, "registry": "registry.example.com"})
    outs: list[dict[str, Any]] = []

    async def set_metadata(*_args: Any, **_kwargs: Any) -> None:
        outs.append({})

    monkeypatch.setattr(node_join, "update_node_metadata", set_metadata)
    NodeJoinProvider().update("w1-join", dict(JOINED), {**INPUTS, "labels": {"tier": "db"}})
    assert outs == [{}]
    assert join_runs_again("w1") is True
