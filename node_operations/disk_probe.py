"""The disk probe: may this worker hold volume copies?

A Longhorn volume acknowledges a write only when every copy has it, so one copy on a
disk that syncs slowly makes every write to that volume slow, and a sync that stalls
long enough gets the copy failed mid-write. The probe measures the disk the way etcd's
guidance measures one for its write-ahead log: small sequential writes (2300 bytes, as
etcd's fio recipe) each followed by fdatasync, timing the sync alone
(host_scripts/disk_sync_probe.py, run over SSH).

Why python3 on the host and not fio: fio is not on any supported cloud image and would
be one more package to install on every worker, while python3 is on every supported
image already (cloud-init and the package managers run on it; RHEL 8 keeps it as
/usr/libexec/platform-python). The timing is Python's monotonic clock around one
`os.fdatasync` call: microseconds of overhead against the milliseconds it judges.

The verdict (`judge`):
- passes when the 99th percentile of the sync times is at or under the threshold
  (hk3s:storage.disk_sync_p99_ms, default 10 ms: etcd's guidance that the 99th
  percentile of its WAL fdatasync stays under 10 ms);
- a disk over the threshold holds no copies unless the worker sets ignore_slow_disk,
  which accepts it and is recorded as an override;
- a disk on which one sync took half of Longhorn's replica timeout or more holds no
  copies whatever ignore_slow_disk says: at the full timeout Longhorn fails the copy.

A slow disk is a verdict, not an error: the worker stays joined and holds no copies. An
error is a probe that could not measure (no python3, a path that takes no file, SSH).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from host_scripts import script_path
from remote_access.ssh import RemoteCommandError, SshDeadlineError, SshError, SshTarget, open_session

Progress = Callable[[str], None]

LONGHORN_DISK_PATH = "/var/lib/longhorn"
# etcd's fio recipe writes 2300-byte blocks, the size of a typical WAL entry.
WRITE_BYTES = 2300
# Enough syncs for a 99th percentile that is not simply the worst (the 297th of 300),
# few enough that a passing disk is done in about a second.
PROBE_WRITES = 300
# A slow disk is judged from what it synced in this time rather than kept for minutes.
PROBE_TIME_CAP_SECONDS = 20.0
# Longhorn's engine-replica-timeout default: an engine fails a replica that has not
# answered a write in this time. A stall of half of it is refused even with an override.
LONGHORN_REPLICA_TIMEOUT_SECONDS = 8.0
STALL_BOUND_MS = LONGHORN_REPLICA_TIMEOUT_SECONDS * 1000.0 / 2
PYTHON_LAUNCHER = (
    # The probe is a Python file on stdin; RHEL 8 has python3 only as platform-python.
    'for python in python3 /usr/libexec/platform-python; do command -v "$python" >/dev/null 2>&1 '
    '&& exec "$python" - "$@"; done; echo "no python3 on the host" >&2; exit 127'
)
SETTING = "hk3s:storage.disk_sync_p99_ms"


class DiskProbeError(SshError):
    """The probe could not measure the disk (not a slow disk: that is a verdict)."""


@dataclass(frozen=True)
class SyncMeasurement:
    """What the probe measured on one disk."""

    path: str
    latencies_ms: tuple[float, ...]
    stalled_ms: float | None
    """How long a sync had run when the probe gave up on it (it reached the stall bound)."""
    seconds: float
    created_path: bool
    filesystem: str

    @property
    def writes(self) -> int:
        return len(self.latencies_ms) + (1 if self.stalled_ms is not None else 0)

    @property
    def worst_ms(self) -> float:
        return max([*self.latencies_ms, self.stalled_ms or 0.0])

    @property
    def p99_ms(self) -> float:
        return percentile([*self.latencies_ms, *([self.stalled_ms] if self.stalled_ms is not None else [])], 99)


def percentile(values: Sequence[float], rank: float) -> float:
    """Nearest-rank percentile: the smallest value at or above `rank` percent of the values."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(math.ceil(rank / 100 * len(ordered)) - 1, 0)]


@dataclass(frozen=True)
class DiskVerdict:
    """Whether the worker may hold copies, with the figures and the reason."""

    node: str
    eligible: bool
    override: bool
    p99_ms: float
    worst_ms: float
    writes: int
    threshold_ms: float
    ignore_slow_disk: bool
    message: str


