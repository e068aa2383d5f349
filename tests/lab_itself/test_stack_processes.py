"""The suite's end finds the processes its stacks left running and ends them
(lab/stack_processes.py, lab/pytest_fixtures.end_leftover_processes), on this machine's real
processes: those that work in a stack's directory, name it on their command line, or carry its
Pulumi home or backend in their environment; never a process of a directory beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.pytest_fixtures import LeftoverProcessWarning, end_leftover_processes
from lab.stack_processes import processes_under

SLEEP = "import time; time.sleep(300)"
# Ignores SIGTERM, as a process stuck in an operation may: only SIGKILL ends it.
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def test_the_processes_of_a_stack_directory_are_found_and_ended(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    stack, beside = tmp_path / "stack", tmp_path / "stack-2"
    for directory in (stack / "project", beside / "project"):
        directory.mkdir(parents=True)

    def start(code: str, cwd: Path, *args: str, **env: str) -> int:
        process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, env={**os.environ, **env})
        started.append(process)
        return process.pid

    in_project = start(DEAF, stack / "project")
    naming = start(SLEEP, tmp_path, f"--state={stack}/state")
    by_home = start(SLEEP, tmp_path, PULUMI_HOME=str(stack / "pulumi-home"))
    by_backend = start(SLEEP, tmp_path, PULUMI_BACKEND_URL=(stack / "state").as_uri())
    # Another session's stack beside this one (its name starts with this one's), and a variable
    # that is no stack's: left alone.
    neighbours = [
        start(SLEEP, beside / "project"),
        start(SLEEP, tmp_path, f"--state={beside}/state"),
        start(SLEEP, tmp_path, PULUMI_HOME=str(beside / "pulumi-home")),
        start(SLEEP, tmp_path, HK3S_NOTES=str(stack)),
    ]

    found = {process.pid: process.belongs_by for process in processes_under(stack)}
    assert found == {
        in_project: "working directory",
        naming: "command line",
        by_home: "environment",
        by_backend: "environment",
    }

    with pytest.warns(LeftoverProcessWarning) as warned:
        ended = end_leftover_processes(stack)
    assert {process.pid for process in ended} == set(found)
    message = str(warned[0].message)
    assert all(f"{pid} python" in message for pid in found), message
    assert "still running after SIGKILL" not in message
    for process in started:
        if process.pid in found:
            process.wait(timeout=10)  # reaped: ended, the one deaf to SIGTERM too
    assert all(process.poll() is None for process in started if process.pid in neighbours)
    assert processes_under(stack) == []


def test_a_session_whose_stacks_left_nothing_warns_nothing(tmp_path: Path) -> None:
    (tmp_path / "stack" / "project").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert end_leftover_processes(tmp_path / "stack") == []
