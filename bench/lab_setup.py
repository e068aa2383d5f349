"""Cold and warm times of the lab's one set-up command (lab/setup.sh).

    venv/bin/python -m bench.lab_setup --out bench/results/lab_setup.json          # warm only
    venv/bin/python -m bench.lab_setup --cold --out bench/results/lab_setup.json   # cold too (~20 min on 2 cores)

Cold: an empty, temporary HK3S_LAB_CACHE (every Go module downloaded and every
binary compiled again, the host base debootstrapped again); warm: the same
command once everything is cached. Each step's seconds come from the script's
own --timings file, so the table shows where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_setup(cache: Path) -> dict[str, Any]:
    timings = Path(tempfile.mkstemp(suffix=".json")[1])
    started = time.monotonic()
    subprocess.run(
        ["bash", str(REPO / "lab" / "setup.sh"), "--timings", str(timings)],
        cwd=REPO,
        env={**os.environ, "HK3S_LAB_CACHE": str(cache)},
        check=True,
    )
    total = time.monotonic() - started
    steps = json.loads(timings.read_text())
    timings.unlink()
    return {"total_seconds": round(total, 1), "steps": {k: round(float(v), 1) for k, v in steps.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="also time a run on an empty cache (slow)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if args.cold:
        cold_cache = Path(tempfile.mkdtemp(prefix="hk3s-lab-cold-", dir="/var/tmp"))
        try:
            results["cold"] = run_setup(cold_cache)
            results["warm_after_cold"] = run_setup(cold_cache)
        finally:
            shutil.rmtree(cold_cache, ignore_errors=True)
    results["warm"] = run_setup(Path(os.environ.get("HK3S_LAB_CACHE", "/var/cache/hk3s-lab")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'run':<18}{'total s':>10}   steps")
    for name, run in results.items():
        steps = ", ".join(f"{step} {seconds}" for step, seconds in run["steps"].items())
        print(f"{name:<18}{run['total_seconds']:>10}   {steps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