def judge(node: str, measurement: SyncMeasurement, threshold_ms: float, ignore_slow_disk: bool) -> DiskVerdict:
    """The verdict on a measured disk (see the module docstring for the rules)."""
    p99, worst, writes = measurement.p99_ms, measurement.worst_ms, measurement.writes
    figures = f"p99 {p99:.1f} ms, worst {worst:.1f} ms over {writes} synced writes of {WRITE_BYTES} bytes"
    where = f"{node}: the disk at {measurement.path}"
    fix = (
        f"Put {measurement.path} on a local SSD or NVMe disk and check it again (scripts/hk3s node check-disk {node}), "
        f"or set holds_copies: false on {node} in hk3s:workers"
    )

    def verdict(eligible: bool, override: bool, message: str) -> DiskVerdict:
        return DiskVerdict(
            node, eligible, override, p99, worst, writes, threshold_ms, ignore_slow_disk, f"{where} {message}"
        )

    if worst >= STALL_BOUND_MS:
        return verdict(
            False,
            False,
            f"stalled a sync for {worst:.0f} ms, at or over {STALL_BOUND_MS:.0f} ms, half of Longhorn's replica "
            f"timeout (engine-replica-timeout, {LONGHORN_REPLICA_TIMEOUT_SECONDS:.0f} s), after which Longhorn fails "
            f"a copy mid-write; it holds no volume copies, and ignore_slow_disk ({str(ignore_slow_disk).lower()}) "
            f"cannot accept that ({figures}; threshold {threshold_ms:g} ms). {fix}",
        )
    if p99 <= threshold_ms:
        return verdict(True, False, f"may hold volume copies: {figures}, within {SETTING} ({threshold_ms:g} ms)")
    if ignore_slow_disk:
        return verdict(
            True,
            True,
            f"syncs slowly ({figures}; over {SETTING}, {threshold_ms:g} ms) and holds volume copies anyway: "
            f"ignore_slow_disk is true on {node} (override recorded; every volume with a copy there writes at "
            "this disk's pace)",
        )
    return verdict(
        False,
        False,
        f"syncs too slowly to hold volume copies: {figures}, over {SETTING} ({threshold_ms:g} ms), and "
        f"ignore_slow_disk is false on {node}; it holds none. {fix}, or accept this disk with "
        f"ignore_slow_disk: true on {node} (every volume with a copy there would write at its pace)",
    )


def parse_measurement(node: str, path: str, stdout: str) -> SyncMeasurement:
    """The probe script's JSON line."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
        measurement = SyncMeasurement(
            path=path,
            latencies_ms=tuple(float(value) for value in data["latencies_ms"]),
            stalled_ms=None if data.get("stalled_ms") is None else float(data["stalled_ms"]),
            seconds=float(data["seconds"]),
            created_path=bool(data.get("created_path")),
            filesystem=str(data.get("filesystem") or "?"),
        )
    except (IndexError, KeyError, TypeError, ValueError) as error:
        raise DiskProbeError(node, f"the disk probe printed no readable result ({error}): {stdout[-300:]!r}") from None
    if measurement.writes == 0:
        raise DiskProbeError(node, f"the disk probe synced no write in {path}; run it again")
    return measurement


async def measure_disk(
    target: SshTarget,
    path: str = LONGHORN_DISK_PATH,
    *,
    writes: int = PROBE_WRITES,
    time_cap_seconds: float = PROBE_TIME_CAP_SECONDS,
) -> SyncMeasurement:
    """Log in and time `writes` synced small writes in `path` (see the module docstring)."""
    script = script_path("disk_sync_probe.py").read_text()
    args = [path, str(writes), str(WRITE_BYTES), f"{STALL_BOUND_MS:g}", f"{time_cap_seconds:g}"]
    # The probe bounds itself (time cap, stall bound); this deadline is for a host that hangs.
    deadline = time_cap_seconds + STALL_BOUND_MS / 1000 + 30
    async with open_session(target, shared=True) as session:
        try:
            result = await session.run(
                ["sh", "-c", PYTHON_LAUNCHER, "disk-probe", *args],
                stdin=script,
                deadline=deadline,
                what=f"the disk probe in {path}",
            )
        except RemoteCommandError as error:
            if error.exit_status == 127:
                raise DiskProbeError(
                    target.node,
                    "the disk probe needs python3 on the host and there is none; install python3 "
                    f"(apt-get install python3-minimal, dnf install python3), or set holds_copies: false on "
                    f"{target.node} in hk3s:workers",
                ) from None
            raise DiskProbeError(
                target.node,
                f"the disk probe could not write in {path}: {error.stderr_tail or error}. Make {path} a writable "
                f"directory on the disk Longhorn should use, or set holds_copies: false on {target.node}",
            ) from None
        except SshDeadlineError:
            raise DiskProbeError(
                target.node,
                f"the disk probe in {path} did not finish within {deadline:.0f} s although it stops itself after "
                f"{time_cap_seconds:.0f} s: the disk or the host hangs. Check the disk (dmesg), or set "
                f"holds_copies: false on {target.node}",
            ) from None
    return parse_measurement(target.node, path, result.stdout)


async def probe_disk(
    target: SshTarget,
    *,
    threshold_ms: float,
    ignore_slow_disk: bool,
    path: str = LONGHORN_DISK_PATH,
    progress: Progress,
) -> tuple[SyncMeasurement, DiskVerdict]:
    """Measure the worker's Longhorn disk and judge it; the verdict goes to `progress` too."""
    progress(f"probing the disk at {path}: up to {PROBE_WRITES} synced writes of {WRITE_BYTES} bytes")
    started = time.monotonic()
    measurement = await measure_disk(target, path)
    verdict = judge(target.node, measurement, threshold_ms, ignore_slow_disk)
    created = ", created it" if measurement.created_path else ""
    progress(
        f"disk probe: {measurement.writes} writes in {measurement.seconds:.1f} s on {measurement.filesystem}"
        f"{created} ({time.monotonic() - started:.1f} s with the login)"
    )
    progress(verdict.message.removeprefix(f"{target.node}: "))
    return measurement, verdict
