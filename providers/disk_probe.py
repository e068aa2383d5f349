"""DiskProbe: measures how long the worker's Longhorn disk takes to sync small
writes and decides whether the worker may hold volume copies: a disk too slow to
sync small writes makes every volume with a copy on it slow, so it holds none
(node_operations/disk_probe.py has the measurement and the rules).

It runs at the end of the worker's join and again at every rejoin (its `join_run`
input is the join's run stamp), when its settings change, and on demand (an `up`
that replaces it: `ClusterStack.check_disk`, `scripts/hk3s node check-disk`). A
preview plans it where the up runs it: after a rejoin, not after an update of the
join that does not rejoin (labels, taints, a release, a login key).

A slow disk is recorded as `eligible: false` with the figures, the reason and the
fix, and the run goes on: the disk decides only whether the worker holds copies, not
whether it is a worker (it runs pods as well as any), and a failed `up` would fail
again at every later run for a worker that works, while `node list` and `status` keep
saying why it holds none. A probe that cannot measure fails the run, naming the host:
then nobody knows what the disk can do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from cluster_settings.defaults import DISK_SYNC_P99_DEFAULT_MS, DISK_SYNC_P99_MAX_MS, DISK_SYNC_P99_MIN_MS
from node_operations.disk_probe import LONGHORN_DISK_PATH, probe_disk
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    join_run_as_planned,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, checkable, is_known, known

OUTPUTS = (
    "eligible",
    "sync_p99_ms",
    "sync_worst_ms",
    "writes",
    "threshold_ms",
    "override",
    "verdict",
    "probe_seconds",
    "filesystem",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiskProbeInputs(NodeInputs):
    """The disk to measure and the threshold it is judged by."""

    disk_path: pulumi.Input[str] = LONGHORN_DISK_PATH
    ignore_slow_disk: pulumi.Input[bool] = False
    threshold_ms: pulumi.Input[float] = DISK_SYNC_P99_DEFAULT_MS
    join_run: pulumi.Input[str] | None = None
    """The join's run stamp: a new one (every run of the join) measures again."""


def _probe(props: dict[str, Any]) -> dict[str, Any]:
    inputs = DiskProbeInputs.from_props(props)
    node = str(known(inputs.login.node))
    measurement, verdict = run_operation(
        probe_disk(
            ssh_target(inputs.login),
            threshold_ms=float(known(inputs.threshold_ms) or DISK_SYNC_P99_DEFAULT_MS),
            ignore_slow_disk=bool(known(inputs.ignore_slow_disk)),
            path=str(known(inputs.disk_path) or LONGHORN_DISK_PATH),
            progress=lambda line: progress(node, line),
        )
    )
    return {
        **props,
        "eligible": verdict.eligible,
        "sync_p99_ms": round(verdict.p99_ms, 3),
        "sync_worst_ms": round(verdict.worst_ms, 3),
        "writes": verdict.writes,
        "threshold_ms": verdict.threshold_ms,
        "override": verdict.override,
        "verdict": verdict.message,
        "probe_seconds": round(measurement.seconds, 3),
        "filesystem": measurement.filesystem,
    }


class DiskProbeProvider(NodeProvider):
    """Dynamic provider of `DiskProbe`."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        path = checkable(news, "disk_path")
        if isinstance(path, str) and not path.startswith("/"):
            failures.append(CheckFailure("disk_path", f"{path!r} is not an absolute path"))
        threshold = checkable(news, "threshold_ms")
        if isinstance(threshold, (int, float)) and not DISK_SYNC_P99_MIN_MS <= threshold <= DISK_SYNC_P99_MAX_MS:
            failures.append(
                CheckFailure(
                    "threshold_ms",
                    f"{threshold:g} ms is outside {DISK_SYNC_P99_MIN_MS:g}-{DISK_SYNC_P99_MAX_MS:g} ms "
                    "(hk3s:storage.disk_sync_p99_ms)",
                )
            )
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Measured again when the disk path, the threshold or ignore_slow_disk change, and at
        # every run of the join (join_run): a rejoin may follow a change of the host. A preview
        # plans a new measurement only where the join runs again (join_run_as_planned).
        node = news.get("node") if is_known(news.get("node")) else olds.get("node")
        news = join_run_as_planned(str(node), olds, news)
        return diff_inputs(olds, news, replace_on=self.replace_on, ignore=DiskProbeInputs.names("recorded_host_key"))

    def create(self, props: dict[str, Any]) -> CreateResult:
        # Deterministic id: the probe of one node's disk, whichever run made it.
        return CreateResult(id_=f"{props['node']}-disk", outs=_probe(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=_probe(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # The probe removes its test file itself; nothing of it stays on the host.
        return None


class DiskProbe(Resource, module="hk3s", name="DiskProbe"):
    """The disk verdict: whether the worker can hold copies, and the measured sync latency."""

    eligible: pulumi.Output[bool]
    sync_p99_ms: pulumi.Output[float]
    sync_worst_ms: pulumi.Output[float]
    writes: pulumi.Output[int]
    threshold_ms: pulumi.Output[float]
    override: pulumi.Output[bool]
    verdict: pulumi.Output[str]
    probe_seconds: pulumi.Output[float]
    filesystem: pulumi.Output[str]

    def __init__(self, resource_name: str, inputs: DiskProbeInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        # threshold_ms is an input (hk3s:storage.disk_sync_p99_ms) and comes back as the one judged by.
        props = resource_inputs(inputs, [name for name in OUTPUTS if name != "threshold_ms"])
        super().__init__(DiskProbeProvider(), resource_name, props, opts)
