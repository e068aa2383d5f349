"""Which copies a reboot moves to the server first, and whether the server has room for them, from
Longhorn's objects as its API gives them (the move itself runs in the lab:
tests/lab/test_copies_lifecycle.py)."""

from __future__ import annotations

from typing import Any

from node_operations.pinned_copies import MOVING_ANNOTATION, SERVER_TAG, node_room, pinned_copies_on

GIB = 1024**3


def volume(name: str, replicas: int = 1, selector: tuple[str, ...] = (SERVER_TAG,), **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "annotations": extra.pop("annotations", {})}
    spec = {"numberOfReplicas": replicas, "nodeSelector": list(selector), "size": str(GIB)}
    return {"metadata": metadata, "spec": spec, "status": {"state": extra.pop("state", "attached")}}


def replica(name: str, volume_name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"volumeName": volume_name, "nodeID": node}}


def test_only_single_copy_volumes_pinned_to_the_server_with_their_copy_here_move() -> None:
    volumes = [
        volume("db"),  # pinned, its copy on w1: moves
        volume("cache", selector=()),  # not pinned: may stay
        volume("shared", replicas=2, selector=("hk3s-copies",)),  # two copies: the other one survives
        volume("moving", replicas=2, annotations={MOVING_ANNOTATION: "true"}),  # a move under way: finished
        volume("elsewhere"),  # pinned, its copy on the server already
        volume("idle", state="detached"),
    ]
    replicas = [
        replica("db-r", "db", "w1"),
        replica("cache-r", "cache", "w1"),
        replica("shared-r1", "shared", "w1"),
        replica("moving-r1", "moving", "w1"),
        replica("elsewhere-r", "elsewhere", "srv"),
        replica("idle-r", "idle", "w1"),
    ]
    found = pinned_copies_on("w1", volumes, replicas)
    assert [(c.volume, c.replica, c.moving, c.attached) for c in found] == [
        ("db", "db-r", False, True),
        ("idle", "idle-r", False, False),
        ("moving", "moving-r1", True, True),
    ]
    assert all(c.size == GIB for c in found)


def node(*, maximum: int, available: int, scheduled: int = 0, reserved: int = 0, allow: bool = True) -> dict[str, Any]:
    return {
        "spec": {"allowScheduling": allow, "disks": {"d": {"allowScheduling": True, "storageReserved": reserved}}},
        "status": {
            "diskStatus": {
                "d": {"storageMaximum": maximum, "storageAvailable": available, "storageScheduled": scheduled}
            }
        },
    }


def test_the_servers_room_follows_longhorns_rules() -> None:
    # 100 GiB disk, 40 available, 25 % kept free: 15 GiB by what is available.
    assert node_room(node(maximum=100 * GIB, available=40 * GIB), 25) == 15 * GIB
    # 30 GiB reserved and 60 scheduled: 10 GiB left to schedule, below the 15 available.
    assert node_room(node(maximum=100 * GIB, available=40 * GIB, scheduled=60 * GIB, reserved=30 * GIB), 25) == 10 * GIB
    # Full, or taking no copies: no room.
    assert node_room(node(maximum=100 * GIB, available=20 * GIB), 25) == 0
    assert node_room(node(maximum=100 * GIB, available=90 * GIB, allow=False), 25) == 0
    assert node_room({}, 25) == 0
