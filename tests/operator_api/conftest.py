"""The operator API on a project directory of its own per test (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from operator_api import ClusterStack


@pytest.fixture
def api(project: Path, backend: Path) -> ClusterStack:
    return ClusterStack(
        "dev",
        project_dir=project,
        env_vars={"PULUMI_BACKEND_URL": backend.as_uri(), "PULUMI_CONFIG_PASSPHRASE": "unit-test"},
    )
