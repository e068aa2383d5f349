"""WorkerRoster: the stack's list of workers, and the removal of the workers that leave it.

Pulumi runs the creates and updates of a run before the deletes of what left the program.
A worker dropped from the stack would therefore first lose its place in its peers' host and
cloud firewalls, and only then reach its own delete: its copies could no longer move to
its peers, nor the server reach its kubelet to drain it. So the roster removes leaving
workers itself, in its update, and the program makes every resource that touches the
cluster (firewalls, the server's k3s, the joins) depend on the roster
(components.program): the peers drop a worker only after its removal finished.

The roster keeps in its state how to log in to each worker (address, port, pinned host key,
the login key, secret), since a leaving worker is no longer in the stack's settings. Its
`check` judges each removal before anything of the run changes, in `preview` and at the
start of `up`: a worker that does not answer over SSH is refused (it may still be running:
fence it first). A fenced worker given up (hk3s:fences.<worker>.force_remove) is deregistered
without a drain instead (node_operations.forced_removal); refused when its fence did not
complete, or when its host is not shown stopped now (it answers and the fence does not hold it
stopped, it refuses the login, or it is silent over SSH while its Node is Ready or its kubelet
answers). Workers leave one
at a time, in name order; a removal cut anywhere resumes on the next `up` (the roster's state
changes only once every removal finished).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from node_operations.firewall_plan import KUBE_API_PORT, KUBELET_PORT, pod_network_port
from node_operations.forced_removal import check_give_up, give_up_worker
from node_operations.refusal import tagged
from node_operations.worker_removal import (
    PeerFirewall,
    RemovalRefusedError,
    not_answering,
    remove_worker,
    worker_answers,
)
from providers.base import progress, resource_inputs, run_operation
from providers.inputs import ResourceInputs, checkable, known, nested
from remote_access.kube import API_WAIT_SECONDS
from remote_access.ssh import SshError, SshTarget


@dataclasses.dataclass(frozen=True, kw_only=True)
class RosterMember(ResourceInputs):
    """Where a node logs in (the login key is the roster's, shared by every node)."""

    node: pulumi.Input[str]
    address: pulumi.Input[str]
    ssh_port: pulumi.Input[int] = 22
    recorded_host_key: pulumi.Input[str | None] = None
    firewall_managed: pulumi.Input[bool] = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerRosterInputs(ResourceInputs):
    """The names of the stack's workers, sorted, and how to reach each node."""

    workers: list[str] = dataclasses.field(default_factory=list)
    server: RosterMember | None = dataclasses.field(default=None, metadata=nested(RosterMember))
    members: list[RosterMember] = dataclasses.field(default_factory=list, metadata=nested(RosterMember))
    ssh_user: pulumi.Input[str] = "root"
    private_key: pulumi.Input[str] | None = None
    longhorn: pulumi.Input[bool] = False
    minimal_available_percent: pulumi.Input[int] = 25
    pod_network: pulumi.Input[str] = "wireguard"
    api_wait_seconds: pulumi.Input[float] = API_WAIT_SECONDS
    forced: list[str] = dataclasses.field(default_factory=list)
    """Fenced workers given up (hk3s:fences.<worker>.force_remove): deregistered without a drain."""

    def target(self, member: RosterMember) -> SshTarget:
        return SshTarget(
            node=str(known(member.node)),
            address=str(known(member.address)),
            port=int(known(member.ssh_port) or 22),
            user=str(known(self.ssh_user) or "root"),
            private_key=str(known(self.private_key)),
            recorded_host_key=known(member.recorded_host_key) or None,
        )

    def member(self, name: str) -> RosterMember | None:
        return next((member for member in self.members if known(member.node) == name), None)


def _logins_readable(props: dict[str, Any]) -> bool:
    """Whether every node's login in `props` is a mapping (a login whose source is being replaced
    reaches a diff as one unknown value, not as a mapping with unknown fields)."""
    members, server = props.get("members") or [], props.get("server")
    return (
        isinstance(members, list)
        and all(isinstance(member, dict) for member in members)
        and (server is None or isinstance(server, dict))
    )


def leaving_workers(old_workers: list[str], new_workers: list[str]) -> list[str]:
    """Workers the new list drops, in the order they are removed."""
    return sorted(set(old_workers) - set(new_workers))


def operator_firewalls(roster: WorkerRosterInputs, leaving: str) -> list[PeerFirewall]:
    """The nodes staying whose firewall the operator runs, with the ports the leaving worker
    was admitted to there (the API on the server; the pod network and kubelet everywhere)."""
    network_port, _purpose = pod_network_port(str(known(roster.pod_network)))
    peers = []
    staying = [roster.server] if roster.server is not None else []
    staying += [m for m in roster.members if known(m.node) != leaving and known(m.node) in roster.workers]
    for member in staying:
        if known(member.firewall_managed) is not False:
            continue
        ports = [f"{network_port}/udp", f"{KUBELET_PORT}/tcp"]
        if member is roster.server:
            ports.insert(0, f"{KUBE_API_PORT}/tcp")
        peers.append(PeerFirewall(str(known(member.node)), tuple(ports)))
    return peers


class WorkerRosterProvider(ResourceProvider):
    """Dynamic provider of `WorkerRoster`: it logs in to leaving workers only."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        # Who leaves is judged from the names alone (the stack's settings): in a preview a
        # member's login may be unknown (a worker's new address) and is not read here. Names
        # not known yet leave the judgement to the check of the `up`, which sees them.
        new_workers, forced = checkable(news, "workers"), checkable(news, "forced")
        if new_workers is None or (forced is None and news.get("forced") is not None):
            return CheckResult(news, [])
        old = WorkerRosterInputs.from_props(olds)
        failures = []
        for name in leaving_workers(old.workers, [str(worker) for worker in new_workers]):
            member = old.member(name)
            if member is None or old.private_key is None:
                problem = (
                    "the stack holds no login for it (recorded by an earlier release): put it back in the stack, "
                    "run up once, then remove it"
                )
            elif name in (forced or []):
                if old.server is None:
                    continue  # no server recorded yet: the update judges it
                wait = checkable(news, "api_wait_seconds")
                try:
                    run_operation(
                        check_give_up(
                            old.target(old.server),
                            old.target(member),
                            api_wait=float(wait if wait is not None else API_WAIT_SECONDS),
                            progress=functools.partial(progress, name),
                        )
                    )
                except RemovalRefusedError as refused:
                    failures.append(CheckFailure("workers", str(refused)))
                except SshError as error:
                    # Whether its fence completed is read on the server: unread, nothing is given up.
                    message = (
                        f"{name}: giving the worker up is refused: whether its fence completed cannot be read from "
                        f"the cluster ({error}). Bring the server's SSH back and run up again. Nothing was changed"
                    )
                    failures.append(CheckFailure("workers", tagged(message, "removal")))
                continue
            else:
                silent = run_operation(worker_answers(old.target(member)))
                problem = not_answering(name, silent) if silent is not None else ""
            if problem:
                message = f"{name}: removing the worker is refused: {problem}. Nothing was changed"
                failures.append(CheckFailure("workers", tagged(message, "removal")))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        if not _logins_readable(news):
            # A node's login is not known yet: the engine weighs replacing the host probe it comes
            # from (a worker's new address), or previews that. The roster is never replaced, and
            # its update, which runs with the login known, stores it.
            return DiffResult(changes=True, replaces=[], delete_before_replace=False)
        old, new = WorkerRosterInputs.from_props(olds), WorkerRosterInputs.from_props(news)
        for name in leaving_workers(old.workers, new.workers):
            progress(
                name,
                "plan: given up (fenced, force_remove): deregistered without a drain, the host left as it is, before "
                "any peer's firewall drops it"
                if name in new.forced
                else "plan: leaves the stack: its copies move off, it is drained, wiped and deregistered, before any "
                "peer's firewall drops it",
            )
        # Any change is stored (a leaving worker's login is read from the state); only a change of
        # the list itself removes anything.
        return DiffResult(changes=old != new, replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="worker-roster", outs=props)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        old, new = WorkerRosterInputs.from_props(olds), WorkerRosterInputs.from_props(news)
        server = new.server or old.server
        leaving = leaving_workers(old.workers, new.workers)
        for name in leaving:
            member = old.member(name)
            if member is None or server is None:
                raise RuntimeError(f"{name}: the stack holds no login for it; put it back in the stack and run up")
            if name in new.forced:
                given_up = give_up_worker(
                    new.target(server),
                    old.target(member),
                    longhorn=bool(known(new.longhorn)),
                    api_wait=float(known(new.api_wait_seconds)),
                    progress=functools.partial(progress, name),
                )
                progress(name, run_operation(given_up))
                continue
            report = run_operation(
                remove_worker(
                    new.target(server),
                    old.target(member),
                    longhorn=bool(known(new.longhorn)),
                    minimal_available_percent=int(known(new.minimal_available_percent)),
                    operator_firewalls=operator_firewalls(new, name),
                    api_wait=float(known(new.api_wait_seconds)),
                    progress=functools.partial(progress, name),
                    also_leaving=leaving,
                )
            )
            for line in report.lines():
                progress(name, line)
        return UpdateResult(outs=news)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class WorkerRoster(Resource, module="hk3s", name="WorkerRoster"):
    """The workers the stack holds; a leaving worker is removed here before anything else changes."""

    workers: pulumi.Output[list[str]]

    def __init__(
        self, resource_name: str, inputs: WorkerRosterInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = resource_inputs(inputs, []) if inputs.private_key is not None else inputs.props()
        super().__init__(WorkerRosterProvider(), resource_name, props, opts)
