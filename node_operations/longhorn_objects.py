"""Longhorn's own objects as the program reads them: through the server's `k3s kubectl`, and its
disks' figures judged by Longhorn's own scheduling rules."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from remote_access.kube import ClusterApi, Repeat

LONGHORN_NAMESPACE = "longhorn-system"


async def longhorn_items(api: ClusterApi, kind: str) -> list[dict[str, Any]]:
    """Every object of `kind` (e.g. `volumes.longhorn.io`) in Longhorn's namespace."""
    out = await api.kubectl(["get", kind, "-n", LONGHORN_NAMESPACE, "-o", "json"], repeat=Repeat.READ)
    return list(json.loads(out).get("items") or [])


@dataclass(frozen=True)
class Disk:
    """One disk of a Longhorn node: its figures and whether it takes new copies."""

    available: int
    maximum: int
    reserved: int
    scheduled: int
    schedulable: bool

    def takes(self, size: int, minimal_available_percent: int) -> bool:
        """Longhorn's own scheduling test for one more copy of `size` bytes: the scheduled total
        stays within the disk less its reserve (over-provisioning at Longhorn's default of 100 %),
        and the free space left stays above the minimal-available share."""
        within_reserve = self.scheduled + size <= self.maximum - self.reserved
        keeps_minimum = self.available - size >= self.maximum * minimal_available_percent / 100
        return self.schedulable and within_reserve and keeps_minimum

    def room(self, minimal_available_percent: int) -> int:
        """The largest copy `takes` admits here, in bytes (0 when none)."""
        if not self.schedulable:
            return 0
        keeps_minimum = self.available - self.maximum * minimal_available_percent / 100
        return max(0, int(min(self.maximum - self.reserved - self.scheduled, keeps_minimum)))


def disks(node: Mapping[str, Any]) -> list[Disk]:
    """A Longhorn node's disks (its spec's, with their status figures)."""
    spec_disks = (node.get("spec") or {}).get("disks") or {}
    status_disks = (node.get("status") or {}).get("diskStatus") or {}
    found = []
    for name, spec in spec_disks.items():
        status = status_disks.get(name) or {}
        found.append(
            Disk(
                available=int(status.get("storageAvailable") or 0),
                maximum=int(status.get("storageMaximum") or 0),
                reserved=int(spec.get("storageReserved") or 0),
                scheduled=int(status.get("storageScheduled") or 0),
                schedulable=bool(spec.get("allowScheduling", True)) and not spec.get("evictionRequested"),
            )
        )
    return found
