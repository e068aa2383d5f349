"""The disk probe through the real Pulumi engine, on lab hosts whose Longhorn disk
syncs as slowly as a test says (lab/slow_disk.py: a FUSE filesystem that delays
fsync/fdatasync, changeable while the host runs). Nothing is mocked: the probe runs
over SSH on the host and measures the delay the filesystem really imposes.

The tests of this module share one cluster and run in order."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from lab import slow_disk
from lab.hosts import DEFAULT_CACHE_DIR, Host, HostSpec, Lab
from lab.pytest_fixtures import lab_skip_reason
from lab.stack_harness import (
    LabStack,
    base_config,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)
from operator_api import ClusterStack, Node

pytestmark = pytest.mark.lab
SLOW_MS = 25.0  # a network block device's sync, over the 10 ms threshold
DISK_PROBE_TYPE = "pulumi-python:dynamic/hk3s:DiskProbe"


@dataclass
class Cluster:
    lab: Lab
    server: Host
    fast: Host
    slow: Host
    accepted: Host
    stalling: Host
    stack: LabStack
    config: dict[str, Any]

    def api(self) -> ClusterStack:
        return self.stack.api()

    def nodes(self) -> dict[str, Node]:
        return {node.name: node for node in self.api().nodes()}

    def hk3s(self, *args: str) -> Any:
        return self.stack.hk3s(*args)

    def probe_outputs(self, node: str) -> dict[str, Any]:
        deployment = self.stack.stack().export_stack().deployment or {}
        for resource in deployment.get("resources") or []:
            if resource.get("type") == DISK_PROBE_TYPE and resource["urn"].endswith(f"::{node}-disk"):
                return dict(resource.get("outputs") or {})
        raise AssertionError(f"no DiskProbe of {node} in the state")


def disk_of(host: Host) -> slow_disk.SlowDisk:
    return slow_disk.of_host_dir(host.dir)


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("dp-server"))
    fast = lab.add_host(worker_spec("dp-fast", disk_sync_delay_ms=0))
    slow = lab.add_host(worker_spec("dp-slow", disk_sync_delay_ms=SLOW_MS))
    accepted = lab.add_host(worker_spec("dp-accepted", disk_sync_delay_ms=SLOW_MS))
    stalling = lab.add_host(worker_spec("dp-stall", disk_sync_delay_ms=1))
    # Fast, except that every 40th sync stalls for 4.5 s: past half of Longhorn's 8 s replica timeout.
    disk_of(stalling).set_delay(1, stall_ms=4500, stall_every=40)
    lab.wait_ssh_ready([server, fast, slow, accepted, stalling])
    config = base_config(lab, server, [fast, slow, accepted, stalling])
    for worker in config["workers"]:
        worker["holds_copies"] = True
        worker["ignore_slow_disk"] = worker["name"] in ("dp-accepted", "dp-stall")
    stack = LabStack(tmp_path_factory.mktemp("disk-probe-stack"))
    stack.write_config(config)
    the_cluster = Cluster(lab, server, fast, slow, accepted, stalling, stack, config)
    up_or_fail(stack)
    yield the_cluster


def test_the_slow_disk_is_a_real_mount_in_the_host(cluster: Cluster) -> None:
    mounts = cluster.slow.run(["findmnt", "-n", "-o", "FSTYPE", "/var/lib/longhorn"]).stdout.split()
    assert mounts == [slow_disk.FUSE_TYPE]
    assert cluster.server.run(["findmnt", "/var/lib/longhorn"], check=False).returncode != 0
    # Its daemon, and every thread of it, runs ahead of the lab's other work, as a disk does not
    # wait for a CPU (lab/slow_disk.py): field 19 of each thread's stat is its nice value.
    mount_point = str(disk_of(cluster.fast).mount_point)
    daemons = [
        proc
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and mount_point in _read(proc / "cmdline").replace("\0", " ")
    ]
    assert daemons, f"no {slow_disk.BINARY_NAME} serves {mount_point}"
    niceness = {int(_read(task / "stat").rpartition(")")[2].split()[16]) for task in (daemons[0] / "task").iterdir()}
    assert niceness == {slow_disk.DAEMON_NICENESS}, niceness


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_fast_disk_passes_and_a_slow_disk_is_refused_with_its_figures(cluster: Cluster) -> None:
    nodes = cluster.nodes()
    fast, slow = nodes["dp-fast"], nodes["dp-slow"]
    assert fast.holds_copies and fast.disk is not None and fast.disk.eligible and not fast.disk.override
    assert fast.disk.writes == 300 and fast.disk.sync_p99_ms is not None and fast.disk.sync_p99_ms < 10
    assert fast.disk.threshold_ms == 10.0
    assert slow.disk is not None and not slow.disk.eligible and not slow.disk.override and not slow.holds_copies
    # The delay the filesystem imposes is what the probe measured.
    # (loaded by four probes at once on two shared cores, a 25 ms delay measured 34 ms at p99).
    assert slow.disk.sync_p99_ms is not None and SLOW_MS <= slow.disk.sync_p99_ms < 3 * SLOW_MS
    assert slow.disk.writes == 300
    verdict = slow.disk.verdict or ""
    assert verdict.startswith("dp-slow: the disk at /var/lib/longhorn syncs too slowly to hold volume copies")
    assert f"p99 {slow.disk.sync_p99_ms:.1f} ms, worst {slow.disk.sync_worst_ms:.1f} ms over 300" in verdict
    assert "hk3s:storage.disk_sync_p99_ms (10 ms)" in verdict and "ignore_slow_disk is false on dp-slow" in verdict
    # The run said so as it happened, and the server holds copies with no probe of its own.
    assert "[dp-slow] the disk at /var/lib/longhorn syncs too slowly" in cluster.stack.text()
    assert nodes["dp-server"].holds_copies and nodes["dp-server"].disk is None
    # The probe left no file on either disk.
    for host in (cluster.fast, cluster.slow):
        assert host.run(["ls", "-A", "/var/lib/longhorn"]).stdout.strip() == ""


def test_ignore_slow_disk_accepts_a_moderately_slow_disk_and_records_the_override(cluster: Cluster) -> None:
    accepted = cluster.nodes()["dp-accepted"]
    assert accepted.holds_copies and accepted.disk is not None
    assert accepted.disk.eligible and accepted.disk.override
    assert accepted.disk.sync_p99_ms is not None and accepted.disk.sync_p99_ms >= SLOW_MS
    assert "ignore_slow_disk is true on dp-accepted (override recorded" in (accepted.disk.verdict or "")
    outputs = cluster.probe_outputs("dp-accepted")
    assert outputs["override"] is True and outputs["eligible"] is True and outputs["threshold_ms"] == 10.0


def test_a_stall_of_half_the_replica_timeout_is_refused_despite_ignore_slow_disk(cluster: Cluster) -> None:
    stalling = cluster.nodes()["dp-stall"]
    disk = stalling.disk
    assert disk is not None and not disk.eligible and not disk.override and not stalling.holds_copies
    # The probe stopped at the stall (the 40th sync) instead of running its 300 writes.
    assert disk.writes == 40 and disk.sync_worst_ms is not None and disk.sync_worst_ms >= 4000
    assert disk.sync_p99_ms is not None and disk.sync_p99_ms >= 4000  # one stall in 40 is above the 99th
    verdict = disk.verdict or ""
    assert f"stalled a sync for {disk.sync_worst_ms:.0f} ms, at or over 4000 ms, half of Longhorn's replica" in verdict
    assert "ignore_slow_disk (true) cannot accept that" in verdict and "threshold 10 ms" in verdict


def test_the_on_demand_check_follows_the_disk(cluster: Cluster) -> None:
    """The slow disk gets fast: the API's check_disk re-probes that worker alone and it may hold
    copies; then the fast disk gets slow: the CLI's node check-disk takes its copies away."""
    before = {name: cluster.probe_outputs(name)["probe_seconds"] for name in ("dp-fast", "dp-accepted")}
    disk_of(cluster.slow).set_delay(0)
    lines: list[str] = []
    result = cluster.api().check_disk("dp-slow", on_output=lines.append)
    assert result.eligible and not result.override and result.sync_p99_ms is not None and result.sync_p99_ms < 10
    assert result.writes == 300
    assert cluster.nodes()["dp-slow"].holds_copies  # the stack's nodes output follows
    assert cluster.probe_outputs("dp-slow")["eligible"] is True
    # Only that worker's disk was probed: the others kept their measurements.
    assert {name: cluster.probe_outputs(name)["probe_seconds"] for name in before} == before
    assert not any("[dp-fast]" in line or "[dp-accepted]" in line for line in lines)

    disk_of(cluster.fast).set_delay(SLOW_MS)
    run = cluster.hk3s("node", "check-disk", "dp-fast")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("dp-fast holds no volume copies"), run.stdout
    measured = re.search(r"syncs too slowly to hold volume copies: p99 (\d+\.\d) ms", run.stdout)
    assert measured and float(measured[1]) >= SLOW_MS, run.stdout
    listed = cluster.hk3s("node", "list")
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:] if line.split()}
    assert rows["dp-fast"][7] == "no(slow-disk)" and rows["dp-slow"][7] == "yes"
    assert rows["dp-accepted"][7] == "yes(override)" and rows["dp-stall"][7] == "no(slow-disk)"
    as_json = json.loads(cluster.hk3s("--json", "node", "list").stdout)
    fast = next(node for node in as_json if node["name"] == "dp-fast")
    assert fast["holds_copies"] is False and fast["disk"]["sync_p99_ms"] >= SLOW_MS
    status = cluster.hk3s("status")
    assert "dp-fast: no copies: dp-fast: the disk at /var/lib/longhorn syncs too slowly" in status.stdout
    assert "dp-accepted: override: " in status.stdout


