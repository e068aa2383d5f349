"""The README's no-Hetzner command, run exactly as a newcomer runs it: `scripts/demo.sh up`
boots a server and two workers on the lab, joins them through the operator CLI and the
real Pulumi engine, and shows them; `scripts/demo.sh down` leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lab.hosts import DEFAULT_RUN_ROOT, all_lab_dirs
from lab.stack_harness import REPO, skip_without_lab_binaries

pytestmark = pytest.mark.lab


def _demo(command: str, demo_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HK3S_DEMO_DIR": str(demo_dir)}
    return subprocess.run(
        ["bash", "scripts/demo.sh", command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_the_demo_joins_two_workers_and_removes_everything(tmp_path: Path) -> None:
    skip_without_lab_binaries()
    demo_dir = tmp_path / "demo"
    labs_before = {path.name for path in all_lab_dirs(DEFAULT_RUN_ROOT)}
    try:
        up = _demo("up", demo_dir)
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        listed = up.stdout.split("$ scripts/hk3s --stack demo node list", 1)[1]
        rows = {line.split()[0]: line.split() for line in listed.splitlines()[2:5]}
        # `node list` shows each node's state in the cluster now (the server's Node too).
        assert rows["demo-server"][1:3] == ["server", "Ready"], listed
        assert rows["demo-worker-1"][1:3] == ["worker", "Ready"] and rows["demo-worker-2"][1:3] == ["worker", "Ready"]
        # The demo's workers joined over the private network: each shows the private address it uses.
        headers = listed.splitlines()[1].split()
        for name in ("demo-worker-1", "demo-worker-2"):
            row = dict(zip(headers, rows[name], strict=False))
            assert row["NETWORK"] == "private" and row["PRIVATE"].count(".") == 3, listed
        assert "$ scripts/hk3s --stack demo status" in up.stdout and "Pending ops:  0" in up.stdout
        # The progress of the joins reached the terminal.
        assert "[demo-worker-1] joined and released" in up.stdout + up.stderr
        # A second up is refused until the first is removed.
        again = _demo("up", demo_dir)
        assert again.returncode == 1 and "scripts/demo.sh down" in again.stderr
        demo_lab = json.loads((demo_dir / "demo.json").read_text())["lab_id"]
        assert demo_lab not in labs_before
    finally:
        down = _demo("down", demo_dir)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not demo_dir.exists()
    # The demo's lab is gone (other labs may come and go on the machine meanwhile).
    assert demo_lab not in {path.name for path in all_lab_dirs(DEFAULT_RUN_ROOT)}
