"""Many nodes at once: every node's plan applied in parallel, one atomic change
per node; a failure on one node does not stop the others and is reported with
its node. (A stack's HostFirewall resources run one node each; this runner is
what the lab tests and the peer-change benchmark drive a whole cluster with.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from node_operations.host_firewall.apply import AppliedFirewall, Progress, apply_node_firewall
from node_operations.host_firewall.plan import FirewallError, NodeFirewallPlan
from remote_access.ssh import SshTarget


@dataclass(frozen=True)
class NodeFirewallJob:
    """One node to apply: how to reach it and its plan."""

    target: SshTarget
    plan: NodeFirewallPlan


@dataclass(frozen=True)
class FleetFirewallResult:
    """Per-node outcomes of a parallel apply: every node is tried."""

    applied: dict[str, AppliedFirewall] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def raise_for_failures(self) -> None:
        """One error naming every node that failed, with its reason."""
        if self.failed:
            details = " | ".join(f"{node}: {reason}" for node, reason in sorted(self.failed.items()))
            raise FirewallError(
                ",".join(sorted(self.failed)),
                f"{len(self.failed)} host firewall(s) not applied: {details}; fix them and run again "
                "(the others are in place)",
            )


async def apply_firewalls(
    jobs: Sequence[NodeFirewallJob],
    *,
    progress: Callable[[str, str], None] | None = None,
) -> FleetFirewallResult:
    """Apply every node's plan in parallel, one atomic change per node; a
    failure on one node does not stop the others and is reported with its node."""

    def node_progress(node: str) -> Progress | None:
        if progress is None:
            return None
        return lambda message: progress(node, message)

    outcomes = await asyncio.gather(
        *(apply_node_firewall(job.target, job.plan, progress=node_progress(job.target.node)) for job in jobs),
        return_exceptions=True,
    )
    result = FleetFirewallResult()
    for job, outcome in zip(jobs, outcomes, strict=True):
        if isinstance(outcome, AppliedFirewall):
            result.applied[job.target.node] = outcome
        elif isinstance(outcome, Exception):
            result.failed[job.target.node] = str(outcome)
        else:
            raise outcome
    return result
