"""The disk probe's verdict rules, and its measurement run for real: the host script on this
machine's disk and over a real sshd on loopback (the lab runs it on slow disks)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from host_scripts import script_path
from node_operations.disk_probe import (
    STALL_BOUND_MS,
    WRITE_BYTES,
    DiskProbeError,
    SyncMeasurement,
    judge,
    measure_disk,
    parse_measurement,
    percentile,
)
from remote_access.ssh import SshTarget
from tests.loopback_sshd import LoopbackSshd


def measured(latencies: list[float], stalled_ms: float | None = None) -> SyncMeasurement:
    return SyncMeasurement("/var/lib/longhorn", tuple(latencies), stalled_ms, 1.0, False, "/dev/sda1 (ext4 on /)")


def test_percentile_is_nearest_rank() -> None:
    values = [float(n) for n in range(1, 301)]
    assert percentile(values, 99) == 297.0  # the 297th of 300: three slower syncs are allowed
    assert percentile(values, 100) == 300.0
    assert percentile([5.0], 99) == 5.0
    with pytest.raises(ValueError):
        percentile([], 99)


def test_a_fast_disk_may_hold_copies() -> None:
    verdict = judge("w1", measured([0.4] * 296 + [3.0, 6.0, 8.0, 9.0]), 10.0, ignore_slow_disk=False)
    assert verdict.eligible and not verdict.override
    assert (verdict.p99_ms, verdict.worst_ms, verdict.writes) == (3.0, 9.0, 300)
    assert "w1: the disk at /var/lib/longhorn may hold volume copies" in verdict.message
    assert "p99 3.0 ms, worst 9.0 ms over 300 synced writes of 2300 bytes" in verdict.message


def test_p99_at_the_threshold_passes_and_just_over_fails() -> None:
    assert judge("w1", measured([10.0] * 300), 10.0, ignore_slow_disk=False).eligible
    over = judge("w1", measured([10.5] * 300), 10.0, ignore_slow_disk=False)
    assert not over.eligible and not over.override


def test_a_slow_disk_is_refused_with_the_figures_the_setting_and_the_fixes() -> None:
    verdict = judge("w2", measured([25.0] * 296 + [30.0, 31.0, 40.0, 60.0]), 10.0, ignore_slow_disk=False)
    assert not verdict.eligible and not verdict.override
    message = verdict.message
    assert message.startswith("w2: the disk at /var/lib/longhorn syncs too slowly to hold volume copies")
    for words in (
        "p99 30.0 ms",
        "worst 60.0 ms",
        "hk3s:storage.disk_sync_p99_ms (10 ms)",
        "ignore_slow_disk is false on w2",
        "scripts/hk3s node check-disk w2",
        "holds_copies: false on w2",
        "ignore_slow_disk: true on w2",
    ):
        assert words in message, (words, message)


def test_ignore_slow_disk_accepts_a_slow_disk_and_says_it_is_an_override() -> None:
    verdict = judge("w2", measured([25.0] * 300), 10.0, ignore_slow_disk=True)
    assert verdict.eligible and verdict.override
    assert "ignore_slow_disk is true on w2 (override recorded" in verdict.message
    assert "p99 25.0 ms" in verdict.message


def test_a_stall_of_half_the_replica_timeout_is_refused_even_with_the_override() -> None:
    # One sync abandoned at the bound: the rest of the disk is fast, the p99 passes.
    stalled = measured([0.5] * 150, stalled_ms=STALL_BOUND_MS + 12)
    for ignore in (False, True):
        verdict = judge("w3", stalled, 10.0, ignore_slow_disk=ignore)
        assert not verdict.eligible and not verdict.override
        assert verdict.worst_ms == STALL_BOUND_MS + 12 and verdict.writes == 151
        assert "stalled a sync for 4012 ms, at or over 4000 ms, half of Longhorn's replica timeout" in verdict.message
        assert f"ignore_slow_disk ({str(ignore).lower()}) cannot accept that" in verdict.message
        assert "threshold 10 ms" in verdict.message and "holds_copies: false on w3" in verdict.message
    # A finished sync at the bound counts the same; just under it, the override stands.
    assert not judge("w3", measured([0.5, STALL_BOUND_MS]), 10.0, ignore_slow_disk=True).eligible
    assert judge("w3", measured([0.5, STALL_BOUND_MS - 1]), 10.0, ignore_slow_disk=True).override


def test_an_unreadable_result_names_the_host() -> None:
    with pytest.raises(DiskProbeError, match="w1: the disk probe printed no readable result"):
        parse_measurement("w1", "/var/lib/longhorn", "Traceback ...\n")
    empty = json.dumps({"latencies_ms": [], "stalled_ms": None, "seconds": 0.1})
    with pytest.raises(DiskProbeError, match="synced no write"):
        parse_measurement("w1", "/var/lib/longhorn", empty)


def _run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-", *args],
        input=script_path("disk_sync_probe.py").read_text(),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_host_script_measures_creates_the_path_and_leaves_no_file(tmp_path: Path) -> None:
    disk = tmp_path / "longhorn"
    result = _run_script(str(disk), "40", str(WRITE_BYTES), str(STALL_BOUND_MS), "20")
    assert result.returncode == 0, result.stderr
    measurement = parse_measurement("w1", str(disk), result.stdout)
    assert measurement.writes == 40 and measurement.stalled_ms is None and measurement.created_path
    assert all(latency > 0 for latency in measurement.latencies_ms)
    assert list(disk.iterdir()) == []
    assert disk.stat().st_mode & 0o777 == 0o700
    # The time cap ends the probe early: writes stop once the cap has passed.
    capped = parse_measurement("w1", str(disk), _run_script(str(disk), "100000", "2300", "4000", "0.2").stdout)
    assert 0 < capped.writes < 100000 and capped.seconds < 5
    assert list(disk.iterdir()) == []


def test_the_host_script_refuses_a_path_that_is_not_a_directory(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    result = _run_script(str(not_a_dir), "10", "2300", "4000", "20")
    assert result.returncode == 2 and "is not a directory" in result.stderr


def test_measure_disk_over_ssh(sshd: LoopbackSshd, tmp_path: Path) -> None:
    target = SshTarget(
        node="w1", address="127.0.0.1", port=sshd.port, private_key=sshd.client_private_key, connect_timeout=5
    )
    measurement = asyncio.run(measure_disk(target, str(tmp_path / "disk"), writes=25))
    assert measurement.writes == 25 and measurement.filesystem != "?"
    assert list((tmp_path / "disk").iterdir()) == []
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    with pytest.raises(DiskProbeError, match=r"w1: the disk probe could not write in .*blocked: .*not a directory"):
        asyncio.run(measure_disk(target, str(blocked), writes=5))
