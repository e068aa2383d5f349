"""The five ComponentResources of the program."""

from components.cluster_server import ClusterServer, ClusterServerArgs
from components.firewall_rules import FirewallRules, FirewallRulesArgs
from components.node_endpoint import NodeEndpoint, SshCredentials
from components.private_network import PrivateNetwork, PrivateNetworkArgs
from components.storage_copies import StorageCopies, StorageCopiesArgs
from components.worker_node import WorkerNode, WorkerNodeArgs

__all__ = [
    "ClusterServer",
    "ClusterServerArgs",
    "FirewallRules",
    "FirewallRulesArgs",
    "NodeEndpoint",
    "PrivateNetwork",
    "PrivateNetworkArgs",
    "SshCredentials",
    "StorageCopies",
    "StorageCopiesArgs",
    "WorkerNode",
    "WorkerNodeArgs",
]
