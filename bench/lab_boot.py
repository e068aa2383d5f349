"""How long lab hosts take: booting N hosts with the base cached, and ensure_base() cold vs warm.

    sudo venv/bin/python -m bench.lab_boot --out bench/results/lab_boot.json
    sudo venv/bin/python -m bench.lab_boot --skip-cold --rounds 5 --out /tmp/b.json

* boot: from the first add_host() until every host answers over real SSH
  (three kinds of host: a normal one, one routing via its private NIC, one
  without a private NIC, then more normal ones), base already cached; the
  lab's network set-up is timed apart.  Each round is a fresh lab.
* ensure_base cold: debootstrap into an empty, temporary cache directory
  (packages downloaded again), removed afterwards.
* ensure_base warm: the same call once the base exists in the real cache.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.hosts import DEFAULT_CACHE_DIR, HostSpec, Lab, missing_prerequisites
from lab.hosts.processes import _safe_rmtree


def specs(count: int) -> list[HostSpec]:
    kinds = [
        HostSpec("bench-normal"),
        HostSpec("bench-privroute", private_default_route=True),
        HostSpec("bench-nopriv", private_nic=False),
    ]
    return (kinds + [HostSpec(f"bench-extra{i}") for i in range(count)])[:count]


def boot_round(cache_dir: Path, count: int) -> dict[str, Any]:
    lab = Lab(cache_dir=cache_dir)
    try:
        started = time.monotonic()
        lab.setup_network()
        network = time.monotonic() - started
        started = time.monotonic()
        hosts = [lab.add_host(spec) for spec in specs(count)]
        added = time.monotonic() - started
        ready = lab.wait_ssh_ready(hosts, timeout=300)
        total = time.monotonic() - started
        per_host = {name: round(seconds + added, 3) for name, seconds in ready.items()}
    finally:
        started = time.monotonic()
        lab.teardown()
        teardown = time.monotonic() - started
    return {
        "network_setup_s": round(network, 3),
        "add_hosts_s": round(added, 3),
        "all_ssh_ready_s": round(total, 3),
        "per_host_ssh_ready_s": per_host,
        "teardown_s": round(teardown, 3),
    }


def ensure_base_warm(cache_dir: Path) -> dict[str, Any]:
    lab = Lab(cache_dir=cache_dir)
    try:
        was_cached = (lab.base_path() / ".hk3s-lab-base.json").exists()
        first_started = time.monotonic()
        lab.ensure_base()
        first = time.monotonic() - first_started
        started = time.monotonic()
        lab.ensure_base()
        warm = time.monotonic() - started
    finally:
        lab.teardown()
    return {"already_cached": was_cached, "first_call_s": round(first, 3), "warm_s": round(warm, 6)}


def ensure_base_cold() -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="hk3s-lab-bench-", dir="/var/tmp"))
    lab = Lab(cache_dir=scratch / "cache")
    try:
        started = time.monotonic()
        base = lab.ensure_base()
        cold = time.monotonic() - started
        size = sum(f.stat().st_size for f in base.rglob("*") if f.is_file() and not f.is_symlink())
    finally:
        lab.teardown()
        _safe_rmtree(scratch)
    return {"cold_s": round(cold, 3), "base_bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="write the results as JSON here")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--skip-cold", action="store_true", help="do not time a cold debootstrap (about 2 minutes)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    missing = missing_prerequisites()
    if missing:
        print("cannot run the lab here: " + "; ".join(missing), file=sys.stderr)
        return 2

    results: dict[str, Any] = {"hosts": args.hosts, "rounds": args.rounds}
    results["ensure_base_warm"] = ensure_base_warm(args.cache_dir)
    rounds = [boot_round(args.cache_dir, args.hosts) for _ in range(args.rounds)]
    results["boot_rounds"] = rounds
    totals = [r["all_ssh_ready_s"] for r in rounds]
    results["boot_all_ssh_ready_s"] = {
        "min": min(totals),
        "median": round(statistics.median(totals), 3),
        "max": max(totals),
    }
    if not args.skip_cold:
        results["ensure_base_cold"] = ensure_base_cold()

    rows = [
        (
            f"boot {args.hosts} hosts to SSH-ready (base cached), median of {args.rounds}",
            results["boot_all_ssh_ready_s"]["median"],
        ),
        (f"boot {args.hosts} hosts to SSH-ready, best", results["boot_all_ssh_ready_s"]["min"]),
        ("lab network set-up (median)", round(statistics.median(r["network_setup_s"] for r in rounds), 3)),
        ("lab teardown (median)", round(statistics.median(r["teardown_s"] for r in rounds), 3)),
        ("ensure_base() warm", results["ensure_base_warm"]["warm_s"]),
    ]
    if "ensure_base_cold" in results:
        rows.append(("ensure_base() cold (debootstrap, empty cache)", results["ensure_base_cold"]["cold_s"]))
    width = max(len(label) for label, _ in rows)
    print(f"{'measure':<{width}}  seconds")
    print(f"{'-' * width}  ----------")
    for label, seconds in rows:
        print(f"{label:<{width}}  {seconds:>10.4g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
