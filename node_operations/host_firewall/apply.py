"""Applying a node's plan to the firewall it has, reading it back, taking it away.

The backend is picked per node from what is on it (`FirewallInspection.backend`).
A node whose firewall changed kind loses the program's rules in the old one.
After every change the firewall is read back and compared with the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from node_operations.firewall_plan import PortRule
from node_operations.host_firewall.backends import BACKENDS, managed_backends
from node_operations.host_firewall.dnat_guard import dnat_guard_present, dnat_guard_rule_count, remove_dnat_guard
from node_operations.host_firewall.drift import ObservedFirewall, align_rules, describe_rules, drift
from node_operations.host_firewall.inspection import FirewallBackend, inspect_firewall
from node_operations.host_firewall.plan import (
    SESSION_SSH_PURPOSE,
    FirewallError,
    NodeFirewallPlan,
    with_session_rule,
)
from remote_access.ssh import SshTarget, open_session

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AppliedFirewall:
    """The outcome of applying one node's plan."""

    node: str
    backend: FirewallBackend
    rule_count: int
    changed: bool
    rules: tuple[PortRule, ...]
    host_key: str


@dataclass(frozen=True)
class RemovedFirewall:
    """What was taken off a node."""

    node: str
    backends: tuple[FirewallBackend, ...]


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


async def apply_node_firewall(
    target: SshTarget,
    plan: NodeFirewallPlan,
    *,
    progress: Progress | None = None,
) -> AppliedFirewall:
    """Make the node's firewall enforce `plan`, in one atomic change where the
    backend has one; adopt what the program left there before; read it back.

    Raises FirewallError (or an SshError) naming the node on any failure.
    """
    plan.check()
    async with open_session(target, shared=True) as session:
        inspection = await inspect_firewall(session)
        name = inspection.backend()
        backend = BACKENDS[name]
        effective = plan.with_session_port(inspection.ssh_port)
        _say(progress, f"host firewall: {name}, {len(plan.rules)} rules")
        changed = await backend.apply(session, effective, inspection)
        # A node whose firewall changed kind: take the program's old rules away.
        for stale in managed_backends(inspection):
            if stale != name:
                _say(progress, f"removing the program's earlier {stale} rules")
                await BACKENDS[stale].remove(session, inspection)
                changed = True
        # Unchanged means the first reading already matched the plan.
        after = await inspect_firewall(session) if changed else inspection
        observed = backend.observe(after)
        missing, extra = drift(observed.rules, effective.rules)
        others = backend.structural_drift(after, effective)
        if missing or extra or others:
            raise FirewallError(
                target.node,
                f"after applying, the {name} firewall differs from the plan "
                f"(missing: {describe_rules(missing) or 'none'}; unexpected: {describe_rules(extra) or 'none'}"
                f"{''.join('; ' + note for note in others)}); "
                "something else on the host changes the firewall: find it, then run `pulumi up` again",
            )
        problem = backend.coverage_problem(after)
        if problem is not None:
            raise FirewallError(target.node, problem)
        _say(progress, f"host firewall {'updated' if changed else 'unchanged'}: {observed.rule_count} rules")
        foreign = backend.foreign_allows(after)
        if foreign:
            _say(
                progress,
                f"host firewall: {len(foreign)} {name} rule(s) not of the program's also let traffic in, beside "
                f"its plan (it never deletes them; review them): {'; '.join(foreign)}",
            )
        return AppliedFirewall(
            node=target.node,
            backend=name,
            rule_count=observed.rule_count,
            changed=changed,
            rules=_reported_rules(observed, plan.rules, inspection.ssh_port),
            host_key=session.host_key,
        )


async def read_node_firewall(target: SshTarget, plan: NodeFirewallPlan | None = None) -> ObservedFirewall:
    """The program's rules on the node as they are now, spelt like the plan's
    where they enforce the same (so only real drift shows), with `notes` on
    what else differs from the plan. `present` is false when nothing of the
    program's is on the node."""
    async with open_session(target) as session:
        inspection = await inspect_firewall(session)
    held = managed_backends(inspection)
    backend = BACKENDS[held[0] if held else inspection.backend()]
    observed = backend.observe(inspection)
    if plan is None:
        return observed
    notes = backend.structural_drift(inspection, plan.with_session_port(inspection.ssh_port)) if held else []
    return replace(observed, rules=_reported_rules(observed, plan.rules, inspection.ssh_port), notes=tuple(notes))


def _reported_rules(
    observed: ObservedFirewall, wanted: Sequence[PortRule], ssh_port: int | None
) -> tuple[PortRule, ...]:
    # The session's SSH rule is the program's own addition, not drift: leave it out.
    aligned = align_rules(observed.rules, with_session_rule(wanted, ssh_port))
    return tuple(rule for rule in aligned if rule.purpose != SESSION_SSH_PURPOSE)


async def remove_node_firewall(target: SshTarget, *, progress: Progress | None = None) -> RemovedFirewall:
    """Take the program's table, rules or zones off the node, nothing else."""
    async with open_session(target) as session:
        inspection = await inspect_firewall(session)
        held = managed_backends(inspection)
        for name in held:
            _say(progress, f"removing the program's {name} rules")
            await BACKENDS[name].remove(session, inspection)
        if dnat_guard_present(inspection):
            _say(progress, "removing the program's DNAT guard")
            await remove_dnat_guard(session)
        after = await inspect_firewall(session)
        left: list[str] = [*managed_backends(after)]
        if dnat_guard_rule_count(after) is not None:
            left.append("DNAT guard")
        if left:
            raise FirewallError(
                target.node,
                f"the program's {', '.join(left)} rules are still there after removing them; "
                "see the host's journal, then run the command again",
            )
    return RemovedFirewall(target.node, tuple(held))
