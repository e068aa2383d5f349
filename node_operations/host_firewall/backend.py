"""What a host firewall backend is: one object per firewall (nftables, UFW,
firewalld) with the same verbs, so the code that applies, reads back, removes
and judges firewalls never asks which one it holds. A new backend is a module
with one such object, listed in `node_operations.host_firewall.backends`.
Also the probe an operator-run firewall is judged with.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from node_operations.host_firewall.drift import ObservedFirewall
from node_operations.host_firewall.inspection import FirewallBackend, FirewallInspection
from node_operations.host_firewall.plan import IPNetwork, NodeFirewallPlan, port_range
from remote_access.ssh import SshSession


@dataclass(frozen=True)
class Probe:
    """A new connection the cluster needs: from a source network to a port."""

    source: IPNetwork
    protocol: str
    first: int
    last: int


class UndeterminedError(Exception):
    """The checker cannot tell how the firewall treats a probe."""


class Backend(ABC):
    """One host firewall the program can run on a node, or judge when the operator runs it."""

    name: FirewallBackend

    @abstractmethod
    def render(self, plan: NodeFirewallPlan) -> object:
        """The plan in this firewall's own terms (a ruleset, rules, config files)."""

    @abstractmethod
    def observe(self, inspection: FirewallInspection) -> ObservedFirewall:
        """The program's rules in this firewall on the inspected node."""

    @abstractmethod
    def structural_drift(self, inspection: FirewallInspection, plan: NodeFirewallPlan) -> list[str]:
        """What differs from the plan besides the port rules, one line each."""

    @abstractmethod
    async def apply(self, session: SshSession, plan: NodeFirewallPlan, inspection: FirewallInspection) -> bool:
        """Make the firewall enforce `plan` (the DNAT guard included); False when it did already."""

    @abstractmethod
    async def remove(self, session: SshSession, inspection: FirewallInspection) -> None:
        """Take the program's rules out of this firewall, nothing else."""

    def foreign_allows(self, inspection: FirewallInspection) -> list[str]:
        """Rules in this firewall that are not the program's and let inbound traffic in: the
        program never deletes them, and they open ports beside its plan, so they are named."""
        return []

    def coverage_problem(self, inspection: FirewallInspection) -> str | None:
        """Why the program's rules, in force, would still not filter some of the
        node's traffic, with the way out; None when they do."""
        return None

    @abstractmethod
    def filtering(self, inspection: FirewallInspection) -> bool:
        """This firewall filters the node's inbound traffic now (for a firewall the operator runs)."""

    @abstractmethod
    def allows(self, inspection: FirewallInspection, probe: Probe) -> bool:
        """Whether this firewall, as inspected, lets the probe's connection in;
        raises UndeterminedError when its rules do not tell."""


def ranges_cover(ranges: Iterable[tuple[int, int]], first: int, last: int) -> bool | None:
    """Whether port ranges cover first..last fully (True), not at all (False), or in part (None)."""
    covered = sum(max(0, min(high, last) - max(low, first) + 1) for low, high in ranges)
    if covered >= last - first + 1:
        return True
    return False if covered == 0 else None


def ports_cover(spec: str, first: int, last: int) -> bool | None:
    """Whether a UFW/firewalld port spec ("any", "22", "80,443", "1000:2000")
    covers first..last fully (True), not at all (False), or in part (None)."""
    if spec == "any":
        return True
    return ranges_cover((port_range(part) for part in spec.split(",")), first, last)
