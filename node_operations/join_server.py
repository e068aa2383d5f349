"""The join's calls to the server, several to a command where nothing is decided between them.

At 50 ms between the program and the server every `k3s kubectl` costs a round trip, so the
join's calls that follow each other with nothing to decide in between go as one batch
(ClusterApi.run_steps):

- the preflight's reads: the nodes, the bootstrap tokens (an interrupted earlier join's for
  this node go before a new one is made), the server's UFW when the operator runs it there;
- the grant: the cordon (a rejoin), k3s's record of the node's password (when preflight found
  it must go), the join-permit policy, the stale tokens deleted, the permits, the new token;
- the release: the validation taint removed, the labels and taints set, the uncordon (a
  rejoin), the Node read back.

A batch is a shortcut only. When one of its calls fails (the API away, an apply conflict, a
taint already gone), the join goes the call-by-call way it always went: each call riding
through an outage as its kind allows (remote_access.kube), each failure raised in its own
words. The calls a batch made before it stopped are idempotent or looked at again on that
way (the taint removal reads the Node first; the token creation deletes this node's tokens
it has not seen), so the outcome is the same either way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from node_operations.join_permits import JOIN_PERMIT_POLICY, grant_join_permits, permits_patch_args
from node_operations.node_access import UFW_STATUS_ARGV, ufw_status_active
from node_operations.node_metadata import NodeMetadata, put_metadata_in_step, wanted_labels
from remote_access.host_steps import HostStep
from remote_access.kube import (
    APPLY_ARGS,
    KUBECTL_DEADLINE_SECONDS,
    NODES_ARGS,
    TOKENS_ARGS,
    ClusterApi,
    JoinToken,
    NodeStatus,
    Repeat,
    Taint,
    cordon_args,
    kubectl_step,
    label_args,
    node_password_delete_args,
    parse_join_token,
    parse_nodes,
    parse_token_ids,
    taint_add_args,
    taint_remove_args,
    token_create_argv,
    token_delete_args,
)
from remote_access.ssh import RemoteCommandError


@dataclass(frozen=True)
class ClusterReading:
    """What the preflight reads on the server."""

    nodes: list[NodeStatus]
    token_ids: dict[str, str]  # bootstrap token id -> its description (the node it was made for)
    server_ufw_active: bool  # False when not asked


async def read_cluster(cluster: ClusterApi, *, server_ufw: bool) -> ClusterReading:
    """The nodes, the bootstrap tokens and (with `server_ufw`) whether UFW is active on the
    server, in one command; repeated while the API is away, as each read would be."""
    steps = [kubectl_step(NODES_ARGS), kubectl_step(TOKENS_ARGS)]
    if server_ufw:
        steps.append(HostStep.command(UFW_STATUS_ARGV, check=False))
    results = await cluster.run_steps(steps, Repeat.READ)
    return ClusterReading(
        nodes=parse_nodes(results[0].stdout),
        token_ids=parse_token_ids(results[1].stdout),
        server_ufw_active=server_ufw and ufw_status_active(results[2].stdout),
    )


@dataclass(frozen=True)
class JoinGrant:
    """What the server must hold before the agent starts."""

    node: str
    server_node: str  # its own kubelet holds a permit too (see node_operations.join_permits)
    cordon: bool  # a rejoin: the checks run cordoned, running pods stay
    forget_node_password: bool  # k3s's record of the node's password goes (see Joiner)
    stale_tokens: tuple[str, ...]  # ids of tokens an interrupted earlier join made for the node
    token_ttl: str | None  # a new join token valid this long; None: none (a rejoin)


async def grant_join(cluster: ClusterApi, grant: JoinGrant) -> JoinToken | None:
    """Everything the grant holds (see the module docstring); the new token, if one was asked."""
    steps = _grant_steps(grant)
    try:
        results = await cluster.run_steps(steps, Repeat.ONCE, deadline=len(steps) * KUBECTL_DEADLINE_SECONDS)
    except RemoteCommandError:
        return await _grant_call_by_call(cluster, grant)
    if grant.token_ttl is None:
        return None
    return parse_join_token(cluster.node, grant.node, results[-1].stdout)


def _grant_steps(grant: JoinGrant) -> list[HostStep]:
    steps: list[HostStep] = []
    if grant.cordon:
        steps.append(kubectl_step(cordon_args(grant.node, True)))
    if grant.forget_node_password:
        steps.append(kubectl_step(node_password_delete_args(grant.node)))
    steps.append(kubectl_step(APPLY_ARGS, stdin=JOIN_PERMIT_POLICY))
    steps.extend(kubectl_step(token_delete_args(token_id)) for token_id in grant.stale_tokens)
    steps.append(kubectl_step(permits_patch_args((grant.node, grant.server_node))))
    if grant.token_ttl is not None:
        create = token_create_argv(grant.node, grant.token_ttl)
        steps.append(HostStep.command(create, what=f"k3s token create for {grant.node}"))
    return steps


async def _grant_call_by_call(cluster: ClusterApi, grant: JoinGrant) -> JoinToken | None:
    if grant.cordon:
        await cluster.cordon(grant.node, True)
    if grant.forget_node_password:
        await cluster.delete_node_password(grant.node)
    await cluster.apply(JOIN_PERMIT_POLICY)
    # Read again: a batch that stopped at the token's creation may have made one.
    for token_id, description in (await cluster.token_ids()).items():
        if description == grant.node:
            await cluster.delete_token(token_id)
    await grant_join_permits(cluster, (grant.node, grant.server_node))
    if grant.token_ttl is None:
        return None
    return await cluster.create_join_token(grant.node, grant.token_ttl)


async def release_node(
    cluster: ClusterApi, metadata: NodeMetadata, validation_taint: Taint, *, rejoin: bool
) -> NodeStatus:
    """The validation taint removed, the labels and taints as the config says (k3s applies
    --node-label and --node-taint only at registration; a rejoin, or a join that registered
    under an older config, is put in step here), the uncordon of a rejoin; the Node after."""
    # Taints the config dropped are removed only where the Node still has them: the call-by-call
    # way reads the Node for each, which a batch cannot.
    if not metadata.removed_taints:
        steps = [kubectl_step(taint_remove_args(metadata.node, validation_taint.key))]
        labels = label_args(metadata.node, wanted_labels(metadata))
        if labels is not None:
            steps.append(kubectl_step(labels))
        steps.extend(kubectl_step(taint_add_args(metadata.node, Taint.parse(text))) for text in metadata.taints)
        if rejoin:
            steps.append(kubectl_step(cordon_args(metadata.node, False)))
        steps.append(kubectl_step(["get", "node", metadata.node, "-o", "json", "--ignore-not-found"]))
        try:
            results = await cluster.run_steps(steps, Repeat.ONCE, deadline=len(steps) * KUBECTL_DEADLINE_SECONDS)
        except RemoteCommandError:
            pass
        else:
            nodes = [NodeStatus.from_object(found) for found in _objects(results[-1].stdout)]
            assert nodes, f"{metadata.node} is gone"
            return nodes[0]
    await cluster.remove_taint(metadata.node, validation_taint.key)
    await put_metadata_in_step(cluster, metadata)
    if rejoin:
        await cluster.cordon(metadata.node, False)
    node = await cluster.get_node(metadata.node)
    assert node is not None
    return node


def _objects(out: str) -> list[dict[str, Any]]:
    return [json.loads(out)] if out.strip() else []
