"""The network-mode decision from addresses and routing tables, one rule at a time.

The facts are written as `host_facts.sh` prints them (`ip -4 -o addr`, `ip -4 route`)
for the shapes the seed names: a Hetzner Cloud network (/32 address, routed via the
network's gateway), a vSwitch-like shared LAN, a VPC whose private NIC carries the
default route, a host behind NAT, a network overlapping the pod network. The lab tests
(tests/lab/test_network_mode.py) run the same decision on real hosts' facts."""

from __future__ import annotations

import pytest

from node_operations.network_mode import (
    HostNetwork,
    NetworkRefusedError,
    NetworkSetting,
    PrivatePath,
    Recorded,
    candidate_refusal,
    decide,
    local_node_ips,
    parse_route,
)

AUTO = NetworkSetting(mode="auto", private_network=None, pod_cidr="10.42.0.0/16", service_cidr="10.43.0.0/16")


def hetzner(node: str, public: str, private: str) -> HostNetwork:
    """A Hetzner Cloud server on a cloud network: /32 on enp7s0, the network routed via .1."""
    return HostNetwork.from_facts(
        node,
        [f"eth0 {public}/32", f"enp7s0 {private}/32"],
        [
            "default via 172.31.1.1 dev eth0",
            "10.0.0.0/16 via 10.0.0.1 dev enp7s0",
            "10.0.0.1 dev enp7s0 scope link",
            "172.31.1.1 dev eth0 scope link",
        ],
    )


def lan(
    node: str, public: str, private: str | None, *, default_private: bool = False, net: str = "10.0"
) -> HostNetwork:
    addresses = [f"eth0 {public}/24"]
    routes = [f"{public.rsplit('.', 1)[0]}.0/24 dev eth0 proto kernel scope link src {public}"]
    if private:
        addresses.append(f"enp7s0 {private}/16")
        routes.append(f"{net}.0.0/16 dev enp7s0 proto kernel scope link src {private}")
    routes.append(f"default via {net}.0.1 dev enp7s0" if default_private else "default via 203.0.113.1 dev eth0")
    return HostNetwork.from_facts(node, addresses, routes)


def test_routes_parse_like_the_kernel_prints_them() -> None:
    route = parse_route("10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto static metric 100")
    assert route is not None and str(route.destination) == "10.0.0.0/16" and route.device == "enp7s0"
    assert str(route.gateway) == "10.0.0.1"
    default = parse_route("default via 172.31.1.1 dev eth0 proto dhcp src 198.51.100.7 metric 100")
    assert default is not None and default.is_default
    assert parse_route("blackhole 10.42.0.0/24") is None
    host = parse_route("10.0.0.1 dev enp7s0 scope link")
    assert host is not None and host.destination.prefixlen == 32


def test_hetzner_cloud_network_is_private() -> None:
    server = hetzner("srv", "198.51.100.2", "10.0.1.2")
    worker = hetzner("w1", "198.51.100.3", "10.0.1.3")
    decision = decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded())
    assert decision.mode == "private"
    assert decision.addresses == {"srv": "10.0.1.2", "w1": "10.0.1.3"}
    assert decision.paths["w1"] == PrivatePath("w1", "10.0.1.3", "10.0.1.2", "10.0.0.0/16", "route")


def test_no_shared_network_is_public_and_names_why() -> None:
    server = hetzner("srv", "198.51.100.2", "10.0.1.2")
    metal = lan("metal", "203.0.113.9", None)
    decision = decide(AUTO, server, "198.51.100.2", [(metal, "203.0.113.9")], Recorded())
    assert decision.mode == "public"
    assert decision.addresses == {"srv": "198.51.100.2", "metal": "203.0.113.9"}
    assert "metal has no private path to the server srv" in decision.notes[0]


def test_one_worker_without_a_path_makes_auto_public_for_all() -> None:
    server = hetzner("srv", "198.51.100.2", "10.0.1.2")
    workers = [
        (hetzner("w1", "198.51.100.3", "10.0.1.3"), "198.51.100.3"),
        (lan("m", "203.0.113.9", None), "203.0.113.9"),
    ]
    decision = decide(AUTO, server, "198.51.100.2", workers, Recorded())
    assert decision.mode == "public" and decision.addresses["w1"] == "198.51.100.3"


def test_private_setting_without_a_path_is_refused_naming_the_host() -> None:
    server = hetzner("srv", "198.51.100.2", "10.0.1.2")
    setting = NetworkSetting("private", None, "10.42.0.0/16", "10.43.0.0/16")
    with pytest.raises(NetworkRefusedError, match=r"hk3s:network.mode is private, but metal has no private path"):
        decide(setting, server, "198.51.100.2", [(lan("metal", "203.0.113.9", None), "203.0.113.9")], Recorded())


def test_behind_nat_a_private_lan_address_is_not_a_shared_network() -> None:
    server = lan("srv", "198.51.100.2", "10.0.0.2")
    natted = HostNetwork.from_facts(
        "nat", ["eth0 192.168.7.2/24"], ["default via 192.168.7.1 dev eth0", "192.168.7.0/24 dev eth0 scope link"]
    )
    decision = decide(AUTO, server, "198.51.100.2", [(natted, "203.0.113.40")], Recorded())
    assert decision.mode == "public" and decision.addresses["nat"] == "203.0.113.40"
    # Its public address is not its own: the server must prove it can connect to it there.
    assert decision.behind_nat == ["nat"]
    own = lan("w", "198.51.100.3", None)
    assert decide(AUTO, server, "198.51.100.2", [(own, "198.51.100.3")], Recorded()).behind_nat == []


