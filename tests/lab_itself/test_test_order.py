"""The CI run's module order (lab/test_order.py), on a real pytest run in a subprocess: the
longest recorded module first, an unrecorded one early, each module's tests in their own order,
and the record read back from pytest's own --durations report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lab.test_order import module_seconds

MODULES = {
    "test_short.py": "def test_a():\n    pass\n",
    "test_long.py": "def test_b():\n    pass\n\ndef test_a():\n    pass\n",
    "test_new.py": "def test_c():\n    pass\n",
    "test_middle.py": "def test_z():\n    pass\n",
}


def _order(tmp_path: Path, workers: bool) -> list[str]:
    """The order the modules run in, in one xdist worker (`workers`) or in a plain run."""
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    record = tmp_path / "seconds.json"
    record.write_text(json.dumps({"modules": {"test_short.py": 1.0, "test_long.py": 500.0, "test_middle.py": 90.0}}))
    # The plugin reads its record from MODULE_SECONDS; the run points it at this one.
    (tmp_path / "conftest.py").write_text(
        "import lab.test_order as order\n"
        f"order.MODULE_SECONDS = order.Path({str(record)!r})\n"
        "pytest_plugins = ['lab.test_order']\n"
        "def pytest_runtest_setup(item):\n"
        f"    open({str(tmp_path / 'ran')!r}, 'a').write(item.nodeid + '\\n')\n"
    )
    # One worker: the order it runs in is the order the scheduler hands the modules out.
    spread = ["-n", "1", "--dist", "loadfile", "--no-loadscope-reorder"] if workers else []
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *spread],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return (tmp_path / "ran").read_text().splitlines()


def test_modules_run_longest_first_and_keep_their_tests_in_order(tmp_path: Path) -> None:
    assert _order(tmp_path, workers=True) == [
        "test_new.py::test_c",  # no record: first
        "test_long.py::test_b",
        "test_long.py::test_a",
        "test_middle.py::test_z",
        "test_short.py::test_a",
    ]


def test_a_run_that_does_not_spread_modules_keeps_pytests_order(tmp_path: Path) -> None:
    assert _order(tmp_path, workers=False) == [
        "test_long.py::test_b",
        "test_long.py::test_a",
        "test_middle.py::test_z",
        "test_new.py::test_c",
        "test_short.py::test_a",
    ]


def test_the_record_sums_each_modules_setup_call_and_teardown() -> None:
    report = [
        "============================= slowest durations ==============================",
        "246.74s call     tests/lab/test_a.py::test_one",
        "10.00s setup    tests/lab/test_a.py::test_one",
        "3.50s teardown tests/lab/test_b.py::test_two[x-1]",
        "(1200 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    assert module_seconds(report) == {"tests/lab/test_a.py": 256.7, "tests/lab/test_b.py": 3.5}
