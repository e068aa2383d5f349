"""Whether a Hetzner server is proven to be a worker, before the fence powers it off.

The fence powers off whatever server the worker's hcloud_server names; a wrong one cuts a
bystander (or the control plane) while the worker, if only cut off, goes on writing. So the
server must be proven to be this worker by what the Hetzner API reports of it, and every part of
the proof must be unique to one machine:

- A public address (IPv4, or in the server's IPv6 /64) is unique on the internet: holding one of
  the worker's addresses proves the server.
- A private address is unique only within its Hetzner network (`private_net[].network`, the
  network's id; docs.hetzner.cloud, "Servers: Get a Server"). Every project's networks may use the
  same range (10.0.0.0/16 is the Console's default), so another server, in another network,
  may hold the worker's private address. A private address proves the server only in this
  cluster's network: the one the program created (hk3s:network), by its id. Where the program
  created none (existing hosts), no private address proves anything; the server must hold one of
  the worker's public addresses.
- A server the program created carries the labels it gave it (components.hetzner_project): the
  stack's owner (`hk3s-owner`) and the node it was made for (`hk3s-node`). A server without them
  is not the one this stack made for the worker (recreated or relabelled outside the program).
- It holds none of another node's addresses (the control plane's, another Node's): a typo that
  names another node's server is named as such.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from remote_access.hetzner_api import ServerState


def identity_refusal(
    node: str,
    state: ServerState,
    *,
    mine: Sequence[str],
    control_plane: Sequence[str],
    others: Sequence[tuple[str, str]],
    network: int | None,
    labels: Mapping[str, str],
) -> str | None:
    """Why the Hetzner server `state`, which `node`'s hcloud_server names, is not proven to be `node`
    (None when it is). `mine` are the worker's own addresses (its login, its kubelet's, its Node's),
    `control_plane` the control plane's, `others` each other Node's (name, address); `network` the
    id of this cluster's Hetzner network (None: the program created none); `labels` those the
    program gave the server it created for `node` (empty: it did not create it)."""
    named = f"Hetzner server {state.name} (id {state.id}; {', '.join(state.addresses()) or 'no address'})"
    fix = (
        f"set {node}'s hcloud_server in hk3s:workers to its own Hetzner server (its id or name) and run up "
        "again; nothing was powered off"
    )
    ours = {network} if network is not None else set()
    # Another node's address marks its server: in this cluster's network when it is known, else in
    # any (a refusal that errs is safe; a power-off that errs is not).
    scope = ours if network is not None else None
    if hit := next((a for a in control_plane if state.owns(a, scope)), None):
        return (
            f"{named}, which {node}'s hcloud_server names, is the control plane's server (it holds {hit}): "
            f"the control plane is never fenced; {fix}"
        )
    if hit_by := next(((name, a) for name, a in others if state.owns(a, scope)), None):
        return (
            f"{named}, which {node}'s hcloud_server names, is {hit_by[0]}'s server (it holds {hit_by[1]}), "
            f"not {node}'s; {fix}"
        )
    if wrong := {key: value for key, value in labels.items() if state.labels.get(key) != value}:
        carries = ", ".join(f"{key}={state.labels.get(key, '(none)')}" for key in sorted(wrong))
        expected = ", ".join(f"{key}={value}" for key, value in sorted(labels.items()))
        return (
            f"{named}, which {node}'s hcloud_server names, carries {carries}, not the labels the program gave the "
            f"server it created for {node} ({expected}): it is not that server (recreated or relabelled outside "
            f"the program). Check it in Hetzner's console; if it is {node}'s, put its labels back ({expected}) "
            "and run up again; nothing was powered off"
        )
    if any(state.owns(address, ours) for address in mine):
        return None
    if elsewhere := [p for p in state.private_net if p.ip in mine]:
        where = (
            f"this cluster's network is Hetzner network {network}"
            if network is not None
            else "the program created no Hetzner network for this cluster (its hosts are existing ones), so a "
            f"private address proves nothing: the server must hold one of {node}'s public addresses"
        )
        held = ", ".join(f"{p.ip} only in Hetzner network {p.network}" for p in elsewhere)
        return (
            f"{named}, which {node}'s hcloud_server names, holds {node}'s address {held}, and {where}. A private "
            f"address is unique only within its network (10.0.0.0/16 is every project's default), so the server is "
            f"not proven to be {node}; {fix}"
        )
    return (
        f"{named}, which {node}'s hcloud_server names, holds none of {node}'s addresses "
        f"({', '.join(sorted(set(mine)))}), so it is not proven to be this worker; {fix}"
    )
