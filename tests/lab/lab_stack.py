"""The lab's stack harness lives in lab/stack_harness.py (the benchmarks and the demo use it
too); the lab tests import it from here."""

from lab.stack_harness import (
    BIN,
    CACHE,
    KUBE_BIN_IN_HOST,
    LONGHORN_PACKAGES,
    PARALLEL,
    REPO,
    CliRun,
    LabStack,
    base_config,
    k3s_snapshot,
    k3s_version,
    lab_binaries_missing,
    run_cli,
    run_killable,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)

__all__ = [
    "BIN",
    "CACHE",
    "KUBE_BIN_IN_HOST",
    "LONGHORN_PACKAGES",
    "PARALLEL",
    "REPO",
    "CliRun",
    "LabStack",
    "base_config",
    "k3s_snapshot",
    "k3s_version",
    "lab_binaries_missing",
    "run_cli",
    "run_killable",
    "server_spec",
    "skip_without_lab_binaries",
    "up_or_fail",
    "worker_spec",
]
