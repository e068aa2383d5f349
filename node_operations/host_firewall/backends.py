"""Every backend the program runs, by name. A new backend is a module with one
`Backend` object, added here (and to `FirewallBackend`, and to the choice in
`FirewallInspection.backend` and the operator check's order where it belongs)."""

from __future__ import annotations

from node_operations.host_firewall.backend import Backend
from node_operations.host_firewall.firewalld import FIREWALLD
from node_operations.host_firewall.inspection import FirewallBackend, FirewallInspection
from node_operations.host_firewall.nftables import NFTABLES
from node_operations.host_firewall.ufw import UFW

# In the order the program's leftovers are found and removed.
BACKENDS: dict[FirewallBackend, Backend] = {backend.name: backend for backend in (NFTABLES, UFW, FIREWALLD)}


def managed_backends(inspection: FirewallInspection) -> list[FirewallBackend]:
    """Backends that hold something of the program's on this node."""
    return [name for name, backend in BACKENDS.items() if backend.observe(inspection).present]
