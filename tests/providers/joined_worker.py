"""The stored state of a worker NodeJoin has joined, as the provider tests start from it."""

from __future__ import annotations

from typing import Any

JOINED_WORKER: dict[str, Any] = {
    "node": "w1",
    "address": "198.51.100.7",
    "server_node": "srv",
    "server_address": "198.51.100.2",
    "private_key": "key",
    "k3s_version": "v1.36.1+k3s1",
    "registry": None,
    "server_url": "https://198.51.100.2:6443",
    "ca_hash": "ab" * 32,
    "network_mode": "public",
    "node_ip": "198.51.100.7",
    "node_external_ip": "198.51.100.7",
    "validation_taint": "hk3s.dev/validating=true:NoSchedule",
    "pod_network": "vxlan",
    "labels": {"tier": "web"},
    "state": "ready",
    "machine_id": "a" * 32,
}
