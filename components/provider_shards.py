"""Spread the dynamic resources of different nodes over several provider processes.

All Python dynamic resources behind one provider share one process whose gRPC
server runs 4 operations at once, whatever `--parallel` says; joining 12
workers through it would take three rounds. Each explicit `pulumi-python`
provider resource is a process of its own, so nodes hashed over SHARD_COUNT
of them join side by side.
"""

from __future__ import annotations

import zlib

import pulumi

# Fixed on purpose: a node whose shard changed would see its resources move to
# another provider, which Pulumi treats as a replacement.
SHARD_COUNT = 8


def shard_of(node: str) -> int:
    """The shard a node's operations run in: stable for the node's name."""
    return zlib.crc32(node.encode()) % SHARD_COUNT


class OperationShards:
    """The provider processes of one deployment, created as nodes need them."""

    def __init__(self) -> None:
        self._providers: dict[int, pulumi.ProviderResource] = {}

    def for_node(self, node: str) -> pulumi.ProviderResource:
        index = shard_of(node)
        if index not in self._providers:
            self._providers[index] = pulumi.ProviderResource("pulumi-python", f"node-operations-{index}", {})
        return self._providers[index]
