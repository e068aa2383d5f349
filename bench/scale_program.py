"""How the program's own cost grows with the number of workers: the program of a stack with N
existing workers run under Pulumi's mocks (tests/components/mock_engine.py: no engine, no
provider, no host; the program's Python and the Pulumi SDK's work only), its CPU seconds (in all
and per worker), how many resources it registers, the dependencies they declare (as the engine
receives them) and the JSON size of their inputs, summed and by resource type. With
`--without-cycle-check` the same run again with the SDK's dependency-cycle check left out (each
`depends_on` entry and each input's dependency makes the SDK walk every resource reachable from
it, `pulumi/runtime/resource_cycle_breaker.py`), to show that check's share of the CPU.

This measures the program alone; the engine's and the providers' share of a real preview is the
lab's (the engine is not run here).

    venv/bin/python -m bench.scale_program 25 50 100 --out bench/results/scale_program.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any


def stack_config(workers: int, key_file: Path) -> dict[str, Any]:
    """A server and `workers` existing workers (addresses nothing needs to answer: no run logs in)."""
    return {
        "cluster": {"name": "scale", "k3s_version": "v1.31.4+k3s1"},
        "server": {"name": "srv", "kind": "existing", "address": "198.51.100.1"},
        "ssh": {"private_key_file": str(key_file)},
        "workers": [
            {"name": f"w{i}", "kind": "existing", "address": f"10.1.{i // 250}.{i % 250 + 1}"} for i in range(workers)
        ],
    }


def measure(workers: int, key_file: Path) -> dict[str, Any]:
    from cluster_settings import load_settings  # noqa: PLC0415 - after the argument check
    from components.program import build_cluster, read_credentials  # noqa: PLC0415
    from tests.components.mock_engine import run_with_mocks  # noqa: PLC0415

    settings = load_settings(stack_config(workers, key_file))
    started = time.process_time()
    recording = run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)))
    cpu = time.process_time() - started
    sizes: Counter[str] = Counter()
    for registration in recording.registrations:
        sizes[registration.type.rsplit("/", 1)[-1]] += len(json.dumps(registration.inputs, default=str))
    return {
        "workers": workers,
        "program_cpu_seconds": round(cpu, 2),
        "program_cpu_seconds_per_worker": round(cpu / workers, 3),
        "resources": len(recording.registrations),
        "dependencies": sum(len(registration.dependencies) for registration in recording.registrations),
        "input_bytes": sum(sizes.values()),
        "input_bytes_by_type": dict(sizes.most_common(8)),
    }


def without_cycle_check() -> None:
    """Record each dependency as the SDK does, without its reachability walk first."""
    from pulumi.runtime import resource_cycle_breaker, rpc  # noqa: PLC0415

    def declare(from_resource: Any, to_resource: Any) -> bool:
        resource_cycle_breaker._add_dep(from_resource, to_resource)
        return True

    rpc.declare_dependency = declare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workers", type=int, nargs="+", help="worker counts, measured in this order")
    parser.add_argument("--without-cycle-check", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.without_cycle_check:
        without_cycle_check()
    key_file = Path(tempfile.mkdtemp()) / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    rows = []
    for workers in args.workers:
        row = measure(workers, key_file)
        row["cycle_check"] = not args.without_cycle_check
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
