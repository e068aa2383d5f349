"""What the k3s server publishes beyond the port plan: ServiceLB and Traefik.

k3s runs both by default, and ServiceLB publishes every LoadBalancer Service's
ports as hostPorts on every node. The program's config turns them off unless
the stack asks for ingress, and then keeps ServiceLB to the server.
"""

from __future__ import annotations

import yaml

from node_operations.firewall_plan import inbound_rules
from node_operations.k3s_install import K3sBinary, ServerSpec, server_config


def _config(**overrides: object) -> dict:
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
    return yaml.safe_load(server_config(ServerSpec(**values), "eth1"))


def test_without_ingress_servicelb_and_traefik_are_disabled() -> None:
    config = _config()
    assert config["disable"] == ["servicelb", "traefik"]
    assert "node-label" not in config


def test_with_ingress_servicelb_runs_on_the_server_only() -> None:
    config = _config(ingress=True)
    assert "disable" not in config
    # Once a node carries this label, ServiceLB runs its pods on labelled nodes only.
    assert config["node-label"] == ["svccontroller.k3s.cattle.io/enablelb=true"]


def test_ingress_opens_80_and_443_on_the_server_alone() -> None:
    peers = {"srv": "10.0.1.2", "w1": "10.0.1.3"}

    def ports(role: str, node: str, ingress: bool) -> set[str]:
        rules = inbound_rules(
            role=role,  # type: ignore[arg-type]
            node=node,
            peers=peers,
            server="srv",
            pod_network="wireguard",
            ingress=ingress,
        )
        return {f"{rule.port}/{rule.protocol}" for rule in rules if "0.0.0.0/0" in rule.sources}

    assert ports("server", "srv", True) == {"22/tcp", "80/tcp", "443/tcp"}
    assert ports("server", "srv", False) == {"22/tcp"}
    assert ports("worker", "w1", True) == {"22/tcp"}
