"""The API forward outlives the program and serves until the run's Pulumi engine ends, so it must
find that engine (the `pulumi` process above the language host) on every system the
Prerequisites (docs/getting-started-hetzner.md) name: through /proc on Linux, through POSIX `ps` where there is no /proc (macOS).

The process tree is real: a script named `pulumi` (its process is called `pulumi`, as the
engine is) starts Python, which asks for the engine. "macOS" is this machine with /proc
unreadable to the asking process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from remote_access import api_forward
from remote_access.api_forward import ApiForwardError, open_api_forward
from remote_access.ssh import SshTarget

REPO = Path(__file__).resolve().parents[2]

ASK = """
import pathlib
if {hide_proc}:
    # As on macOS: no /proc to read.
    real = pathlib.Path.read_text
    def read_text(self, *args, **kwargs):
        if str(self).startswith("/proc"):
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return real(self, *args, **kwargs)
    pathlib.Path.read_text = read_text
from remote_access.api_forward import engine_pid
print(engine_pid())
"""


def _engine_seen_from_below(tmp_path: Path, hide_proc: bool) -> tuple[int, int]:
    """(the pid of a process called `pulumi`, the engine pid its Python grandchild finds)."""
    engine = tmp_path / "pulumi"
    engine.write_text(
        '#!/bin/sh\necho "$$"\n"$HK3S_PYTHON" -c "$HK3S_ASK"\n',
    )
    engine.chmod(0o755)
    env = {
        **os.environ,
        "HK3S_PYTHON": sys.executable,
        "HK3S_ASK": ASK.format(hide_proc=hide_proc),
        "PYTHONPATH": str(REPO),
    }
    answer = subprocess.run([str(engine)], capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=True)
    engine_pid, found = (int(line) for line in answer.stdout.split())
    return engine_pid, found


@pytest.mark.parametrize("hide_proc", [False, True], ids=["linux-proc", "no-proc-as-on-macos"])
def test_the_forward_finds_the_engine_above_it(tmp_path: Path, hide_proc: bool) -> None:
    engine, found = _engine_seen_from_below(tmp_path, hide_proc)
    assert found == engine


def test_a_system_where_the_engine_cannot_be_found_is_refused_before_any_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neither /proc nor `ps`: a forward tied to the program would die before the engine's
    deletes, so the run is refused with the Prerequisites' sentence instead."""
    monkeypatch.setattr(api_forward, "process_parent_and_name", lambda pid: None)

    def no_forward(*args: object, **kwargs: object) -> None:
        raise AssertionError("no forward may be started")

    monkeypatch.setattr(api_forward.subprocess, "Popen", no_forward)
    monkeypatch.setattr(api_forward, "_serving", lambda port: False)
    target = SshTarget(node="srv", address="192.0.2.1", port=22, user="root", private_key="k")
    with pytest.raises(ApiForwardError) as refused:
        open_api_forward(target, 17999)
    assert api_forward.PLATFORM_SENTENCE in str(refused.value)
    assert "Linux or macOS" in api_forward.PLATFORM_SENTENCE
    page = (REPO / "docs" / "getting-started-hetzner.md").read_text()
    assert api_forward.PLATFORM_SENTENCE in " ".join(page.split())
