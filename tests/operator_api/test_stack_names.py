"""A stack name becomes part of file paths (`Pulumi.<env>.yaml`, the backend's state,
the operator lock), so a name with a path separator or `..` is refused before
anything touches the file system."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from operator_api import REPO, ClusterStack, SettingsRejectedError
from operator_api.cluster_stack import Recovery, RunResult, keys_recorded_on_first_use
from operator_api.events import RunRecord
from operator_cli.cli import main, run_data, run_text

BAD_NAMES = ["../../x", "a/b", "..", "x/../../y", "a\\b", ""]


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_api_refuses_the_name_and_writes_nothing(name: str, project: Path, backend: Path) -> None:
    outside = project.parent
    before = _tree(outside)
    with pytest.raises(SettingsRejectedError, match="is not a stack name") as raised:
        ClusterStack(
            name,
            project_dir=project,
            env_vars={"PULUMI_BACKEND_URL": backend.as_uri(), "PULUMI_CONFIG_PASSPHRASE": "unit-test"},
        )
    assert raised.value.keys == ["stack"]
    assert _tree(outside) == before


def test_the_cli_exits_3_and_leaves_the_backend_alone(
    project: Path, backend: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend.as_uri())
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "unit-test")
    before = _tree(project.parent)
    code = main(["--project-dir", str(project), "--stack", "../../x", "--json", "status"], stdin=io.StringIO(""))
    out = json.loads(capsys.readouterr().out)
    assert code == 3 and out["error"] == "SettingsRejectedError" and "'../../x' is not a stack name" in out["message"]
    assert _tree(project.parent) == before


def test_stack_sh_refuses_it_too(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(REPO / "scripts/stack.sh"), "preview", "--stack", "../../x"],
        capture_output=True,
        text=True,
        env={**os.environ, "PULUMI_CONFIG_PASSPHRASE": "x", "HOME": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 2 and "'../../x' is not a stack name" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_keys_recorded_on_first_use_reach_the_result_and_the_summary() -> None:
    record = RunRecord()
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJs7uk0rUSnm8T1IyiW2eZ4KCvGpKDaNrALiMKlhhVbM"
    record.progress += [
        ("w1", "reading host facts from 198.51.100.7"),
        ("w1", f"recorded SSH host key on first use: {key} (pin it with hk3s:ssh.host_keys.w1)"),
    ]
    recorded = keys_recorded_on_first_use(record)
    assert recorded == {"w1": key}
    result = RunResult("up", {"same": 3}, [], Recovery(), recorded)
    assert run_data(result)["host_keys_recorded"] == {"w1": key}
    assert f"SSH host key of w1 recorded on first use (hk3s:ssh.trust_on_first_use): {key}" in run_text(result)