def test_default_route_network_is_a_candidate_to_check_and_print() -> None:
    server = lan("srv", "198.51.100.2", "10.0.0.2")
    worker = lan("w1", "198.51.100.3", "10.0.0.3", default_private=True)
    decision = decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded())
    assert decision.candidate == PrivatePath("w1", "10.0.0.3", "10.0.0.2", "10.0.0.0/16", "default-route")
    message = str(candidate_refusal(decision.candidate))
    assert "private_network: 10.0.0.0/16" in message and "Nothing was joined" in message
    # When its connections fail, auto falls back to public.
    fallback = decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded(), candidates_unusable=True)
    assert fallback.mode == "public"


def test_a_later_default_route_worker_is_told_the_setting() -> None:
    # The mode is fixed private; a new worker shares only a default-route network with the server.
    server = lan("srv", "198.51.100.2", "10.0.0.2")
    worker = lan("w2", "198.51.100.4", "10.0.0.4", default_private=True)
    with pytest.raises(NetworkRefusedError, match=r"w2 shares 10\.0\.0\.0/16 .*private_network: 10\.0\.0\.0/16"):
        decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.4")], Recorded("private", {}))


def test_explicit_private_network_uses_the_default_route_network() -> None:
    server = lan("srv", "198.51.100.2", "10.0.0.2")
    worker = lan("w1", "198.51.100.3", "10.0.0.3", default_private=True)
    setting = NetworkSetting("auto", "10.0.0.0/16", "10.42.0.0/16", "10.43.0.0/16")
    decision = decide(setting, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded())
    assert decision.mode == "private" and decision.paths["w1"].kind == "explicit"
    assert decision.addresses == {"srv": "10.0.0.2", "w1": "10.0.0.3"}


def test_recorded_worker_rejoins_without_the_setting() -> None:
    server = lan("srv", "198.51.100.2", "10.0.0.2")
    worker = lan("w1", "198.51.100.3", "10.0.0.3", default_private=True)
    recorded = Recorded("private", {"w1": PrivatePath("w1", "10.0.0.3", "10.0.0.2", "10.0.0.0/16", "explicit")})
    decision = decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], recorded)
    assert decision.mode == "private" and decision.addresses["w1"] == "10.0.0.3"


def test_overlap_with_the_pod_network_is_refused() -> None:
    server = lan("srv", "198.51.100.2", "10.42.0.2", net="10.42")
    worker = lan("w1", "198.51.100.3", "10.42.0.3", net="10.42")
    with pytest.raises(NetworkRefusedError, match=r"10.42.0.0/16 overlaps the cluster's pod cidr 10.42.0.0/16"):
        decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded())


def test_recorded_private_addresses_are_reused_when_routes_reach_them() -> None:
    # The private addresses sit on a VLAN interface; the route to the peer's subnet goes
    # through another interface, so automatic selection finds no path.
    server = HostNetwork.from_facts(
        "srv",
        ["eth0 198.51.100.2/24", "vlan4000 192.168.100.2/24", "enp9s0 192.168.200.1/30"],
        [
            "default via 198.51.100.1 dev eth0",
            "192.168.100.0/24 dev vlan4000 scope link",
            "192.168.101.0/24 via 192.168.200.2 dev enp9s0",
        ],
        recorded_private="192.168.100.2",
    )
    worker = HostNetwork.from_facts(
        "w1",
        ["eth0 198.51.100.3/24", "vlan4001 192.168.101.3/24", "enp9s0 192.168.200.2/30"],
        [
            "default via 198.51.100.1 dev eth0",
            "192.168.101.0/24 dev vlan4001 scope link",
            "192.168.100.0/24 via 192.168.200.1 dev enp9s0",
        ],
        recorded_private="192.168.101.3",
    )
    decision = decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded())
    assert decision.mode == "private"
    assert decision.paths["w1"].kind == "recorded" and decision.addresses["w1"] == "192.168.101.3"


def test_mode_is_fixed_after_the_first_join() -> None:
    server = hetzner("srv", "198.51.100.2", "10.0.1.2")
    worker = hetzner("w1", "198.51.100.3", "10.0.1.3")
    public_now = NetworkSetting("public", None, "10.42.0.0/16", "10.43.0.0/16")
    with pytest.raises(NetworkRefusedError, match=r"first join fixed it to private.*Set hk3s:network.mode back"):
        decide(public_now, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded("private", {}))
    # auto keeps the recorded public mode although a private path now exists.
    decision = decide(AUTO, server, "198.51.100.2", [(worker, "198.51.100.3")], Recorded("public", {}))
    assert decision.mode == "public"
    # A later worker without a private path cannot join a private cluster.
    with pytest.raises(NetworkRefusedError, match=r"first join fixed private mode, but metal"):
        decide(
            AUTO,
            server,
            "198.51.100.2",
            [(worker, "198.51.100.3"), (lan("metal", "203.0.113.9", None), "203.0.113.9")],
            Recorded("private", {}),
        )


def test_no_worker_leaves_the_mode_pending() -> None:
    decision = decide(AUTO, hetzner("srv", "198.51.100.2", "10.0.1.2"), "198.51.100.2", [], Recorded())
    assert decision.mode == "pending" and decision.addresses == {"srv": "198.51.100.2"}


def test_behind_a_one_to_one_nat_k3s_binds_the_hosts_own_address() -> None:
    natted = HostNetwork.from_facts(
        "nat", ["eth0 100.64.3.2/24"], ["default via 100.64.3.1 dev eth0", "100.64.3.0/24 dev eth0 scope link"]
    )
    own = lan("w", "198.51.100.3", "10.0.0.3")
    addresses = {"nat": "203.0.113.40", "w": "198.51.100.3"}
    assert local_node_ips(addresses, {"nat": natted, "w": own}) == {"nat": "100.64.3.2", "w": "198.51.100.3"}
