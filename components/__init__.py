"""The five ComponentResources of the program.

Each is imported from its own module when first named here (PEP 562): a process that needs one
small part of the package (the operator API's Hetzner names) does not import every component and,
with them, the Hetzner and Kubernetes SDKs (a third of a second of each `scripts/hk3s` start)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.cluster_server import ClusterServer, ClusterServerArgs
    from components.firewall_rules import FirewallRules, FirewallRulesArgs
    from components.node_endpoint import NodeEndpoint, SshCredentials
    from components.private_network import PrivateNetwork, PrivateNetworkArgs
    from components.storage_copies import StorageCopies, StorageCopiesArgs
    from components.worker_node import WorkerNode, WorkerNodeArgs

_MODULES = {
    "ClusterServer": "cluster_server",
    "ClusterServerArgs": "cluster_server",
    "FirewallRules": "firewall_rules",
    "FirewallRulesArgs": "firewall_rules",
    "NodeEndpoint": "node_endpoint",
    "SshCredentials": "node_endpoint",
    "PrivateNetwork": "private_network",
    "PrivateNetworkArgs": "private_network",
    "StorageCopies": "storage_copies",
    "StorageCopiesArgs": "storage_copies",
    "WorkerNode": "worker_node",
    "WorkerNodeArgs": "worker_node",
}

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


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'components' has no attribute {name!r}")
    return getattr(importlib.import_module(f"components.{_MODULES[name]}"), name)
