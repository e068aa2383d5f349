"""The program's rules as found on a node, and how they differ from the plan.
Purposes are labels, not enforcement: rules compare by what they let in."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from node_operations.firewall_plan import ANY_IPV4, PortRule
from node_operations.host_firewall.inspection import FirewallBackend
from node_operations.host_firewall.plan import every_source, normalized_rule, source_networks


@dataclass(frozen=True)
class ObservedFirewall:
    """The program's rules as found on a node."""

    node: str
    backend: FirewallBackend
    present: bool
    rules: tuple[PortRule, ...]
    rule_count: int
    # Differences that are not port rules (a hand-made rule in the table, UFW
    # switched off, ...); filled in by `read_node_firewall`.
    notes: tuple[str, ...] = ()


def merge_rules(rules: Iterable[PortRule]) -> tuple[PortRule, ...]:
    """One rule per (port, protocol, purpose), sources joined, in first-seen order."""
    merged: dict[tuple[str, str, str], list[str]] = {}
    for rule in rules:
        merged.setdefault((rule.port, rule.protocol, rule.purpose), []).extend(rule.sources)
    result = []
    for (port, protocol, purpose), sources in merged.items():
        networks = source_networks(sources)
        spelt = (ANY_IPV4,) if every_source(networks) else tuple(str(network) for network in networks)
        result.append(PortRule(port, protocol, spelt, purpose))  # type: ignore[arg-type]
    return tuple(result)


def align_rules(observed: Sequence[PortRule], wanted: Sequence[PortRule]) -> list[PortRule]:
    """Observed rules, each spelt as the wanted rule enforcing the same thing
    (purposes are labels, not enforcement), in the wanted order; rules the plan
    does not have follow. Equal to `wanted` exactly when nothing drifted."""
    remaining = list(observed)
    aligned: list[PortRule] = []
    for rule in wanted:
        key = normalized_rule(rule)
        for index, candidate in enumerate(remaining):
            if normalized_rule(candidate) == key:
                aligned.append(rule)
                del remaining[index]
                break
    for rule in remaining:
        port, protocol, sources = normalized_rule(rule)
        aligned.append(PortRule(port, protocol, sources, rule.purpose or "found on the host"))  # type: ignore[arg-type]
    return aligned


def drift(observed: Sequence[PortRule], wanted: Sequence[PortRule]) -> tuple[list[PortRule], list[PortRule]]:
    """(missing, extra): wanted rules not enforced, enforced rules not wanted."""
    have = [normalized_rule(rule) for rule in observed]
    want = [normalized_rule(rule) for rule in wanted]
    missing = [rule for rule, key in zip(wanted, want, strict=True) if key not in have]
    extra = [rule for rule, key in zip(observed, have, strict=True) if key not in want]
    return missing, extra


def describe_rules(rules: Iterable[PortRule]) -> str:
    return "; ".join(f"{rule.port}/{rule.protocol} from {', '.join(rule.sources)}" for rule in rules)


def rule_count_drift(observed: ObservedFirewall, expected: int | None) -> list[str]:
    """A note when the backend holds another number of the program's rules
    than the plan puts there (a hand-made rule in the program's table shows so)."""
    if expected is not None and observed.present and observed.rule_count != expected:
        return [f"the program's {observed.backend} rules number {observed.rule_count}, the plan's {expected}"]
    return []
