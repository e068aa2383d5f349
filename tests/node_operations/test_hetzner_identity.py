"""What proves a Hetzner server is the worker the fence powers off (node_operations.hetzner_identity),
on server states as Hetzner's API reports them (its `private_net[].network` and `labels`)."""

from __future__ import annotations

from node_operations.hetzner_identity import identity_refusal
from remote_access.hetzner_api import PrivateAddress, ServerState

CLUSTER_NETWORK = 4101
OTHER_NETWORK = 9999
LABELS = {"hk3s-owner": "hk3s.dev", "hk3s-node": "w1"}


def refusal(
    state: ServerState, *, network: int | None = CLUSTER_NETWORK, labels: dict[str, str] | None = None
) -> str | None:
    return identity_refusal(
        "w1",
        state,
        mine=["198.51.100.11", "10.0.1.3"],
        control_plane=["198.51.100.2", "10.0.1.2"],
        others=[("w2", "198.51.100.12"), ("w2", "10.0.1.4")],
        network=network,
        labels=labels or {},
    )


def server(*private: PrivateAddress, public: str | None = None, labels: dict[str, str] | None = None) -> ServerState:
    return ServerState(4711, "srv", "running", public_ipv4=public, private_net=private, labels=labels or {})


def test_a_private_address_proves_the_server_only_in_the_clusters_network() -> None:
    assert refusal(server(PrivateAddress(CLUSTER_NETWORK, "10.0.1.3"))) is None
    bystander = refusal(server(PrivateAddress(OTHER_NETWORK, "10.0.1.3")))
    assert bystander is not None
    assert bystander.startswith("Hetzner server srv (id 4711; 10.0.1.3 in Hetzner network 9999), which w1's")
    assert f"holds w1's address 10.0.1.3 only in Hetzner network {OTHER_NETWORK}" in bystander
    assert f"this cluster's network is Hetzner network {CLUSTER_NETWORK}" in bystander
    assert "nothing was powered off" in bystander and "hcloud_server" in bystander


def test_with_no_network_of_the_programs_only_a_public_address_proves_the_server() -> None:
    """Existing hosts: the program created no network, so no private address proves anything."""
    private_only = refusal(server(PrivateAddress(1, "10.0.1.3")), network=None)
    assert private_only is not None and "the program created no Hetzner network for this cluster" in private_only
    assert "must hold one of w1's public addresses" in private_only
    assert refusal(server(PrivateAddress(1, "10.0.1.3"), public="198.51.100.11"), network=None) is None


def test_another_nodes_address_is_named_in_the_clusters_network_only_when_it_is_known() -> None:
    control = refusal(server(PrivateAddress(CLUSTER_NETWORK, "10.0.1.2")))
    assert control is not None and "is the control plane's server (it holds 10.0.1.2)" in control
    # The control plane's private address in another network is not the control plane's server;
    # it holds none of w1's addresses either.
    elsewhere = refusal(server(PrivateAddress(OTHER_NETWORK, "10.0.1.2")))
    assert elsewhere is not None and "holds none of w1's addresses" in elsewhere
    # No network known: any server holding another node's address, in any network, is refused as such.
    unknown = refusal(server(PrivateAddress(OTHER_NETWORK, "10.0.1.4"), public="198.51.100.11"), network=None)
    assert unknown is not None and "is w2's server (it holds 10.0.1.4)" in unknown


def test_a_server_the_program_created_must_carry_its_owner_and_node_labels() -> None:
    mine = PrivateAddress(CLUSTER_NETWORK, "10.0.1.3")
    assert refusal(server(mine, labels={**LABELS, "hk3s-role": "worker"}), labels=LABELS) is None
    relabelled = refusal(server(mine, labels={**LABELS, "hk3s-node": "w9"}), labels=LABELS)
    assert relabelled is not None and "carries hk3s-node=w9, not the labels the program gave" in relabelled
    assert "(hk3s-node=w1, hk3s-owner=hk3s.dev)" in relabelled and "nothing was powered off" in relabelled
    unlabelled = refusal(server(mine), labels=LABELS)
    assert unlabelled is not None and "carries hk3s-node=(none), hk3s-owner=(none)" in unlabelled
    # An existing host's server: the program gave it no labels, so none are asked for.
    assert refusal(server(mine)) is None
