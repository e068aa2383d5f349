"""A CI run keeps no state on its runner: with CI set and a `file://` backend (the default
when PULUMI_BACKEND_URL is unset) the API and the CLI refuse before anything is created,
naming the variable and the fix; HK3S_ALLOW_LOCAL_STATE=1 lets a runner that keeps its disk
go on. No engine runs: the refusal comes before the stack is selected."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from operator_api import ClusterStack
from operator_api.errors import StackError
from operator_api.workspace import check_backend_lasts
from operator_cli.cli import main


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_a_ci_run_on_a_local_file_backend_is_refused_and_nothing_is_written(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "runner-home"))
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    before = _tree(tmp_path)
    api = ClusterStack("dev", project_dir=project, env_vars={"PULUMI_CONFIG_PASSPHRASE": "unit-test"})
    with pytest.raises(StackError) as raised:
        api.preview()
    message = str(raised.value)
    assert "this is a CI run (CI is set)" in message and "/runner-home/.hk3s-state" in message
    assert "Set PULUMI_BACKEND_URL to a shared backend" in message and "HK3S_ALLOW_LOCAL_STATE=1" in message
    assert _tree(tmp_path) == before


def test_the_cli_stops_naming_the_fix(
    project: Path, backend: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend.as_uri())
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "unit-test")
    code = main(["--project-dir", str(project), "--stack", "dev", "--json", "preview"], stdin=io.StringIO(""))
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["error"] == "StackError", out
    assert "PULUMI_BACKEND_URL to a shared backend" in out["message"]
    assert list(backend.iterdir()) == []


def test_a_runner_that_keeps_its_disk_may_say_so(project: Path, backend: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("HK3S_ALLOW_LOCAL_STATE", "1")
    check_backend_lasts({"PULUMI_BACKEND_URL": backend.as_uri()})
    check_backend_lasts({"PULUMI_BACKEND_URL": "s3://state?region=eu-central-1", "HK3S_ALLOW_LOCAL_STATE": "0"})
    monkeypatch.delenv("CI")
    check_backend_lasts({"PULUMI_BACKEND_URL": backend.as_uri(), "HK3S_ALLOW_LOCAL_STATE": "0"})
