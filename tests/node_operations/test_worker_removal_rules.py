"""Where a leaving worker's copies can go: Longhorn's objects as its API returns them (field
names from Longhorn's `longhorn.io/v1beta2` CRDs), judged without a cluster."""

from __future__ import annotations

from typing import Any

from node_operations.worker_removal import PeerFirewall, RemovalReport, copies_that_cannot_move

GIB = 2**30


def node(name: str, tags: list[str], *, free_gib: int = 100, scheduling: bool = True, evicting: bool = False) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "allowScheduling": scheduling,
            "evictionRequested": evicting,
            "tags": tags,
            "disks": {"default": {"path": "/var/lib/longhorn", "allowScheduling": True, "storageReserved": 30 * GIB}},
        },
        "status": {
            "diskStatus": {
                "default": {
                    "storageMaximum": 200 * GIB,
                    "storageAvailable": free_gib * GIB,
                    "storageScheduled": 0,
                }
            }
        },
    }


def volume(name: str, size_gib: int, copies: int, selector: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"size": str(size_gib * GIB), "numberOfReplicas": copies, "nodeSelector": selector},
    }


def replica(volume_name: str, on: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{volume_name}-r-{on}"}, "spec": {"volumeName": volume_name, "nodeID": on}}


SERVER = node("srv", ["hk3s-server", "hk3s-copies"])


def test_a_copy_moves_to_a_node_with_the_tags_and_room() -> None:
    nodes = [SERVER, node("w1", ["hk3s-copies"]), node("w2", ["hk3s-copies"])]
    volumes = [volume("db", 10, 2, ["hk3s-copies"])]
    replicas = [replica("db", "w1"), replica("db", "srv")]
    assert copies_that_cannot_move({"w1"}, volumes, replicas, nodes, 25) == []


def test_two_copies_never_share_a_node() -> None:
    # The only other eligible node already holds the volume's other copy.
    nodes = [SERVER, node("w1", ["hk3s-copies"])]
    volumes = [volume("db", 10, 2, ["hk3s-copies"])]
    replicas = [replica("db", "w1"), replica("db", "srv")]
    problems = copies_that_cannot_move({"w1"}, volumes, replicas, nodes, 25)
    assert problems == [
        "volume db: 1 copies to move, 0 other node(s) with tags hk3s-copies accept a copy and do not hold one already"
    ]


def test_a_node_without_the_tag_or_refusing_copies_is_no_place() -> None:
    nodes = [
        SERVER,
        node("w1", ["hk3s-copies"]),
        node("w2", []),  # failed its disk probe: no copies tag
        node("w3", ["hk3s-copies"], scheduling=False),
        node("w4", ["hk3s-copies"], evicting=True),
    ]
    volumes = [volume("db", 10, 2, ["hk3s-copies"])]
    problems = copies_that_cannot_move({"w1"}, volumes, [replica("db", "w1"), replica("db", "srv")], nodes, 25)
    assert len(problems) == 1 and problems[0].startswith("volume db: 1 copies to move, 0 other node(s)")


def test_no_room_is_named_with_the_size() -> None:
    # 40 GiB free of 200: a 20 GiB copy would leave 20 GiB, under the 25 % minimal available.
    nodes = [node("srv", ["hk3s-server", "hk3s-copies"], free_gib=40), node("w1", ["hk3s-copies"])]
    volumes = [volume("logs", 20, 1, ["hk3s-server"])]
    problems = copies_that_cannot_move({"w1"}, volumes, [replica("logs", "w1")], nodes, 25)
    assert problems == ["volume logs: no node it may use has room for its 20.0 GiB"]
    # With room, the same copy moves.
    roomy = [node("srv", ["hk3s-server", "hk3s-copies"], free_gib=150), node("w1", ["hk3s-copies"])]
    assert copies_that_cannot_move({"w1"}, volumes, [replica("logs", "w1")], roomy, 25) == []


def test_room_taken_by_one_copy_counts_for_the_next() -> None:
    # 110 GiB free on the one eligible node: the first 40 GiB copy fits, the second no longer
    # leaves the 50 GiB minimum (25 % of 200).
    nodes = [node("srv", ["hk3s-server"], free_gib=110), node("w1", [])]
    volumes = [volume("a", 40, 1, ["hk3s-server"]), volume("b", 40, 1, ["hk3s-server"])]
    problems = copies_that_cannot_move({"w1"}, volumes, [replica("a", "w1"), replica("b", "w1")], nodes, 25)
    assert problems == ["volume b: no node it may use has room for its 40.0 GiB"]


def test_workers_leaving_together_are_no_place_for_each_others_copies() -> None:
    nodes = [SERVER, node("w1", ["hk3s-copies"]), node("w2", ["hk3s-copies"]), node("w3", ["hk3s-copies"])]
    volumes = [volume("db", 10, 2, ["hk3s-copies"])]
    replicas = [replica("db", "w1"), replica("db", "w2")]
    # Leaving alone, w1's copy goes to the server or w3.
    assert copies_that_cannot_move({"w1"}, volumes, replicas, nodes, 25) == []
    # w1, w2 and w3 leaving: both copies need a place and only the server is left.
    problems = copies_that_cannot_move({"w1", "w2", "w3"}, volumes, replicas, nodes, 25)
    assert problems == [
        "volume db: 2 copies to move, 1 other node(s) with tags hk3s-copies accept a copy and do not hold one already"
    ]


def test_volumes_without_a_copy_on_the_leaving_worker_are_not_judged() -> None:
    volumes = [volume("elsewhere", 500, 1, ["hk3s-server"])]
    assert copies_that_cannot_move({"w1"}, volumes, [replica("elsewhere", "srv")], [SERVER], 25) == []


def test_the_report_lists_what_to_remove_from_firewalls_the_operator_runs() -> None:
    report = RemovalReport(
        "w2",
        copies_moved=3,
        pods_evicted=["default/web-1"],
        addresses=["10.0.0.4", "203.0.113.4"],
        wiped=True,
        operator_firewalls=[PeerFirewall("srv", ("6443/tcp", "8472/udp", "10250/tcp"))],
    )
    assert report.lines() == [
        "removed: 3 copies moved off, 1 pod(s) evicted, host wiped, Node deregistered (its join permit revoked)",
        "srv runs a firewall you manage: remove the rules that admit 10.0.0.4, 203.0.113.4 to 6443/tcp, 8472/udp, "
        "10250/tcp",
    ]
    assert RemovalReport("w2", already_gone=True).lines() == ["w2 was already removed: nothing left to do"]
