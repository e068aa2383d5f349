"""NetworkPlan refuses a decision for public mode while pod traffic is vxlan.

`hk3s:network.mode: public` with vxlan is refused by the settings at preview; `auto` is
decided only here, from the hosts' addresses, so the same rule holds at the decision. The
provider is called as the engine calls it, with hosts whose facts need no SSH connection
(public addresses on their interfaces, no private network): nothing is mocked.
"""

from __future__ import annotations

from typing import Any

import pytest

from node_operations.network_mode import NetworkRefusedError
from providers.network_plan import NetworkPlanProvider


def _host(node: str, public: str) -> dict[str, Any]:
    return {
        "node": node,
        "ssh_address": public,
        "ssh_port": 22,
        "public_address": public,
        "ipv4_addresses": [f"eth0 {public}/24"],
        "ipv4_routes": ["default via 203.0.113.1 dev eth0", "203.0.113.0/24 dev eth0 scope link"],
    }


def _props(mode: str, pod_network: str | None, acknowledged: bool | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {
        "mode_setting": mode,
        "pod_cidr": "10.42.0.0/16",
        "service_cidr": "10.43.0.0/16",
        "ssh_user": "root",
        "private_key": "unused: no check connects",
        "server": _host("srv", "203.0.113.10"),
        "workers": [_host("w1", "203.0.113.11")],
    }
    if pod_network is not None:
        props["pod_network"] = pod_network
    if acknowledged is not None:
        props["vxlan_over_public_addresses"] = acknowledged
    return props


def test_auto_deciding_public_with_vxlan_is_refused_naming_the_settings_and_the_fix() -> None:
    with pytest.raises(NetworkRefusedError) as refused:
        NetworkPlanProvider().create(_props("auto", "vxlan"))
    message = str(refused.value)
    assert message.startswith("srv: network mode: ")
    assert "public" in message and "unencrypted" in message and "hk3s:cluster.pod_network" in message
    assert "pod_network: wireguard" in message and "hk3s:network.mode: private" in message
    assert "mode auto chose public" in message
    # Explicit public mode (which the settings refuse first) is named as such.
    with pytest.raises(NetworkRefusedError) as explicit:
        NetworkPlanProvider().create(_props("public", "vxlan", False))
    assert "hk3s:network.mode is public" in str(explicit.value)


@pytest.mark.parametrize(
    ("mode", "pod_network", "acknowledged"),
    [("auto", "wireguard", None), ("auto", "vxlan", True), ("public", "vxlan", True), ("auto", None, None)],
)
def test_public_is_decided_with_wireguard_or_an_acknowledged_vxlan(
    mode: str, pod_network: str | None, acknowledged: bool | None
) -> None:
    """A state written before the plan knew the pod network (no pod_network) decides as before."""
    outs = NetworkPlanProvider().create(_props(mode, pod_network, acknowledged)).outs
    assert outs is not None and outs["mode"] == "public"


def test_a_new_pod_network_makes_the_plan_decide_again_but_an_older_state_without_one_does_not() -> None:
    provider = NetworkPlanProvider()
    wireguard, vxlan = _props("auto", "wireguard"), _props("auto", "vxlan")
    assert provider.diff("network-plan", wireguard, vxlan).changes
    assert not provider.diff("network-plan", _props("auto", None), wireguard).changes
