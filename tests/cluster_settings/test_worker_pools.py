"""Worker pools as the settings expand them: names, numbers, locations, placement groups,
the settings an entry of hk3s:workers takes with `pool:`, and every invalid pool refused
naming its key (no machine is involved: this is the settings layer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings


def _config(key_file: Path, pools: list[dict[str, Any]], workers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "cluster": {"name": "t", "k3s_version": "v1.36.1+k3s1", "server_type": "cx23", "location": "fsn1"},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "workers": workers or [],
        "worker_pools": pools,
    }


def _problems(config: dict[str, Any]) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    return [str(problem) for problem in caught.value.problems]


def test_a_pool_expands_into_numbered_workers_spread_over_its_locations(ssh_key_file: Path) -> None:
    settings = load_settings(
        _config(
            ssh_key_file,
            [
                {
                    "name": "batch",
                    "count": 5,
                    "server_type": "cx33",
                    "locations": ["fsn1", "nbg1", "hel1"],
                    "labels": {"tier": "batch"},
                    "taints": ["dedicated=batch:NoSchedule", "spot:PreferNoSchedule"],
                    "holds_copies": False,
                }
            ],
        )
    )
    workers = settings.all_workers()
    assert [(w.name, w.location) for w in workers] == [
        ("batch-1", "fsn1"),
        ("batch-2", "nbg1"),
        ("batch-3", "hel1"),
        ("batch-4", "fsn1"),
        ("batch-5", "nbg1"),
    ]
    for worker in workers:
        assert worker.kind == "hetzner" and worker.server_type == "cx33" and worker.pool == "batch"
        assert worker.labels == {"tier": "batch"} and not worker.holds_copies
        assert worker.taints == ["dedicated=batch:NoSchedule", "spot:PreferNoSchedule"]
        assert settings.worker_config_key(worker) == "hk3s:worker_pools[0]"
    # Explicit workers keep their config unchanged and come first.
    assert settings.workers == []


def test_lowering_a_count_drops_the_highest_numbers_or_the_retired_ones(ssh_key_file: Path) -> None:
    def names(pool: dict[str, Any]) -> list[str]:
        return [w.name for w in load_settings(_config(ssh_key_file, [pool])).all_workers()]

    assert names({"name": "web", "count": 4}) == ["web-1", "web-2", "web-3", "web-4"]
    assert names({"name": "web", "count": 3}) == ["web-1", "web-2", "web-3"]
    # Retiring web-2: the others keep their names and numbers (and so their locations).
    assert names({"name": "web", "count": 3, "retire": [2]}) == ["web-1", "web-3", "web-4"]
    # Raising the count again takes the next free number; a retired one stays unused.
    assert names({"name": "web", "count": 4, "retire": [2]}) == ["web-1", "web-3", "web-4", "web-5"]
    assert names({"name": "web", "count": 0}) == []


def test_a_location_keeps_its_workers_when_others_are_retired(ssh_key_file: Path) -> None:
    pool = {"name": "web", "count": 4, "locations": ["fsn1", "nbg1"]}
    before = {w.name: w.location for w in load_settings(_config(ssh_key_file, [pool])).all_workers()}
    after = {w.name: w.location for w in load_settings(_config(ssh_key_file, [{**pool, "retire": [1]}])).all_workers()}
    assert all(after[name] == before[name] for name in after if name in before)
    assert after["web-5"] == "fsn1"


def test_placement_groups_hold_at_most_ten_workers_per_pool_and_location(ssh_key_file: Path) -> None:
    settings = load_settings(
        _config(
            ssh_key_file,
            [
                {"name": "big", "count": 25, "locations": ["fsn1", "nbg1"]},
                {"name": "loose", "count": 3, "placement": False},
            ],
        )
    )
    groups = settings.placement_groups()
    assert {group: len(members) for group, members in groups.items()} == {
        "big-fsn1-1": 10,
        "big-nbg1-1": 10,
        "big-fsn1-2": 3,
        "big-nbg1-2": 2,
    }
    # Every member is in its group's location; no worker is in two groups.
    workers = {w.name: w for w in settings.all_workers()}
    for group, members in groups.items():
        assert {workers[name].location for name in members} == {group.split("-")[1]}
    assert sum(len(members) for members in groups.values()) == 25
    assert all(settings.pool_member(workers[f"loose-{n}"]).placement_group is None for n in (1, 2, 3))  # type: ignore[union-attr]
    # A worker's group follows from its number alone: retiring others never moves it.
    retired = load_settings(
        _config(ssh_key_file, [{"name": "big", "count": 24, "locations": ["fsn1", "nbg1"], "retire": [1]}])
    )
    moved = {
        name: group
        for group, members in retired.placement_groups().items()
        for name in members
        if name not in groups[group] and name != "big-26"
    }
    assert moved == {}
    assert len(retired.placement_groups()["big-fsn1-1"]) == 9


def test_a_worker_entry_takes_its_pools_settings_and_its_own_win(ssh_key_file: Path) -> None:
    settings = load_settings(
        _config(
            ssh_key_file,
            [
                {
                    "name": "gpu",
                    "count": 0,
                    "server_type": "cx43",
                    "locations": ["nbg1"],
                    "labels": {"tier": "gpu", "zone": "a"},
                    "taints": ["gpu=true:NoSchedule"],
                    "holds_copies": False,
                }
            ],
            workers=[
                {"name": "gpu-metal", "kind": "existing", "address": "198.51.100.30", "pool": "gpu"},
                {"name": "gpu-cloud", "pool": "gpu", "labels": {"zone": "b"}, "holds_copies": True},
            ],
        )
    )
    metal, cloud = settings.all_workers()
    assert metal.labels == {"tier": "gpu", "zone": "a"} and metal.taints == ["gpu=true:NoSchedule"]
    assert not metal.holds_copies
    # An existing host takes no Hetzner settings.
    assert metal.server_type is None and metal.location is None
    assert cloud.labels == {"tier": "gpu", "zone": "b"} and cloud.holds_copies
    assert cloud.server_type == "cx43" and cloud.location == "nbg1"
    assert settings.worker_config_key(cloud) == "hk3s:workers[1]"
    assert settings.placement_groups() == {}


@pytest.mark.parametrize(
    ("pools", "workers", "key", "fix"),
    [
        ([{"name": "a", "count": 1}, {"name": "a", "count": 1}], [], "hk3s:worker_pools[1].name", "pool names must be unique"),
        ([{"name": "web", "count": 2}], [{"name": "web-2", "kind": "existing", "address": "198.51.100.9"}],
         "hk3s:worker_pools[0].name", "'web-2' (worker 2 of pool web (hk3s:worker_pools[0])) is already the name of hk3s:workers[0].name"),
        ([{"name": "srv", "count": 0}, {"name": "s", "count": 1}], [{"name": "s-1", "kind": "existing", "address": "198.51.100.9"}],
         "hk3s:worker_pools[1].name", "already the name of hk3s:workers[0].name"),
        ([{"name": "web", "count": -1}], [], "hk3s:worker_pools[0].count", "greater than or equal to 0"),
        ([{"name": "web", "count": 1, "taints": ["dedicated=batch"]}], [], "hk3s:worker_pools[0].taints[0]", "needs an effect"),
        ([{"name": "web", "count": 1, "taints": ["dedicated=batch:NoRun"]}], [], "hk3s:worker_pools[0].taints[0]", "needs an effect"),
        ([{"name": "web", "count": 1, "taints": ["bad key:NoSchedule"]}], [], "hk3s:worker_pools[0].taints[0]", "not a valid Kubernetes key"),
        ([{"name": "web", "count": 1, "taints": ["k=bad value:NoSchedule"]}], [], "hk3s:worker_pools[0].taints[0]", "not a valid Kubernetes label value"),
        ([{"name": "web", "count": 1, "taints": ["hk3s.dev/validating=true:NoSchedule"]}], [], "hk3s:worker_pools[0].taints[0]", "uses a key the program or Kubernetes sets"),
        ([{"name": "web", "count": 1, "taints": ["node.kubernetes.io/unreachable:NoExecute"]}], [], "hk3s:worker_pools[0].taints[0]", "uses a key the program or Kubernetes sets"),
        ([{"name": "web", "count": 1, "taints": ["a=1:NoSchedule", "a=2:NoSchedule"]}], [], "hk3s:worker_pools[0].taints", "two taints with key 'a' and effect NoSchedule"),
        ([{"name": "web", "count": 1}], [{"name": "x", "kind": "existing", "address": "198.51.100.9", "pool": "wbe"}],
         "hk3s:workers[0].pool", "there is no pool named 'wbe' in hk3s:worker_pools (pools: web)"),
        ([{"name": "web", "count": 1, "retire": [2, 2]}], [], "hk3s:worker_pools[0].retire", "listed twice"),
        ([{"name": "web", "count": 1, "retire": [0]}], [], "hk3s:worker_pools[0].retire[0]", "greater than or equal to 1"),
        ([{"name": "web", "count": 1, "locations": ["fsn9"]}], [], "hk3s:worker_pools[0].locations[0]", "not a Hetzner Cloud location"),
        ([{"name": "web", "count": 1, "locations": ["ash"]}], [], "hk3s:worker_pools[0].locations", "network zone us-east"),
        ([{"name": "Web", "count": 1}], [], "hk3s:worker_pools[0].name", "not a DNS-1123 node name"),
        ([{"name": "p" * 57, "count": 1}], [], "hk3s:worker_pools[0].name", "longer than 56 characters"),
        ([{"name": "web", "count": 1, "holds_copies": False, "ignore_slow_disk": True}], [], "hk3s:worker_pools[0].ignore_slow_disk", "remove ignore_slow_disk"),
        ([{"name": "web", "count": 1, "colour": "red"}], [], "hk3s:worker_pools[0].colour", "is not a setting"),
    ],
)  # fmt: skip
def test_an_invalid_pool_is_refused_naming_its_key(
    ssh_key_file: Path, pools: list[dict[str, Any]], workers: list[dict[str, Any]], key: str, fix: str
) -> None:
    problems = _problems(_config(ssh_key_file, pools, workers))
    assert any(problem.startswith(key + ":") and fix in problem for problem in problems), problems


def test_a_duplicate_pool_worker_is_reported_once_with_both_entries(ssh_key_file: Path) -> None:
    problems = _problems(
        _config(
            ssh_key_file,
            [{"name": "web", "count": 2}],
            workers=[{"name": "web-1", "kind": "existing", "address": "198.51.100.9"}],
        )
    )
    assert problems == [
        "hk3s:worker_pools[0].name: 'web-1' (worker 1 of pool web (hk3s:worker_pools[0])) is already the name "
        "of hk3s:workers[0].name; node names must be unique: rename one of them"
    ]
