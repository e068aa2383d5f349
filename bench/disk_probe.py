"""How long the disk probe takes per node, and how much its figures spread over runs on one disk.

    sudo venv/bin/python -m bench.disk_probe --out bench/results/disk_probe.json
    sudo venv/bin/python -m bench.disk_probe --runs 5 --kinds real,fast,slow

One lab host per kind of disk, each probed `--runs` times in a row, one host after the
other (never two probes at once), with the same operation a `DiskProbe` runs at the end
of a join (node_operations.disk_probe.probe_disk: SSH login, the host script, the
verdict) over real SSH:

* real: the host's /var/lib/longhorn on its overlay root, i.e. this machine's disk;
* fast: a lab slow disk with no delay (lab/slow_disk.py: memory behind FUSE);
* slow: a lab slow disk whose syncs wait 25 ms (a network block device's pace).

Per kind: the probe's wall time (login included) and the measured p99 and worst sync,
each as median, min, max and spread (max - min) over the runs, and the verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lab.hosts import DEFAULT_CACHE_DIR, Host, HostSpec, Lab, missing_prerequisites
from node_operations.disk_probe import probe_disk
from remote_access.ssh import SshTarget

KINDS: dict[str, float | None] = {"real": None, "fast": 0.0, "slow": 25.0}
THRESHOLD_MS = 10.0


def target(lab: Lab, host: Host) -> SshTarget:
    return SshTarget(
        node=host.name,
        address=host.ssh_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=host.ssh_host_public_key,
    )


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "spread": round(max(values) - min(values), 3),
    }


def probe_runs(lab: Lab, host: Host, runs: int) -> dict[str, Any]:
    results = []
    for _ in range(runs):
        started = time.monotonic()
        measurement, verdict = asyncio.run(
            probe_disk(
                target(lab, host), threshold_ms=THRESHOLD_MS, ignore_slow_disk=False, progress=lambda _line: None
            )
        )
        results.append(
            {
                "seconds": round(time.monotonic() - started, 3),
                "host_seconds": measurement.seconds,
                "writes": verdict.writes,
                "p99_ms": round(verdict.p99_ms, 3),
                "worst_ms": round(verdict.worst_ms, 3),
                "eligible": verdict.eligible,
            }
        )
    return {
        "filesystem": measurement.filesystem,
        "seconds": spread([r["seconds"] for r in results]),
        "p99_ms": spread([r["p99_ms"] for r in results]),
        "worst_ms": spread([r["worst_ms"] for r in results]),
        "verdicts": sorted({"eligible" if r["eligible"] else "refused" for r in results}),
        "runs": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    missing = missing_prerequisites()
    if missing:
        print("cannot run lab hosts here: " + "; ".join(missing), file=sys.stderr)
        return 2
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    lab = Lab(cache_dir=DEFAULT_CACHE_DIR)
    report: dict[str, Any] = {"runs_per_disk": args.runs, "threshold_ms": THRESHOLD_MS, "disks": {}}
    try:
        hosts = {
            kind: lab.add_host(HostSpec(f"bench-disk-{kind}", disk_sync_delay_ms=KINDS[kind], private_nic=False))
            for kind in kinds
        }
        lab.wait_ssh_ready(list(hosts.values()))
        for kind, host in hosts.items():
            report["disks"][kind] = {"sync_delay_ms": KINDS[kind], **probe_runs(lab, host, args.runs)}
    finally:
        lab.teardown()
    print(
        f"{'disk':<6} {'probe s (median, spread)':<26} {'p99 ms (median, spread)':<26} {'worst ms (max)':<16} verdict"
    )
    for kind, data in report["disks"].items():
        seconds, p99, worst = data["seconds"], data["p99_ms"], data["worst_ms"]
        print(
            f"{kind:<6} {seconds['median']:>7.2f} ± {seconds['spread']:<16.2f} "
            f"{p99['median']:>8.2f} ± {p99['spread']:<15.2f} {worst['max']:>10.2f}      {'/'.join(data['verdicts'])}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
