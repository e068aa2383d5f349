"""What the operator API reads or opens on the cluster itself, through the server's SSH session:
each node's state now, the workloads stranded on a worker that stopped reporting, and the
forward to the Kubernetes API for the runs that do not start the program (refresh, destroy, and
the refresh that clears an interrupted run)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence

from cluster_settings import SettingProblem
from cluster_settings.models import StackSettings
from node_operations import stranded
from node_operations.health import live_state, read_nodes
from node_operations.reboot import RebootRefusedError, RebootReport, reboot_worker
from node_operations.stranded import read_cluster
from node_operations.workload_start import WorkloadRef, held_running_through, start_workload_through
from node_operations.workload_start import WorkloadStartRefusedError as StartRefused
from remote_access.api_forward import forward_port, open_api_forward
from remote_access.kube import NodeStatus
from remote_access.ssh import SshError, SshTarget

from .errors import (
    MaintenanceError,
    SettingsRejectedError,
    StackError,
    UnknownWorkerError,
    WorkloadStartRefusedError,
)
from .nodes import DownWorker, Node, StrandedWorkload
from .stack_file import WORKERS_KEY


def server_target(settings: StackSettings, targets: Sequence[SshTarget]) -> SshTarget | None:
    """The server's login as the state records it, if it does."""
    return next((target for target in targets if target.node == settings.server.name), None)


def with_live_states(nodes: list[Node], settings: StackSettings, targets: Sequence[SshTarget]) -> list[Node]:
    """`nodes` with `state` and `k3s_version` read from the cluster now (`recorded_state` keeps
    the last run's); when the server cannot be asked, as they were, with `live_error` set."""
    server = server_target(settings, targets)
    try:
        if server is None:
            raise SshError(settings.server.name, "the stack records no login for the server")
        cluster = asyncio.run(read_nodes(server, settings.cluster.api_wait_seconds))
    except SshError as error:
        return [dataclasses.replace(node, live_error=str(error)) for node in nodes]
    return _live(nodes, cluster)


def _live(nodes: list[Node], cluster: Mapping[str, NodeStatus]) -> list[Node]:
    return [
        dataclasses.replace(
            node,
            state=live_state(cluster.get(node.name)),
            recorded_state=node.state,
            k3s_version=cluster[node.name].kubelet_version if node.name in cluster else node.k3s_version,
        )
        for node in nodes
    ]


def live_status(
    nodes: list[Node], settings: StackSettings, targets: Sequence[SshTarget]
) -> tuple[list[Node], list[DownWorker], str | None]:
    """For `status`: `nodes` with their states now, each worker NotReady and not fenced with the
    workloads stranded on it (node_operations/stranded.py), and why the cluster could not be
    asked (None when it was; the nodes then keep their recorded states)."""
    server = server_target(settings, targets)
    workers = [node.name for node in nodes if node.role == "worker"]
    try:
        if server is None:
            raise SshError(settings.server.name, "the stack records no login for the server")
        cluster, down = asyncio.run(read_cluster(server, workers, settings.cluster.api_wait_seconds))
    except SshError as error:
        return [dataclasses.replace(node, live_error=str(error)) for node in nodes], [], str(error)
    return _live(nodes, cluster), [_down_worker(worker) for worker in down], None


def held_running_now(settings: StackSettings, targets: Sequence[SshTarget], stack: str) -> list[str]:
    """For `status`: each workload a fence holds stopped that runs anyway (node_operations/
    fence_holds.py); when the server cannot be asked, a line saying so."""
    server = server_target(settings, targets)
    if server is None:
        return []
    try:
        return asyncio.run(held_running_through(server, stack, settings.cluster.api_wait_seconds))
    except SshError as error:
        return [f"whether a workload a fence holds stopped runs anyway could not be read: {error}"]


def _down_worker(worker: stranded.DownWorker) -> DownWorker:
    return DownWorker(
        name=worker.name,
        command=worker.command,
        advice=worker.advice(),
        stranded=[
            StrandedWorkload(
                worker=item.worker,
                workload=item.workload,
                pods=list(item.pods),
                current_copies={volume.volume: list(volume.current_on) for volume in item.volumes},
                verdict=item.verdict,
                line=item.line(),
            )
            for item in worker.workloads
        ],
    )


