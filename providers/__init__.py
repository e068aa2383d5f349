"""Python dynamic providers: thin adapters from the Pulumi engine to node_operations.

The engine starts one provider process per `pulumi up/preview/destroy` and provider shard; dill
pickles each provider class by reference (`providers.<module>.<Class>`), so unpickling one
imports this package first. Importing every provider module here would make each of those
processes pay for all of them (asyncssh, hcloud, the node operations) to answer a Check or Diff
of one; the names below are therefore resolved on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.connectivity_check import ConnectivityCheck
    from providers.disk_probe import DiskProbe
    from providers.host_firewall import HostFirewall
    from providers.host_probe import HostProbe
    from providers.k3s_server import K3sServer
    from providers.k3s_upgrade import K3sUpgrade
    from providers.login_key import NodeLoginKey, RetiredLoginKeys
    from providers.network_plan import NetworkPlan
    from providers.network_ranges import NetworkRanges
    from providers.node_fence import NodeFence
    from providers.node_join import NodeJoin

    ALL_PROVIDERS: tuple[type, ...]

# Where each exported resource lives (each provider class: _ALL_PROVIDER_HOMES below).
_HOMES = {
    "ConnectivityCheck": "connectivity_check",
    "DiskProbe": "disk_probe",
    "HostFirewall": "host_firewall",
    "HostProbe": "host_probe",
    "K3sServer": "k3s_server",
    "K3sUpgrade": "k3s_upgrade",
    "NodeLoginKey": "login_key",
    "RetiredLoginKeys": "login_key",
    "NetworkPlan": "network_plan",
    "NetworkRanges": "network_ranges",
    "NodeFence": "node_fence",
    "NodeJoin": "node_join",
}

# Every provider class, by name, and the module it lives in; the pickling test walks
# `ALL_PROVIDERS`, built from this, and checks that no provider class of the package is missing.
_ALL_PROVIDER_HOMES = {
    "BootstrapFirewallReleaseProvider": "bootstrap_firewall",
    "ConnectivityCheckProvider": "connectivity_check",
    "CopiesOfferProvider": "copies_offer",
    "DiskProbeProvider": "disk_probe",
    "HostFirewallProvider": "host_firewall",
    "HostKeyPairProvider": "host_key_pair",
    "HostProbeProvider": "host_probe",
    "K3sServerProvider": "k3s_server",
    "K3sUpgradeProvider": "k3s_upgrade",
    "LonghornNodeRoleProvider": "longhorn_node_role",
    "NetworkPlanProvider": "network_plan",
    "NetworkRangesProvider": "network_ranges",
    "NodeAccessCheckProvider": "node_access_check",
    "NodeFenceProvider": "node_fence",
    "NodeJoinProvider": "node_join",
    "NodeLoginKeyProvider": "login_key",
    "ProjectSshKeyProvider": "project_ssh_key",
    "RetiredLoginKeysProvider": "login_key",
    "StackIdentityProvider": "stack_identity",
    "TeardownGuardProvider": "teardown_guard",
    "WorkerRosterProvider": "worker_roster",
}


def __getattr__(name: str) -> Any:
    if name == "ALL_PROVIDERS":
        value: Any = tuple(__getattr__(provider) for provider in _ALL_PROVIDER_HOMES)
    elif name in _HOMES or name in _ALL_PROVIDER_HOMES:
        home = _HOMES.get(name) or _ALL_PROVIDER_HOMES[name]
        value = getattr(importlib.import_module(f"providers.{home}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES, *_ALL_PROVIDER_HOMES, "ALL_PROVIDERS"])


__all__ = [
    "ALL_PROVIDERS",
    "ConnectivityCheck",
    "DiskProbe",
    "HostFirewall",
    "HostProbe",
    "K3sServer",
    "K3sUpgrade",
    "NetworkPlan",
    "NetworkRanges",
    "NodeFence",
    "NodeJoin",
    "NodeLoginKey",
    "RetiredLoginKeys",
]
