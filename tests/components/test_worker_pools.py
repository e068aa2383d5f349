"""A pool's Hetzner servers and spread placement groups, under Pulumi mocks.

Hetzner Cloud cannot be reached from the test machine, so the engine and Hetzner are mocked
(tests/components/mock_engine.py): the monitor records each resource as the engine receives
it. Mocks plan no replacement, so what keeps a running worker where it is — its placement
group and location ignored after creation — is checked as the resource options sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings
from components.program import build_cluster, read_credentials
from tests.components.mock_engine import ClusterMocks, Recording, fake_id, run_with_mocks

SERVER = "hcloud:index/server:Server"
PLACEMENT_GROUP = "hcloud:index/placementGroup:PlacementGroup"


def _config(key_file: Path, pools: list[dict[str, Any]], workers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "cluster": {"name": "shop", "k3s_version": "v1.36.1+k3s1", "server_type": "cx23", "location": "fsn1"},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "network": {"mode": "private"},
        "workers": workers or [],
        "worker_pools": pools,
    }


def _run(config: dict[str, Any], mocks: ClusterMocks | None = None) -> Recording:
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), mocks=mocks, stack="dev")


def test_a_pool_becomes_named_servers_spread_over_locations_and_groups(ssh_key_file: Path) -> None:
    graph = _run(
        _config(
            ssh_key_file,
            [{"name": "web", "count": 12, "server_type": "cx33", "locations": ["fsn1", "nbg1"], "taints": []}],
        )
    )
    servers = {s.name: s for s in graph.of_type(SERVER) if s.name != "srv"}
    assert sorted(servers) == sorted(f"web-{n}" for n in range(1, 13))
    for number in range(1, 13):
        server = servers[f"web-{number}"]
        assert server.inputs["name"] == f"shop-dev-web-{number}"
        assert server.inputs["serverType"] == "cx33"
        assert server.inputs["location"] == ("fsn1" if number % 2 else "nbg1")
    groups = {g.name: g for g in graph.of_type(PLACEMENT_GROUP)}
    # 6 workers per location: one spread group each (Hetzner's limit is 10 per group).
    assert sorted(groups) == ["placement-web-fsn1-1", "placement-web-nbg1-1"]
    for group in groups.values():
        assert group.inputs["type"] == "spread"
        assert group.inputs["labels"] == {"hk3s-cluster": "shop", "hk3s-stack": "dev"}
    members: dict[str, list[str]] = {}
    for name, server in servers.items():
        (group,) = [g for g in groups.values() if g.urn in server.dependencies]
        # The server is created in its group (the id the engine handed back for it).
        assert server.inputs["placementGroupId"] == int(fake_id(group.name))
        members.setdefault(group.name, []).append(name)
        # A running worker is never moved between groups (Hetzner would need it powered off).
        assert "placementGroupId" in server.ignore_changes and "location" in server.ignore_changes
    assert all(len(names) <= 10 for names in members.values())
    assert {server.inputs["location"] for server in (servers[n] for n in members["placement-web-nbg1-1"])} == {"nbg1"}
    # The server and explicit workers are in no group.
    (server,) = [s for s in graph.of_type(SERVER) if s.name == "srv"]
    assert "placementGroupId" not in server.inputs


def test_more_than_ten_workers_in_a_location_get_a_second_group(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file, [{"name": "big", "count": 11}]))
    groups = {g.name for g in graph.of_type(PLACEMENT_GROUP)}
    assert groups == {"placement-big-fsn1-1", "placement-big-fsn1-2"}
    servers = {s.name: s for s in graph.of_type(SERVER)}
    assert servers["big-11"].inputs["placementGroupId"] == int(fake_id("placement-big-fsn1-2"))
    assert servers["big-10"].inputs["placementGroupId"] == int(fake_id("placement-big-fsn1-1"))


def test_without_placement_or_workers_no_group_is_made(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file, [{"name": "loose", "count": 2, "placement": False}, {"name": "none"}]))
    assert graph.of_type(PLACEMENT_GROUP) == []
    assert {s.name for s in graph.of_type(SERVER)} == {"srv", "loose-1", "loose-2"}
    (loose,) = [s for s in graph.of_type(SERVER) if s.name == "loose-1"]
    assert "placementGroupId" not in loose.inputs


def test_pool_workers_join_with_the_pools_labels_and_taints(ssh_key_file: Path) -> None:
    graph = _run(
        _config(
            ssh_key_file,
            [{"name": "web", "count": 1, "labels": {"tier": "web"}, "taints": ["dedicated=web:NoSchedule"]}],
            workers=[{"name": "metal", "kind": "existing", "address": "198.51.100.40", "pool": "web"}],
        )
    )
    for name in ("web-1", "metal"):
        join = graph.by_name(f"{name}-join")
        assert join.inputs["labels"] == {"tier": "web"}
        assert join.inputs["taints"] == ["dedicated=web:NoSchedule"]
    # Every worker knows every other as a recorded node, pool members included.
    assert graph.by_name("metal-join").inputs["recorded_nodes"] == ["metal", "srv", "web-1"]


def test_a_placement_group_name_another_owner_holds_is_refused(ssh_key_file: Path) -> None:
    mocks = ClusterMocks()
    mocks.hetzner_placement_groups = [("shop-dev-web-fsn1-1", {})]
    with pytest.raises(SettingsError) as caught:
        _run(_config(ssh_key_file, [{"name": "web", "count": 1}]), mocks)
    assert "hk3s:worker_pools[0]: the Hetzner project already has a placement group named 'shop-dev-web-fsn1-1'" in str(
        caught.value
    )
    # This stack's own group (by its labels) is no conflict.
    mocks.hetzner_placement_groups = [("shop-dev-web-fsn1-1", {"hk3s-cluster": "shop", "hk3s-stack": "dev"})]
    assert len(_run(_config(ssh_key_file, [{"name": "web", "count": 1}]), mocks).of_type(PLACEMENT_GROUP)) == 1


def test_lowering_a_count_leaves_the_dropped_workers_to_the_roster_which_their_peers_wait_for(
    ssh_key_file: Path,
) -> None:
    """Scale-down goes through the remove path: the roster's list loses the highest number (or the
    retired one) and its removal runs in the roster's update (providers.worker_roster), which every
    staying worker's firewall and join waits for. The leaving worker's own server is no longer in
    the program, so the engine deletes it after the run's updates: after its removal."""
    roster_of: dict[int, Recording] = {}
    for count in (3, 2):
        roster_of[count] = _run(_config(ssh_key_file, [{"name": "web", "count": count}]))
    before, after = roster_of[3].by_name("workers"), roster_of[2].by_name("workers")
    assert before.inputs["workers"] == ["web-1", "web-2", "web-3"]
    assert after.inputs["workers"] == ["web-1", "web-2"]
    # The roster records how to log in to each node (the key as a secret) so a leaving worker
    # can still be reached once it is no longer in the settings.
    assert {m["node"] for m in before.inputs["members"]} == {"web-1", "web-2", "web-3"}
    assert before.inputs["server"]["node"] == "srv" and before.is_secret("private_key")
    assert {r.name for r in roster_of[2].of_type(SERVER)} == {"srv", "web-1", "web-2"}
    for name in ("web-1-firewall", "web-2-firewall", "web-1-join", "web-2-join", "srv-firewall"):
        assert after.urn in roster_of[2].by_name(name).dependencies, name
    retired = _run(_config(ssh_key_file, [{"name": "web", "count": 2, "retire": [2]}])).by_name("workers")
    assert retired.inputs["workers"] == ["web-1", "web-3"]
