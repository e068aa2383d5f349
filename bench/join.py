"""What joining workers costs, on lab hosts with an injected round-trip time.

    venv/bin/python -m bench.join --out bench/results/join.json                 # 1, 4 and 12 workers, 50 ms
    venv/bin/python -m bench.join --sizes 1,12,50 --out bench/results/join.json # any list of sizes
    venv/bin/python -m bench.join --sizes 1,4 --rtt-ms 0 --out /tmp/j.json

For each size N, a fresh lab: one server and N workers, each host delaying the
packets it receives by the RTT (lab.hosts netem). `pulumi up` through the real
CLI first installs the server alone, then a second `up` adds the N workers:
its wall time is the join time. Every join prints one "join stats" line (SSH
sessions, one per host it logs in to, each possibly on a login its provider
process already held; commands; seconds waiting on the hosts; seconds in all); from
those, per join:

* round trips: commands sent (each at least one round trip), in all and per phase of the
  join (preflight, prepare, join: the grant, the install and the registration, ready,
  validate, release);
* host work: time waiting on commands minus one RTT per command;
* program's own time: the join's total minus the host work (the RTTs, the
  program's bookkeeping, its polling interval).

Reported as ratios and counts; the acceptance is that 12 workers take less
than twice as long as one (node operations are sharded over provider
processes, see components/provider_shards.py).

The hosts' sshd keeps its default MaxStartups (10:30:100, as Hetzner's images)
and logs at VERBOSE, so the bench also reports, from the hosts' own sshd logs,
the most SSH handshakes in flight to one host, the connections each host
accepted and the connections it dropped past MaxStartups during the joins.

Connections per run: every SSH connection the joining `up` opened, counted on
each host from its own sshd log (lab/sshd_log.py `connection_count`), not from
the program's counters: in all, to the server, and the most to one joining
host, beside the budget (N + 3K for K workers joining an N-node
cluster, here N = 1: the server; at most 2 per joining host).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.cpu_profile import CpuProfile
from lab.hosts import DEFAULT_CACHE_DIR, Lab
from lab.sshd_log import connection_count, handshake_load
from lab.stack_harness import LabStack, base_config, lab_binaries_missing, server_spec, worker_spec

STATS = re.compile(
    r"\[(?P<node>[^\]]+)\] join stats: ssh_connections=(?P<connections>\d+) commands=(?P<commands>\d+) "
    r"remote_seconds=(?P<remote>[\d.]+) total_seconds=(?P<total>[\d.]+)(?: commands_by_phase=(?P<phases>\S+))?"
)


def run_size(workers: int, rtt_ms: int, scratch: Path) -> dict[str, Any]:
    with Lab(DEFAULT_CACHE_DIR) as lab:
        server = lab.add_host(server_spec(f"bn{workers}-server"))
        hosts = [lab.add_host(worker_spec(f"bn{workers}-worker-{i + 1}")) for i in range(workers)]
        lab.wait_ssh_ready([server, *hosts])
        for host in (server, *hosts):
            host.set_sshd_options(["LogLevel VERBOSE"])
        if rtt_ms:
            for host in (server, *hosts):
                host.netem(delay_ms=rtt_ms)
        stack = LabStack(scratch / f"size-{workers}")
        stack.write_config(base_config(lab, server, []))
        started = time.monotonic()
        stack.up()
        server_seconds = time.monotonic() - started
        stack.log.clear()
        stack.write_config(base_config(lab, server, hosts))
        started = time.monotonic()
        since = time.time()
        with CpuProfile() as profile:
            result = stack.up()
        join_seconds = time.monotonic() - started
        until = time.time()
        logs = {host.name: host.sshd_log(since - 1) for host in (server, *hosts)}
        loads = {name: handshake_load(lines) for name, lines in logs.items()}
        opened = {name: connection_count(lines, since, until).opened for name, lines in logs.items()}
        assert result.summary.result == "succeeded"
        # The engine prints each diagnostic line twice (live, then in its summary): one per node.
        joins = list({m["node"]: m.groupdict() for m in STATS.finditer(stack.text())}.values())
        assert len(joins) == workers, f"expected {workers} join stats lines, got {len(joins)}"
        per_join: list[dict[str, Any]] = []
        for join in joins:
            commands, remote, total = int(join["commands"]), float(join["remote"]), float(join["total"])
            host_work = max(remote - commands * rtt_ms / 1000, 0.0)
            per_join.append(
                {
                    "node": join["node"],
                    "ssh_connections": int(join["connections"]),
                    "round_trips": commands,
                    # Where they go: preflight, prepare, join (grant, install, registration), ready,
                    # validate, release.
                    "round_trips_by_phase": {
                        name: int(count)
                        for name, _, count in (
                            pair.partition(":") for pair in (join["phases"] or "").split(",") if pair
                        )
                    },
                    "seconds": total,
                    "host_work_seconds": round(host_work, 2),
                    "program_added_seconds": round(total - host_work, 2),
                }
            )
        return {
            "workers": workers,
            "rtt_ms": rtt_ms,
            "server_install_up_seconds": round(server_seconds, 1),
            "join_up_seconds": round(join_seconds, 1),
            # What bounds the run: CPU seconds per group of processes beside the machine's busy time.
            "join_cpu_profile": profile.report(),
            "per_join_median": {
                key: round(statistics.median(float(j[key]) for j in per_join), 2)
                for key in ("ssh_connections", "round_trips", "seconds", "host_work_seconds", "program_added_seconds")
            },
            "sshd": {
                "most_handshakes_in_flight_to_one_host": max(load.most_in_flight for load in loads.values()),
                "connections_accepted": {name: load.accepted for name, load in loads.items()},
                "connections_dropped": sum(load.dropped for load in loads.values()),
            },
            "connections": {
                "in_run": sum(opened.values()),
                "budget": 1 + 3 * workers,
                "to_server": opened[server.name],
                "most_to_one_joining_host": max(opened[host.name] for host in hosts),
                "per_host": opened,
            },
            "joins": per_join,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,12")
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
        parser.error(f"--sizes {args.sizes!r}: give worker counts of 1 or more separated by commas, e.g. 1,12,50")
    with tempfile.TemporaryDirectory(prefix="hk3s-bench-join-") as scratch:
        results = [run_size(size, args.rtt_ms, Path(scratch)) for size in sizes]
    base = results[0]["join_up_seconds"]
    for result in results:
        result["ratio_to_first"] = round(result["join_up_seconds"] / base, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"RTT {args.rtt_ms} ms")
    header = (
        "workers",
        "up s",
        "ratio",
        "sessions",
        "round trips",
        "join s",
        "host s",
        "added s",
        "in flight",
        "dropped",
        "conn/run",
        "budget",
        "max/joiner",
    )
    print("".join(f"{name:>12}" for name in header))
    for r in results:
        m = r["per_join_median"]
        row = (
            r["workers"],
            r["join_up_seconds"],
            r["ratio_to_first"],
            m["ssh_connections"],
            m["round_trips"],
            m["seconds"],
            m["host_work_seconds"],
            m["program_added_seconds"],
            r["sshd"]["most_handshakes_in_flight_to_one_host"],
            r["sshd"]["connections_dropped"],
            r["connections"]["in_run"],
            r["connections"]["budget"],
            r["connections"]["most_to_one_joining_host"],
        )
        print("".join(f"{value:>12}" for value in row))
    for r in results:
        phases = r["joins"][0]["round_trips_by_phase"]
        print(f"{r['workers']} worker(s), round trips by phase: " + ", ".join(f"{k} {v}" for k, v in phases.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