@contextlib.contextmanager
def api_forward_during(
    settings: StackSettings | None,
    targets: Sequence[SshTarget],
    project: str,
    stack: str,
    say: Callable[[str], None],
) -> Iterator[None]:
    """While a run that does not start the program goes on, the forward the Kubernetes provider's
    recorded kubeconfig points at (remote_access.api_forward). Opened only where the program
    installs Longhorn (the only user of that provider) and the state records the server; a
    server that does not answer is said, not fatal (the run then names what it could not reach).
    No settings (a stack file the run will refuse anyway): none."""
    server = server_target(settings, targets) if settings is not None else None
    if settings is None or not settings.storage.install_longhorn or server is None:
        yield
        return
    port = settings.cluster.api_forward_port or forward_port(project, stack)
    try:
        forward = open_api_forward(server, port)
    except SshError as error:
        say(f"no forward to the Kubernetes API on 127.0.0.1:{port}: {error}")
        yield
        return
    try:
        yield
    finally:
        forward.close()


def check_rebootable(settings: StackSettings, name: str, action: str) -> None:
    """Refused before anything: a name that is no worker of the stack, or a worker the stack file
    fences. A fence recorded on the Node refuses it too, read by the reboot itself
    (node_operations.reboot): the record outlives the file's entry until the lift runs."""
    names = [worker.name for worker in settings.all_workers()]
    if name not in names:
        listed = ", ".join(names) or "none"
        raise UnknownWorkerError(
            [SettingProblem(WORKERS_KEY, f"there is no worker named {name!r} (workers: {listed})")], action=action
        )
    if name in settings.fences:
        raise SettingsRejectedError(
            [SettingProblem(f"hk3s:fences.{name}", f"{name} is fenced: it comes back by a rejoin, not a reboot")],
            action=action,
        )


def reboot(
    settings: StackSettings,
    targets: Sequence[SshTarget],
    name: str,
    *,
    drain_timeout: float,
    ready_timeout: float,
    say: Callable[[str], None],
) -> RebootReport:
    """One worker's reboot through the server (node_operations.reboot), its failures as the
    API's `MaintenanceError`."""
    by_node = {target.node: target for target in targets}
    if name not in by_node or settings.server.name not in by_node:
        raise StackError(f"{name} has not joined yet: run up first")
    try:
        return asyncio.run(
            reboot_worker(
                by_node[settings.server.name],
                by_node[name],
                api_wait=settings.cluster.api_wait_seconds,
                drain_timeout=drain_timeout,
                ready_timeout=ready_timeout,
                progress=say,
                longhorn_minimal_available=(
                    settings.storage.minimal_available_percent if settings.storage.install_longhorn else None
                ),
            )
        )
    except RebootRefusedError as error:
        raise MaintenanceError(name, str(error), put_back=error.put_back) from None
    except SshError as error:
        raise MaintenanceError(
            name,
            f"{error}; if {name} was cordoned for the reboot it stays so: reboot it again to finish",
            put_back=False,
        ) from None


def check_probed_disk(settings: StackSettings, name: str, action: str) -> None:
    """Refuse a disk check of a worker the stack does not hold, or of one that holds no copies
    (it has no disk probe)."""
    workers = settings.all_workers()
    names = [worker.name for worker in workers]
    if name not in names:
        raise UnknownWorkerError(
            [
                SettingProblem(
                    WORKERS_KEY,
                    f"there is no worker named {name!r} in {WORKERS_KEY} (workers: {', '.join(names) or 'none'})",
                )
            ],
            action=action,
        )
    worker = workers[names.index(name)]
    if not worker.holds_copies:
        raise SettingsRejectedError(
            [
                SettingProblem(
                    f"{settings.worker_config_key(worker)}.holds_copies",
                    f"{name} holds no volume copies (holds_copies: false), so it has no disk probe; set "
                    "holds_copies: true and run up, which probes its disk at the end",
                )
            ],
            action=action,
        )


def start_workload(
    settings: StackSettings,
    targets: Sequence[SshTarget],
    ref: WorkloadRef,
    *,
    accept_stale_data: bool,
    say: Callable[[str], None],
) -> str:
    """Start one workload a fence stopped, through the server (node_operations.workload_start);
    a refusal as the API's `WorkloadStartRefusedError`."""
    server = server_target(settings, targets)
    if server is None:
        raise StackError(f"the stack records no login for the server {settings.server.name}: run up first")
    try:
        return asyncio.run(
            start_workload_through(
                server,
                ref,
                accept_stale_data=accept_stale_data,
                api_wait=settings.cluster.api_wait_seconds,
                progress=say,
            )
        )
    except StartRefused as error:
        raise WorkloadStartRefusedError(str(error)) from None
    except SshError as error:
        raise StackError(f"{ref} was not started: {error}; run the same command again") from None
