"""A project directory of its own per test: Pulumi.yaml and an example stack file whose
key points at a real file, so validation passes on the untouched config."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from operator_api import REPO, ClusterStack


def example_text(env: str, key_file: Path) -> str:
    text = (REPO / f"Pulumi.{env}.yaml").read_text()
    return text.replace("private_key_file: ~/.ssh/id_ed25519", f"private_key_file: {key_file}")


@pytest.fixture
def project(tmp_path: Path, ssh_key_file: Path) -> Path:
    directory = tmp_path / "project"
    directory.mkdir()
    shutil.copy(REPO / "Pulumi.yaml", directory / "Pulumi.yaml")
    for env in ("dev", "staging"):
        (directory / f"Pulumi.{env}.yaml").write_text(example_text(env, ssh_key_file))
    return directory


@pytest.fixture
def backend(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir()
    return directory


@pytest.fixture
def api(project: Path, backend: Path) -> ClusterStack:
    return ClusterStack(
        "dev",
        project_dir=project,
        env_vars={"PULUMI_BACKEND_URL": backend.as_uri(), "PULUMI_CONFIG_PASSPHRASE": "unit-test"},
    )


@pytest.fixture
def running_pulumi(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose name is `pulumi`, as a running CLI's is."""
    binary = tmp_path / "bin" / "pulumi"
    binary.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    process = subprocess.Popen([str(binary), "300"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()
