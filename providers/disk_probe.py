"""DiskProbe: measures how long the worker's Longhorn disk takes to sync small
writes and decides whether the worker may hold volume copies: a disk too slow to
sync small writes makes every volume with a copy on it slow, so it holds none.

Inputs are validated now; the measurement is a later capability.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, UpdateResult

from providers.base import CapabilityMissingError, NodeProvider, check_connection_inputs, resource_inputs

PROBE_CAPABILITY = "the disk probe for volume copies; set holds_copies: false on the worker to join it without one"


class DiskProbeProvider(NodeProvider):
    """Dynamic provider of `DiskProbe`."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        path = news.get("disk_path")
        if isinstance(path, str) and not path.startswith("/"):
            failures.append(CheckFailure("disk_path", f"{path!r} is not an absolute path"))
        return CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> CreateResult:
        raise CapabilityMissingError(props["node"], "probing the disk for volume copies", PROBE_CAPABILITY)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        raise CapabilityMissingError(news["node"], "re-probing the disk", PROBE_CAPABILITY)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # The probe's test file is removed by the probe itself; nothing stays behind.
        return None


class DiskProbe(Resource, module="hk3s", name="DiskProbe"):
    """The disk verdict: whether the worker can hold copies, and the measured sync latency."""

    eligible: pulumi.Output[bool]
    sync_p99_ms: pulumi.Output[float]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = resource_inputs(props, ["eligible", "sync_p99_ms"])
        super().__init__(DiskProbeProvider(), resource_name, inputs, opts)
