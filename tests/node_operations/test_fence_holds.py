"""The fence's hold without a cluster: the policy's shape, the entries it reads, what a release
removes, and the lines `status` prints for a held workload that runs anyway. The policy itself is
judged by the real API server in the lab (tests/lab/test_fence_workloads_pods.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import yaml

from node_operations.fence_holds import HOLD_POLICY, HOLDS_CONFIGMAP, Held, hold_entries, hold_policy, release
from node_operations.fence_workloads import STOPPED_ANNOTATION
from node_operations.workload_start import held_running
from remote_access.kube import ClusterApi


def test_the_policy_matches_updates_and_the_scale_subresource_and_names_the_stack() -> None:
    policy, binding, configmap = yaml.safe_load_all(hold_policy("prod"))
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    resources = {r for rule in rules for r in rule["resources"]}
    # kubectl scale, KEDA and the HPA go through /scale, where admission sees a Scale object.
    assert {"deployments/scale", "statefulsets/scale", "replicasets/scale"} <= resources
    assert {"deployments", "statefulsets", "replicasets", "jobs", "cronjobs"} <= resources
    assert all(rule["operations"] == ["UPDATE"] for rule in rules)
    assert policy["spec"]["failurePolicy"] == "Fail"
    message = policy["spec"]["validations"][0]["messageExpression"]
    assert "scripts/hk3s --stack prod workload start " in message and "--accept-stale-data" in message
    # No ConfigMap: nothing is held (Deny would refuse every Deployment update of the cluster).
    assert binding["spec"]["paramRef"] == {
        "name": HOLDS_CONFIGMAP,
        "namespace": "kube-system",
        "parameterNotFoundAction": "Allow",
    }
    assert binding["spec"]["policyName"] == HOLD_POLICY and binding["spec"]["validationActions"] == ["Deny"]
    assert configmap["kind"] == "ConfigMap" and "data" not in configmap


def test_an_entry_is_keyed_as_a_request_names_its_object_and_names_the_fence_and_the_workload() -> None:
    held = [
        Held("Deployment", "shop", "db", "shop/Deployment/db"),
        Held("ReplicaSet", "shop", "db-5d9c", "shop/Deployment/db"),
        Held("CronJob", "ops", "nightly", "ops/CronJob/nightly"),
    ]
    assert hold_entries(held, "w1", "stale") == {
        "deployments.shop.db": "w1 stale shop/Deployment/db",
        "replicasets.shop.db-5d9c": "w1 stale shop/Deployment/db",
        "cronjobs.ops.nightly": "w1 stale ops/CronJob/nightly",
    }


class HoldsApi:
    """The API server's answers to the reads and patches of a release (a stand-in: no API server
    runs here; the lab runs the release against the real one)."""

    def __init__(self, data: dict[str, str] | None) -> None:
        self.data = data
        self.patches: list[dict[str, Any]] = []

    async def kubectl(self, args: list[str], **_: Any) -> str:
        assert args[:3] == ["get", "configmap", HOLDS_CONFIGMAP], args
        return "" if self.data is None else json.dumps({"data": self.data})

    async def patch_merge(self, kind: str, name: str, namespace: str, patch: dict[str, Any]) -> None:
        assert (kind, name, namespace) == ("configmap", HOLDS_CONFIGMAP, "kube-system")
        self.patches.append(patch)


def test_a_release_removes_the_workloads_holds_and_its_replicasets_only() -> None:
    api = HoldsApi(
        {
            "deployments.shop.db": "w1 stale shop/Deployment/db",
            "replicasets.shop.db-5d9c": "w1 stale shop/Deployment/db",
            "deployments.shop.db2": "w1 stale shop/Deployment/db2",
        }
    )
    asyncio.run(release(cast(ClusterApi, api), "shop/Deployment/db"))
    assert api.patches == [{"data": {"deployments.shop.db": None, "replicasets.shop.db-5d9c": None}}]
    nothing = HoldsApi(None)  # no ConfigMap: nothing held, nothing patched
    asyncio.run(release(cast(ClusterApi, nothing), "shop/Deployment/db"))
    assert nothing.patches == []


def record(node: str = "w1", reason: str = "stale") -> dict[str, str]:
    return {STOPPED_ANNOTATION: json.dumps({"node": node, "reason": reason, "replicas": 2, "volumes": []})}


def test_status_names_a_held_workload_that_runs_anyway_and_nothing_else() -> None:
    objects: list[dict[str, Any]] = [
        {
            "kind": "Deployment",
            "metadata": {"namespace": "shop", "name": "db", "annotations": record()},
            "spec": {"replicas": 1},
            "status": {"replicas": 1},
        },
        # Held and stopped: nothing to say.
        {
            "kind": "StatefulSet",
            "metadata": {"namespace": "shop", "name": "queue", "annotations": record()},
            "spec": {"replicas": 0},
            "status": {},
        },
        # Held at 0 with a pod left (scaled up and down again while its pod runs).
        {
            "kind": "StatefulSet",
            "metadata": {"namespace": "shop", "name": "cache", "annotations": record(reason="only-copy")},
            "spec": {"replicas": 0},
            "status": {"replicas": 1},
        },
        # A Deployment's ReplicaSet carries a copy of its record: the Deployment is the one named.
        {
            "kind": "ReplicaSet",
            "metadata": {
                "namespace": "shop",
                "name": "db-5d9c",
                "annotations": record(),
                "ownerReferences": [{"kind": "Deployment", "name": "db", "controller": True}],
            },
            "spec": {"replicas": 1},
            "status": {"replicas": 1},
        },
        {
            "kind": "CronJob",
            "metadata": {"namespace": "ops", "name": "nightly", "annotations": record()},
            "spec": {"suspend": False},
            "status": {},
        },
        # Running and never held: not the fence's business.
        {"kind": "Deployment", "metadata": {"namespace": "shop", "name": "web"}, "spec": {"replicas": 3}},
    ]
    lines = held_running(objects, "prod")
    assert len(lines) == 3, lines
    cronjob, db, cache = lines
    assert db.startswith("Deployment shop/db is held stopped by the fence of w1 (stale) but runs anyway"), db
    assert "(replicas: 1, 1 pod(s))" in db
    assert db.endswith("scripts/hk3s --stack prod workload start shop/Deployment/db --accept-stale-data"), db
    assert cache.startswith("StatefulSet shop/cache is held stopped by the fence of w1 (only-copy)"), cache
    assert "(1 pod(s))" in cache
    assert cronjob.startswith("CronJob ops/nightly is held stopped") and "(suspend: false)" in cronjob
