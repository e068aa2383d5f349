"""Python dynamic providers: thin adapters from the Pulumi engine to node_operations."""

from providers.connectivity_check import ConnectivityCheck, ConnectivityCheckProvider
from providers.disk_probe import DiskProbe, DiskProbeProvider
from providers.host_firewall import HostFirewall, HostFirewallProvider
from providers.host_probe import HostProbe, HostProbeProvider
from providers.k3s_server import K3sServer, K3sServerProvider
from providers.k3s_upgrade import K3sUpgrade, K3sUpgradeProvider
from providers.login_key import NodeLoginKey, NodeLoginKeyProvider, RetiredLoginKeys, RetiredLoginKeysProvider
from providers.network_plan import NetworkPlan, NetworkPlanProvider
from providers.network_ranges import NetworkRanges, NetworkRangesProvider
from providers.node_fence import NodeFence, NodeFenceProvider
from providers.node_join import NodeJoin, NodeJoinProvider

# Every provider class; the pickling test walks this list.
ALL_PROVIDERS = (
    ConnectivityCheckProvider,
    DiskProbeProvider,
    HostFirewallProvider,
    HostProbeProvider,
    K3sServerProvider,
    K3sUpgradeProvider,
    NetworkPlanProvider,
    NetworkRangesProvider,
    NodeFenceProvider,
    NodeJoinProvider,
    NodeLoginKeyProvider,
    RetiredLoginKeysProvider,
)

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
