"""Host firewalls: put a node's port plan (node_operations.firewall_plan) into
the firewall the node has, read it back, take it away, and check a firewall
the operator runs.

Backends, picked per node from what is on it (`FirewallInspection.backend`):
UFW when it is active, else firewalld when it runs, else UFW or firewalld when
installed (UFW first: on Ubuntu it ships inactive), else nftables. Where none
of the three is installed the program installs the `nftables` package: it
manages the node, and a table of its own is the least intrusive firewall.
Every backend also holds DNAT'd traffic (NodePorts, LoadBalancer addresses,
ServiceLB's hostPorts) to the plan with the DNAT guard.

Modules, lower before higher (each imports only modules above it):

- `plan`: the rules a node enforces, the checks that refuse an unsafe plan,
  the peer sets; `FirewallError`.
- `inspection`: what firewall_inspect.sh reads on a host, parsed; the backend
  chosen from it.
- `nft`: nft's text and JSON spellings.
- `drift`: the program's rules as found, compared with the plan.
- `remote`: where the backends' files go on a host, their steps' deadlines.
- `backend`: what every backend is (`Backend`: render, observe,
  structural_drift, apply, remove, coverage_problem, filtering, allows) and
  the probe an operator-run firewall is judged with.
- `dnat_guard`: the forward chain that holds DNAT'd traffic to the plan.
- `nftables`, `ufw`, `firewalld`: one backend each, one object (`NFTABLES`,
  `UFW`, `FIREWALLD`).
- `backends`: the backends by name.
- `apply`: apply, read back and remove on one node.
- `fleet`: many nodes in parallel.
- `operator_firewall`: judging a firewall the operator runs.
"""