def test_a_rejoin_probes_the_disk_again(cluster: Cluster) -> None:
    """The probe runs at the end of every join: a rejoin of dp-slow, whose disk is slow again,
    takes its copies away; the other workers are neither rejoined nor probed. The rejoin's
    cause: the host lost its k3s agent unit (removed by hand), which a refresh reads on the host
    and the next run repairs by joining it again (labels alone would not: they are set through
    the API)."""
    before = {name: cluster.probe_outputs(name)["probe_seconds"] for name in ("dp-fast", "dp-accepted", "dp-stall")}
    disk_of(cluster.slow).set_delay(SLOW_MS)
    config = json.loads(json.dumps(cluster.config))
    cluster.slow.run(["mv", "/etc/systemd/system/k3s-agent.service", "/root/k3s-agent.service.removed"])
    cluster.stack.write_config(config)
    start = len(cluster.stack.log)
    planned: dict[str, str] = {}

    def record(event: auto.EngineEvent) -> None:
        step = event.resource_pre_event
        if step is not None:
            planned[step.metadata.urn.rsplit("::", 1)[-1]] = str(getattr(step.metadata.op, "value", step.metadata.op))

    try:
        cluster.api().refresh(on_output=cluster.stack.log.append)
        # The preview announces the run the up makes: dp-slow joined and its disk probed again, no
        # other worker's disk (its join's run stamp is unknown to the preview, the rejoin is not).
        cluster.stack.preview(on_event=record)
        probes = {name for name, op in planned.items() if name.endswith("-disk") and op != "same"}
        assert planned.get("dp-slow-join") == "update" and probes == {"dp-slow-disk"}, planned
        up_or_fail(cluster.stack)
    finally:
        cluster.stack.write_config(cluster.config)
    log = "\n".join(cluster.stack.log[start:])
    assert "[dp-slow] probing the disk at /var/lib/longhorn" in log
    assert "[dp-fast] probing" not in log and "[dp-accepted] probing" not in log
    slow = cluster.nodes()["dp-slow"]
    assert not slow.holds_copies and slow.disk is not None and not slow.disk.eligible
    assert {name: cluster.probe_outputs(name)["probe_seconds"] for name in before} == before


