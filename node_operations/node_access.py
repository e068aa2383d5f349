"""Can the program still log in to every node it recorded? Checked once per run.

Adding a worker changes every recorded node's firewall (its peer rules), so a
run that joins workers must be able to log in to each of them, and must not
stack rules onto a UFW the operator runs there. This check is done once for
the whole run, before the joins, and not by each join: K joins each logging in
to N nodes would put K×N handshakes on the hosts at once, more than an
OpenSSH host accepts by default. Nodes that join in the same run are not
checked here: they are not recorded until they have joined.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from remote_access.kube import ClusterApi
from remote_access.ssh import SshError, SshSession, SshTarget, open_session

NODE_CONNECT_SECONDS = 10.0


@dataclass(frozen=True)
class RecordedNode:
    """A node to check: how to log in, and whether the program runs its firewall."""

    target: SshTarget
    firewall_managed: bool = True


class NodeAccessError(RuntimeError):
    """A recorded node cannot be reached, or its firewall cannot take the new rules."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(message)


# Prints UFW's status line when UFW is installed; read-only.
UFW_STATUS_ARGV = ("sh", "-c", "command -v ufw >/dev/null 2>&1 && ufw status 2>/dev/null | head -n 1")


def ufw_status_active(stdout: str) -> bool:
    """Whether UFW_STATUS_ARGV's output says UFW is enabled."""
    return stdout.strip() == "Status: active"


async def ufw_active(session: SshSession) -> bool:
    """True when UFW is installed and enabled on the host."""
    result = await session.run(UFW_STATUS_ARGV, deadline=30, check=False)
    return ufw_status_active(result.stdout)


async def check_recorded_nodes(
    nodes: Sequence[RecordedNode],
    *,
    joining: str,
    extra_ufw_sessions: Sequence[SshSession] = (),
    ufw_active_on: Sequence[str] = (),
) -> list[str]:
    """Log in to every node in parallel and name every failure, not only the first.

    `joining` says what the run adds (for the messages). `extra_ufw_sessions` are
    open sessions (the server's) whose UFW is checked too; the program does not
    manage their firewall; `ufw_active_on` names nodes already found (by the caller's own
    read) with an active UFW the program does not manage. Returns the names checked.
    """
    ufw_nodes: list[str] = list(ufw_active_on)

    async def check_ufw(session: SshSession, managed: bool) -> None:
        if not managed and await ufw_active(session):
            ufw_nodes.append(session.target.node)

    async def reach(node: RecordedNode) -> str | None:
        target = dataclasses.replace(node.target, connect_timeout=NODE_CONNECT_SECONDS)
        try:
            async with open_session(target, shared=True) as session:
                await session.run(["true"], deadline=NODE_CONNECT_SECONDS)
                await check_ufw(session, node.firewall_managed)
            return None
        except SshError as error:
            return str(error)

    failures = [failure for failure in await asyncio.gather(*(reach(node) for node in nodes)) if failure]
    if failures:
        raise NodeAccessError(
            "ssh-peers",
            "the program cannot log in to every recorded node, and a join changes their firewalls: "
            + "; ".join(failures)
            + ". Bring them back, or remove or fence them in the stack, then run pulumi up",
        )
    for session in extra_ufw_sessions:
        await check_ufw(session, managed=False)
    if ufw_nodes:
        raise NodeAccessError(
            "firewall",
            f"UFW is active on {', '.join(sorted(ufw_nodes))}, and the program does not manage it there "
            f"(hk3s:firewall.managed or the worker's firewall setting), so {joining}'s peer rules cannot "
            "be added, even if the ports are open today. Let the program manage that firewall (set it to true), "
            "or disable UFW there and run the rules yourself with another firewall",
        )
    return [node.target.node for node in nodes]


async def check_cluster_nodes(
    server: SshTarget,
    nodes: Sequence[RecordedNode],
    *,
    server_firewall_managed: bool,
    progress: Callable[[str], None],
) -> list[str]:
    """The run's one check before its joins: of the stack's `nodes`, those registered in
    the cluster (joined in an earlier run) must answer over SSH; the server's UFW, when
    the operator runs it, must not be active. Returns the names checked.

    A node whose firewall the program runs is not logged in to again here: the run that
    calls this changes the stack's nodes, so it updated that node's firewall (its peer
    sets), which logged in to the node (and, failing, stopped the run naming it). That
    update comes before this check (NodeAccessCheck waits for k3s on the server, which
    waits for every firewall change) and before every join (each waits for every firewall
    change). Logging in again would only add a connection to every recorded node."""
    async with open_session(server, shared=True) as session:
        registered = {node.name for node in await ClusterApi(session).nodes()}
        recorded = [node for node in nodes if node.target.node in registered]
        unmanaged = [node for node in recorded if not node.firewall_managed]
        reached = len(recorded) - len(unmanaged)
        by_firewall = f" ({reached} reached by their firewall's update in this run)" if reached else ""
        progress(f"checking SSH access to {len(unmanaged)} recorded node(s) once for this run{by_firewall}")
        await check_recorded_nodes(
            unmanaged,
            joining="the joining workers",
            extra_ufw_sessions=() if server_firewall_managed else (session,),
        )
        return [node.target.node for node in recorded]
