"""What adding one worker to a big cluster costs, and what runs with nothing to do cost.

    venv/bin/python -m bench.grow --out bench/results/grow.json      # clusters of 12 and 50 workers
    venv/bin/python -m bench.grow --sizes 4 --rtt-ms 0 --out /tmp/g.json

For each size N, a fresh lab: one server and N + 1 workers, each host delaying the packets it
receives by the RTT (lab.hosts netem; the k3s stand-in without a container runtime). Through the
real engine, one `up` installs the server and a second joins the N workers. Then, measured:

* a `preview` and an `up` with nothing to do: wall time and the SSH connections every host's sshd
  logged during each (from the hosts' own logs, lab/sshd_log.py, not the program's counters);
* the growth: the last worker added to the config, `up`: wall time, connections per host, and
  how the N + 1 peers' firewall updates spread over the run (the first connection each peer's
  sshd logged, relative to the run's start: a serial walk would spread them over most of the run,
  a parallel one starts them within a few seconds of each other).

The join of the N workers, the runs with nothing to do and the growth are profiled
(lab/cpu_profile.py): CPU seconds per group of processes (the engine, the language host, the
dynamic providers, the control plane, the lab hosts, the rest) beside the machine's busy time and
its capacity (cores x wall time), which says what bounds a run on this machine.

Reported beside the smallest size's figures (ratios) and as seconds and counts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.cpu_profile import CpuProfile
from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.sshd_log import ssh_connections
from lab.stack_harness import LabStack, base_config, lab_binaries_missing, server_spec, worker_spec


def _connections(hosts: list[Host], since: float, until: float) -> dict[str, list[float]]:
    """Per host, when each SSH connection its sshd logged in [since, until) was opened."""
    return {host.name: [c.opened for c in ssh_connections(host.sshd_log(since - 1), since, until)] for host in hosts}


def _timed(run: Any, hosts: list[Host]) -> tuple[float, dict[str, list[float]], float]:
    started, since = time.monotonic(), time.time()
    run()
    wall, until = time.monotonic() - started, time.time()
    return wall, _connections(hosts, since, until), since


def run_size(workers: int, rtt_ms: int, scratch: Path) -> dict[str, Any]:
    with Lab(DEFAULT_CACHE_DIR) as lab:
        server = lab.add_host(server_spec(f"bg{workers}-server"))
        hosts = [lab.add_host(worker_spec(f"bg{workers}-worker-{i + 1}")) for i in range(workers + 1)]
        everyone = [server, *hosts]
        lab.wait_ssh_ready(everyone)
        for host in everyone:
            host.set_sshd_options(["LogLevel VERBOSE"])
            if rtt_ms:
                host.netem(delay_ms=rtt_ms)
        stack = LabStack(scratch / f"grow-{workers}")
        stack.write_config(base_config(lab, server, []))
        stack.up()
        stack.write_config(base_config(lab, server, hosts[:workers]))
        started = time.monotonic()
        with CpuProfile() as join_profile:
            stack.up()
        join_wall = time.monotonic() - started

        with CpuProfile() as preview_profile:
            preview_wall, preview_conns, _ = _timed(stack.preview, everyone)
        with CpuProfile() as noop_profile:
            noop_wall, noop_conns, _ = _timed(stack.up, everyone)
        stack.write_config(base_config(lab, server, hosts))
        with CpuProfile() as grow_profile:
            grow_wall, grow_conns, grow_since = _timed(stack.up, everyone)

    peers = [server, *hosts[:workers]]
    first_login = [min(grow_conns[p.name]) - grow_since for p in peers if grow_conns[p.name]]
    return {
        "workers": workers,
        "rtt_ms": rtt_ms,
        "join_up_seconds": round(join_wall, 1),
        "join_cpu_profile": join_profile.report(),
        "noop_preview": {
            "seconds": round(preview_wall, 1),
            "connections": sum(map(len, preview_conns.values())),
            "cpu_profile": preview_profile.report(),
        },
        "noop_up": {
            "seconds": round(noop_wall, 1),
            "connections": sum(map(len, noop_conns.values())),
            "cpu_profile": noop_profile.report(),
        },
        "grow_by_one": {
            "seconds": round(grow_wall, 1),
            "connections": sum(map(len, grow_conns.values())),
            "connections_to_new_worker": len(grow_conns[hosts[workers].name]),
            "peers_logged_in_to": len(first_login),
            "peers": len(peers),
            "cpu_profile": grow_profile.report(),
            "peer_first_login_seconds": {
                "min": round(min(first_login), 1) if first_login else None,
                "median": round(statistics.median(first_login), 1) if first_login else None,
                "max": round(max(first_login), 1) if first_login else None,
            },
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="12,50")
    parser.add_argument("--rtt-ms", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    missing = lab_binaries_missing()
    if missing:
        print(f"lab binaries missing ({', '.join(missing)}); run lab/setup.sh", file=sys.stderr)
        return 2
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(size < 1 for size in sizes):
        parser.error(f"--sizes {args.sizes!r}: give worker counts of 1 or more separated by commas, e.g. 12,50")
    with tempfile.TemporaryDirectory(prefix="hk3s-bench-grow-") as scratch:
        results = [run_size(size, args.rtt_ms, Path(scratch)) for size in sizes]
    base = results[0]["grow_by_one"]["seconds"]
    for result in results:
        result["grow_ratio_to_first"] = round(result["grow_by_one"]["seconds"] / base, 2)
    report = {"sizes": results, "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