def test_check_disk_refuses_an_unknown_worker_and_one_without_copies(cluster: Cluster) -> None:
    unknown = cluster.hk3s("node", "check-disk", "dp-ghost")
    assert unknown.returncode == 3 and "there is no worker named 'dp-ghost'" in unknown.stderr
    document = cluster.api().settings_document()
    document.config["hk3s:workers"][0]["holds_copies"] = False
    (cluster.stack.project / f"Pulumi.{cluster.stack.name}.yaml").write_text(document.render())
    try:
        opted_out = cluster.hk3s("node", "check-disk", "dp-fast")
        assert opted_out.returncode == 3, opted_out.stderr
        assert "hk3s:workers[0].holds_copies" in opted_out.stderr and "set holds_copies: true" in opted_out.stderr
    finally:
        cluster.stack.write_config(cluster.config)


def test_a_slow_disk_host_leaves_nothing_after_teardown(tmp_path: Path) -> None:
    """The daemon and both mounts go with the lab (lab.slow_disk)."""
    skip_without_lab_binaries()
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    own = Lab(cache_dir=DEFAULT_CACHE_DIR)
    try:
        host = own.add_host(HostSpec("dp-teardown", disk_sync_delay_ms=5))
        assert disk_of(host).is_mounted()
        run_dir = own.run_dir
        assert any(slow_disk.BINARY_NAME in line for line in own.leftovers().processes)
    finally:
        own.teardown()
    assert own.leftovers().empty()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert os.fspath(run_dir) not in mounts
    assert not run_dir.exists()
