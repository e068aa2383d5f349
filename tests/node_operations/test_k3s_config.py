"""The k3s server's config file as the program writes it."""

from __future__ import annotations

import yaml

from node_operations.k3s_install import K3sBinary, ServerSpec, server_config


def _spec(**overrides: object) -> ServerSpec:
    values: dict = dict(
        node="srv",
        node_ip="10.0.1.2",
        external_ip="198.51.100.2",
        pod_cidr="10.42.0.0/16",
        service_cidr="10.43.0.0/16",
        flannel_backend="vxlan",
        binary=K3sBinary(version="v1.36.1+k3s1"),
    )
    values.update(overrides)
    return ServerSpec(**values)


def test_private_mode_advertises_the_api_on_the_private_address() -> None:
    # With node-external-ip set, k3s would advertise the public address, which the server's
    # firewall closes to 6443 in private mode.
    config = yaml.safe_load(server_config(_spec(advertise_address="10.0.1.2"), "enp7s0"))
    assert config["advertise-address"] == "10.0.1.2"
    assert config["node-external-ip"] == "198.51.100.2" and config["node-ip"] == "10.0.1.2"


def test_public_mode_leaves_the_advertise_address_to_k3s() -> None:
    config = yaml.safe_load(server_config(_spec(node_ip="198.51.100.2"), "eth0"))
    assert "advertise-address" not in config and "node-external-ip" not in config
