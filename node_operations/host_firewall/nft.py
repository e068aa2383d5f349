"""nft's two spellings the host firewall uses: the text `nft -f` loads (ports,
comments, the fabric interfaces, named peer sets) and the JSON `nft -j list
ruleset` prints (tables, sets, rules and the values in their matches)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from node_operations.host_firewall.plan import (
    FABRIC_INTERFACE_PATTERNS,
    FABRIC_INTERFACES,
    IPNetwork,
    PlannedRule,
    source_sets,
)


@dataclass(frozen=True)
class NftRuleset:
    """The rendered file and how many rules it puts in the table."""

    text: str
    rule_count: int


def nft_comment(text: str) -> str:
    # nft keeps at most 128 bytes of comment; quotes were refused by the plan check.
    return '"' + text.encode()[:120].decode(errors="ignore") + '"'


def nft_fabric() -> str:
    return ", ".join(f'"{name}"' for name in (*FABRIC_INTERFACES, *FABRIC_INTERFACE_PATTERNS))


def nft_set_lines(planned: Sequence[PlannedRule]) -> list[str]:
    lines: list[str] = []
    for source_set in source_sets(planned):
        elements = ", ".join(str(network) for network in source_set.networks)
        lines += [
            f"\tset {source_set.nft_name} {{",
            f"\t\ttype ipv{source_set.family}_addr",
            "\t\tflags interval",
            f"\t\telements = {{ {elements} }}",
            "\t}",
        ]
    return lines


def nft_accept_rules(
    planned: Sequence[PlannedRule], match_of: Callable[[PlannedRule], str], *, prefix: str = ""
) -> list[str]:
    """An accept rule per planned rule and peer set (one for a rule open to
    every source), its purpose as the comment, `prefix` before each."""
    rules: list[str] = []
    for item in planned:
        match = match_of(item)
        comment = nft_comment(item.rule.purpose)
        if item.every_source:
            rules.append(f"{prefix}{match} accept comment {comment}")
            continue
        for source_set in item.sets:
            family = "ip" if source_set.family == 4 else "ip6"
            rules.append(f"{prefix}{family} saddr @{source_set.nft_name} {match} accept comment {comment}")
    return rules


def nft_objects(ruleset: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [item[kind] for item in ruleset if kind in item]


def nft_table_loaded(ruleset: Iterable[dict[str, Any]], family: str, table: str) -> bool:
    return any(item.get("family") == family and item.get("name") == table for item in nft_objects(ruleset, "table"))


def _nft_element_networks(elements: Iterable[Any]) -> list[IPNetwork]:
    """Set elements ("10.0.0.2", {"prefix": ...}, {"range": [...]}, {"elem": {"val": ...}}) as networks."""
    networks: list[IPNetwork] = []
    for element in elements:
        value = element["elem"]["val"] if isinstance(element, dict) and "elem" in element else element
        networks.extend(nft_value_networks(value))
    return networks


def nft_value_networks(value: Any) -> list[IPNetwork]:
    if isinstance(value, str):
        return [ipaddress.ip_network(value, strict=False)]
    if isinstance(value, dict) and "prefix" in value:
        return [ipaddress.ip_network(f"{value['prefix']['addr']}/{value['prefix']['len']}", strict=False)]
    if isinstance(value, dict) and "range" in value:
        first, last = (ipaddress.ip_address(part) for part in value["range"])
        return list(ipaddress.summarize_address_range(first, last))
    if isinstance(value, dict) and "set" in value:
        return _nft_element_networks(value["set"])
    raise ValueError(f"unexpected address value {value!r}")


def nft_ports(value: Any) -> list[tuple[int, int]]:
    if isinstance(value, int):
        return [(value, value)]
    if isinstance(value, dict) and "range" in value:
        return [(int(value["range"][0]), int(value["range"][1]))]
    if isinstance(value, dict) and "set" in value:
        ports: list[tuple[int, int]] = []
        for element in value["set"]:
            ports.extend(nft_ports(element))
        return ports
    raise ValueError(f"unexpected port value {value!r}")


def nft_sets(ruleset: Iterable[dict[str, Any]], family: str, table: str) -> dict[str, list[IPNetwork]]:
    sets: dict[str, list[IPNetwork]] = {}
    for item in nft_objects(ruleset, "set"):
        if item.get("family") == family and item.get("table") == table:
            try:
                sets[item["name"]] = _nft_element_networks(item.get("elem", []))
            except (ValueError, KeyError, TypeError):
                sets[item["name"]] = []
    return sets
