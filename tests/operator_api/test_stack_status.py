"""`status` reads a real stack (a real Pulumi CLI and a file backend, no host): the exported
state is read once per call, whether or not it checks the hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.stack_harness import CACHE, skip_without_lab_binaries
from operator_api import ClusterStack


def test_status_exports_the_state_once(project: Path, backend: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without_lab_binaries()
    api = ClusterStack(
        "dev",
        project_dir=project,
        env_vars={"PULUMI_BACKEND_URL": backend.as_uri(), "PULUMI_CONFIG_PASSPHRASE": "unit-test"},
        pulumi_command_root=CACHE,
    )
    api._stack()  # creates the (empty) stack, as the first up would
    exports: list[str] = []
    real_export = auto.Stack.export_stack

    def counted(stack: auto.Stack) -> auto.Deployment:
        exports.append(stack.name)
        return real_export(stack)

    monkeypatch.setattr(auto.Stack, "export_stack", counted)
    status = api.status(check_hosts=True)
    assert exports == ["dev"], exports
    assert status.stack == "dev" and status.pending_operations == [] and status.host_checks == []
