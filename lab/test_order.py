"""The order the suite's modules run in: the longest first (LAB ONLY: the CI run's wall time).

scripts/test.sh runs three modules side by side (pytest-xdist, ``--dist loadfile``), handing the
next module to a worker as it nears the end of its current one. Run in the order xdist picks by
itself (most tests first), the lab's long single-test modules come last, and the run ends with
one worker still in a four-minute module while the others have nothing left: the longest-first
order (the classic LPT schedule) keeps every worker busy until close to the end. scripts/test.sh
passes ``--no-loadscope-reorder`` so xdist keeps the order given here.

Each module's weight is what it cost in a recorded CI run (MODULE_SECONDS): its wall time where
pytest's ``--durations=0`` report gave it (``python -m lab.test_order LOG``), else its CPU seconds
from the run's CPU profile (``python -m lab.test_order PROFILE.json``, written by
``HK3S_CPU_PROFILE=FILE scripts/test.sh``), which ranks the lab modules nearly as their wall time
does. A module not in the record (a new one, whose cost nobody has measured) starts first, so a long
one never ends the run. Tests
within a module keep their order: a module's tests share its cluster and run in sequence.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

MODULE_SECONDS = Path(__file__).resolve().parent.parent / "bench" / "results" / "module_seconds.json"
# A module without a record: before every recorded one.
UNRECORDED_SECONDS = float("inf")
_DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::")


def recorded_seconds(path: Path | None = None) -> dict[str, float]:
    try:
        data = json.loads((path or MODULE_SECONDS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("modules", {}).items()}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """`items` regrouped by module, the modules by descending weight (ties: collection order)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(modules, key=lambda module: -seconds.get(module, UNRECORDED_SECONDS))
    return [item for module in order for item in modules[module]]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only in an xdist worker, whose collection order the scheduler hands out (xdist resets the
    # worker's own --dist to "no"); a run without workers keeps pytest's order.
    if hasattr(config, "workerinput"):
        items[:] = longest_first(items, recorded_seconds())


def module_seconds(log_lines: list[str]) -> dict[str, float]:
    """Each module's wall time (setup + call + teardown of its tests) from pytest's
    ``--durations=0`` report."""
    seconds: dict[str, float] = defaultdict(float)
    for line in log_lines:
        if match := _DURATION.match(line):
            seconds[match.group(2)] += float(match.group(1))
    return {module: round(value, 1) for module, value in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lab.test_order LOG|PROFILE.json  (see lab/test_order.py)", file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(errors="replace")
    if argv[0].endswith(".json"):
        profile = json.loads(text)["test_modules_cpu_seconds"]
        seconds = {module: round(float(value), 1) for module, value in sorted(profile.items())}
        what = "each test module's CPU seconds in one CI run's CPU profile (lab/test_order.py)"
    else:
        seconds = module_seconds(text.splitlines())
        what = "each test module's wall time in one CI run (lab/test_order.py)"
    record = {"what": what, "modules": seconds}
    MODULE_SECONDS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"{len(seconds)} modules written to {MODULE_SECONDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
