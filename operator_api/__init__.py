"""Drive this program's stacks from other programs: a Python API on `pulumi.automation`.

    from operator_api import ClusterStack

    stack = ClusterStack("staging")
    stack.add_worker("metal-2", address="198.51.100.21", holds_copies=False, on_output=print)
    for node in stack.nodes():
        print(node.name, node.role, node.state)

See docs/python-api.md and docs/cli.md.
"""

from .cluster_stack import REPO, ClusterStack, Preview, Recovery, RunResult
from .errors import (
    DuplicateWorkerError,
    LockHolder,
    MaintenanceError,
    RefusedError,
    ResourceFailedError,
    ResourceProblem,
    RunFailedError,
    SettingsRejectedError,
    StackBusyError,
    StackError,
    TeardownNotConfirmedError,
    UnknownWorkerError,
    WorkloadStartRefusedError,
)
from .events import PlannedChange, RunRecord
from .locks import UnlockReport
from .nodes import ClusterStatus, DiskCheck, DownWorker, HostCheck, LastRun, Node, StrandedWorkload
from .s3_backend import BackendError
from .stack_file import StackDocument, StackFile
from .state_backend import Checkpoint, StateBackend

__all__ = [
    "REPO",
    "BackendError",
    "Checkpoint",
    "ClusterStack",
    "ClusterStatus",
    "DiskCheck",
    "DownWorker",
    "DuplicateWorkerError",
    "HostCheck",
    "LastRun",
    "LockHolder",
    "MaintenanceError",
    "Node",
    "PlannedChange",
    "Preview",
    "Recovery",
    "RefusedError",
    "ResourceFailedError",
    "ResourceProblem",
    "RunFailedError",
    "RunRecord",
    "RunResult",
    "SettingsRejectedError",
    "StackBusyError",
    "StackDocument",
    "StackError",
    "StackFile",
    "StateBackend",
    "StrandedWorkload",
    "TeardownNotConfirmedError",
    "UnknownWorkerError",
    "UnlockReport",
    "WorkloadStartRefusedError",
]
