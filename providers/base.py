"""What every dynamic provider of this program shares.

Providers are thin: `check` validates and normalises inputs, `diff` says what
updates and what replaces, CRUD calls `node_operations`. Nothing that cannot be
pickled (clients, sockets, `pulumi.Config`) is kept on a provider: the engine
pickles it with dill into the state and unpickles it in the provider process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import sys
import threading
import traceback
from collections.abc import Callable, Coroutine, Hashable, Iterable, Mapping
from contextvars import ContextVar
from types import ModuleType
from typing import Any, TypeVar

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, DiffResult, ResourceProvider, UpdateResult

from cluster_settings.dns_names import DNS_1123_LABEL
from node_operations.network_mode import NetworkRefusedError
from node_operations.refusal import tagged
from node_operations.teardown import WipeError
from providers.engine_watch import exit_with_the_engine
from providers.inputs import NodeLogin, ResourceInputs, checkable, is_known, known
from remote_access.session_pool import share_logins_on
from remote_access.ssh import SshError, SshTarget

T = TypeVar("T")


class CapabilityMissingError(RuntimeError):
    """The operation belongs to a capability this release does not have yet."""

    def __init__(self, node: str, action: str, capability: str) -> None:
        super().__init__(
            tagged(
                f"{node}: {action} is not available in this release: {capability}. "
                "Nothing was changed on the host; `pulumi preview` shows the plan, `pulumi up` cannot "
                "complete this step until the capability lands.",
                "capability-missing",
            )
        )


# The errors the program raises on purpose (a refused config or network mode, a failed check,
# a host that cannot be reached, a join stopped at a phase, a capability not in this release):
# their message is complete (host, what happened, the fix), so the person running `pulumi up`
# sees the message alone. Any other exception is a bug and keeps its traceback.
PROGRAM_ERRORS: list[type[BaseException]] = [
    NetworkRefusedError,
    SshError,
    CapabilityMissingError,
    WipeError,
]

# Program errors of modules a provider process imports only when it uses them (the settings
# models, the join): an instance exists only once its module is imported, so these are
# looked up in sys.modules when an error is judged, and never imported for it.
LAZY_PROGRAM_ERRORS = (("cluster_settings.loading", "SettingsError"), ("node_operations.join", "JoinError"))

E = TypeVar("E", bound=type[BaseException])


def program_error(cls: E) -> E:
    """Class decorator: errors of this class are presented as their message alone."""
    PROGRAM_ERRORS.append(cls)
    return cls


def is_program_error(error: BaseException) -> bool:
    """Whether `error` is one of the program's own errors (PROGRAM_ERRORS, LAZY_PROGRAM_ERRORS)."""
    if isinstance(error, tuple(PROGRAM_ERRORS)):
        return True
    for module_name, class_name in LAZY_PROGRAM_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(error, getattr(module, class_name)):
            return True
    return False


def format_provider_error(error: BaseException) -> str:
    """What the engine shows for an exception a provider raised: a program error's message
    alone, anything else with its full traceback (so bugs stay diagnosable)."""
    if is_program_error(error):
        return str(error)
    return "".join(traceback.format_exception(error))


class _HostTraceback(ModuleType):
    """Stands in for the `traceback` module inside Pulumi's dynamic-provider host, whose gRPC
    methods report every exception as `traceback.format_exc()` (pulumi/dynamic/__main__.py,
    `_abort_with_traceback`). Only `format_exc` differs; every other name is the real module's."""

    def __init__(self) -> None:
        super().__init__("traceback")

    def __getattr__(self, name: str) -> Any:
        return getattr(traceback, name)

    @staticmethod
    def format_exc(limit: int | None = None, chain: bool = True) -> str:
        error = sys.exception()
        if error is None or not is_program_error(error):
            return traceback.format_exc(limit, chain)
        return format_provider_error(error)


def present_program_errors(host: ModuleType | None) -> bool:
    """Make the dynamic-provider host report the program's own errors as their message alone.

    Why this is safe: it changes only the text of the gRPC error the host sends for an
    exception already raised; the status code, and so the engine's handling (the operation
    failed), stay as they were. It applies per exception (`sys.exception()` is the
    exception the reporting thread handles, so concurrent operations on the host's worker
    threads never see each other's), only to the classes in PROGRAM_ERRORS, and everything
    else keeps `traceback.format_exc()`'s full output. It touches nothing but the host
    module's own name `traceback`, and only when that module is the SDK's host
    (`python -m pulumi.dynamic`) still formatting through the real traceback module: if a
    future SDK formats otherwise, nothing is replaced and errors simply keep tracebacks.
    """
    spec = getattr(host, "__spec__", None)
    if host is None or spec is None or spec.name != "pulumi.dynamic.__main__":
        return False
    if getattr(host, "traceback", None) is not traceback or not hasattr(host, "_abort_with_traceback"):
        return False
    setattr(host, "traceback", _HostTraceback())  # noqa: B010 - the host module's global, looked up at each report
    return True


# The host imports this module when it unpickles the first provider (before any of its
# methods run), so the replacement is in place for every operation, and the process ends
# with its engine from then on (providers/engine_watch.py).
present_program_errors(sys.modules.get("__main__"))
exit_with_the_engine(sys.modules.get("__main__"))


def progress(node: str, message: str) -> None:
    """A progress line. Dynamic providers have no per-resource log channel, so
    every line is prefixed with the node it is about."""
    print(f"[{node}] {message}", file=sys.stderr, flush=True)


_OPERATIONS_LOOP: asyncio.AbstractEventLoop | None = None
_OPERATIONS_LOOP_LOCK = threading.Lock()


def _operations_loop() -> asyncio.AbstractEventLoop:
    """The provider process's one event loop, running in a thread of its own for as long as
    the process lives, with a pool of shared logins (remote_access.session_pool): the
    operations of a run that touch the same host reuse one SSH connection."""
    global _OPERATIONS_LOOP  # noqa: PLW0603 - one loop per process, made on first use
    with _OPERATIONS_LOOP_LOCK:
        if _OPERATIONS_LOOP is None:
            loop = asyncio.new_event_loop()
            share_logins_on(loop)
            threading.Thread(target=loop.run_forever, name="hk3s-operations", daemon=True).start()
            _OPERATIONS_LOOP = loop
        return _OPERATIONS_LOOP


def run_operation(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run an async operation from a provider method and return its result (or raise its
    error). The engine calls provider methods on several gRPC worker threads at once; their
    operations all run, side by side, on the process's one loop, each in a copy of its
    calling thread's context."""
    loop = _operations_loop()
    context = contextvars.copy_context()
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def settle(task: asyncio.Task[T]) -> None:
        if task.cancelled():
            outcome.cancel()
        elif (error := task.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(task.result())

    def start() -> None:
        loop.create_task(coroutine, context=context).add_done_callback(settle)

    loop.call_soon_threadsafe(start)
    return outcome.result()


def ssh_target(props: NodeLogin | Mapping[str, Any], recorded_host_key: str | None = None) -> SshTarget:
    """The SSH target a node-facing resource's inputs describe."""
    if isinstance(props, NodeLogin):
        return SshTarget(
            node=str(known(props.node)),
            address=str(known(props.address)),
            port=int(known(props.ssh_port) or 22),
            user=str(known(props.ssh_user) or "root"),
            private_key=str(known(props.private_key)),
            recorded_host_key=recorded_host_key or known(props.recorded_host_key) or None,
        )
    return SshTarget(
        node=str(props["node"]),
        address=str(props["address"]),
        port=int(props.get("ssh_port") or 22),
        user=str(props.get("ssh_user") or "root"),
        private_key=str(props["private_key"]),
        recorded_host_key=recorded_host_key or props.get("recorded_host_key") or None,
    )


def other_node(login: NodeLogin, node: Any, address: Any, port: Any, host_key: Any) -> SshTarget:
    """Another node's SSH target: same user and key as this node's, its own address and pinned key."""
    return dataclasses.replace(
        ssh_target(login),
        node=str(node),
        address=str(address),
        port=int(port or 22),
        recorded_host_key=host_key or None,
    )


def check_connection_inputs(news: Mapping[str, Any]) -> list[CheckFailure]:
    """Validate the inputs shared by node-facing resources (unknowns pass: `checkable`)."""
    failures: list[CheckFailure] = []
    node = checkable(news, "node")
    if isinstance(node, str) and not DNS_1123_LABEL.match(node):
        failures.append(CheckFailure("node", f"{node!r} is not a DNS-1123 node name"))
    for name in ("node", "address", "private_key"):
        if name in news and news[name] in (None, ""):
            failures.append(CheckFailure(name, f"{name} is required to reach the host"))
    port = checkable(news, "ssh_port")
    if isinstance(port, (int, float)) and not 0 < int(port) < 65536:
        failures.append(CheckFailure("ssh_port", f"{port} is not a TCP port"))
    return failures


def pin_recorded_host_key(olds: Mapping[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """Carry the host key recorded on first use into later runs, unless the stack
    config now records one explicitly (which is how an operator accepts a new key)."""
    if not news.get("recorded_host_key") and olds.get("host_key") and olds.get("address") == news.get("address"):
        news["recorded_host_key"] = olds["host_key"]
    return news


def diff_inputs(
    olds: Mapping[str, Any],
    news: Mapping[str, Any],
    *,
    replace_on: Iterable[str],
    ignore: Iterable[str] = (),
) -> DiffResult:
    """Compare inputs: a change in a `replace_on` key replaces, any other updates."""
    skipped = {"__provider", *ignore}
    keys = (set(olds) | set(news)) - skipped
    changed = sorted(key for key in keys if key in news and olds.get(key) != news.get(key))
    replaces = [key for key in changed if key in set(replace_on)]
    return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=bool(replaces))


def resource_inputs(typed: ResourceInputs, outputs: Iterable[str], secrets: Iterable[str] = ()) -> dict[str, Any]:
    """A node-facing resource's inputs as the engine stores them: the private key (and
    `secrets`) wrapped as secrets, and every output declared (as None) so it becomes an
    attribute of the resource."""
    props = typed.props()
    inputs: dict[str, Any] = {**props, **{name: None for name in outputs}}
    for name in ("private_key", *secrets):
        inputs[name] = pulumi.Output.secret(props[name])
    return inputs


# Inputs that only the state keeps, never a reason to act on a host: the login key (its
# rotation is NodeLoginKey's work) and whether a teardown may wipe the node (read by delete).
STATE_ONLY_INPUTS = ("private_key", "teardown_allowed")


def state_only_change(
    provider: ResourceProvider, id_: str, olds: Mapping[str, Any], news: Mapping[str, Any]
) -> UpdateResult | None:
    """The update for a change of state-only inputs alone (hk3s:ssh.private_key_file rotated,
    hk3s:cluster.teardown set): the state keeps the new values, and nothing runs on any host.
    None when anything else changed too (by the provider's own diff), so the provider's real
    update runs."""
    changed = [
        key
        for key in STATE_ONLY_INPUTS
        if key in news and olds.get(key) != news.get(key) and (key != "private_key" or key in olds)
    ]
    if not changed:
        return None
    if provider.diff(id_, dict(olds), {**news, **{key: olds.get(key) for key in changed}}).changes:
        return None
    outs = dict(olds)
    outs.update({key: value for key, value in news.items() if value is not None and key != "__provider"})
    return UpdateResult(outs=outs)


# The answers hosts gave during the update running on this thread (None outside an update).
# A ContextVar, not provider state: the SDK's host shares one provider object between the
# threads that update several resources at once.
_UPDATE_ANSWERS: ContextVar[dict[Hashable, Any] | None] = ContextVar("update_answers", default=None)


def asked_once_per_update(question: Hashable, ask: Callable[[], T]) -> T:
    """`ask()`; within one update, the answer it gave the first time `question` was asked.

    An update may run its provider's diff more than once (the state-only guard's, then the
    provider's own question of what else changed), and a diff that asks a host over SSH would
    log in each time for the same answer. Outside an update (the engine's diff) it always asks."""
    answers = _UPDATE_ANSWERS.get()
    if answers is None:
        return ask()
    if question not in answers:
        answers[question] = ask()
    return answers[question]


# Whether this run runs each node's join again (node -> True or False), as the engine's diff of
# the join (providers.node_join) in this provider process judged it. What runs after every run of
# the join (the disk probe, the Longhorn node role) takes the join's `join_run`, an output: in a
# preview it is unknown whenever the join updates, since a dynamic provider has no preview of its
# update (the engine hands the new inputs back as its outputs), though most updates of a joined
# worker do not run the join (labels and taints set through the API, a release K3sUpgrade moved, a
# new login key stored). Their diffs read this to plan exactly what the up does: the engine diffs
# them after the join (they wait for its outputs), and they run in the join's provider process (one
# per node: NodeEndpoint.options). Kept here, not in the join's module: a process that runs only
# the probe imports no other provider's module.
_RUNS_AGAIN: dict[str, bool] = {}


def record_join_judgement(node: str, runs_again: bool) -> None:
    """The engine's diff of `node`'s join judged whether this run runs it again."""
    _RUNS_AGAIN[node] = runs_again


def join_runs_again(node: str) -> bool | None:
    """Whether this run runs `node`'s join again, as the engine's diff of it judged; None when no
    diff of it ran in this process (then nobody here can tell)."""
    return _RUNS_AGAIN.get(node)


def join_run_as_planned(node: str, olds: Mapping[str, Any], news: dict[str, Any]) -> dict[str, Any]:
    """`news` of a resource that takes `node`'s `join_run`, as its diff compares them: an unknown
    `join_run` (the preview of an update of the join) is the recorded one when the join's diff judged
    that this run does not run the join again, so the preview plans no run the up does not make. A
    join that runs again, or one nobody here judged, stays unknown: an update is planned."""
    if "join_run" not in news or is_known(news["join_run"]) or join_runs_again(node) is not False:
        return news
    return {**news, "join_run": olds.get("join_run")}


def in_update() -> bool:
    """Whether the calling thread runs a provider's update (its diffs are the update's own
    questions, not the engine's diff of the resource)."""
    return _UPDATE_ANSWERS.get() is not None


def _state_only_off_host(update: Callable[..., UpdateResult]) -> Callable[..., UpdateResult]:
    @functools.wraps(update)
    def guarded(self: ResourceProvider, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        scope = _UPDATE_ANSWERS.set({})
        try:
            return state_only_change(self, id_, olds, news) or update(self, id_, olds, news)
        finally:
            _UPDATE_ANSWERS.reset(scope)

    return guarded


class NodeProvider(ResourceProvider):
    """Base of the providers that act on one node over SSH.

    A rotated login key changes the `private_key` input of every resource of the cluster. Each
    subclass's `update` is wrapped (`__init_subclass__`) so that such a change alone only stores
    the new key: the rotation itself is `NodeLoginKey`'s work, and a rejoin, a reinstall or a
    firewall change just because the key changed would be an outage for nothing.
    """

    # Keys whose change means a different machine or node: replace, never update.
    replace_on: tuple[str, ...] = ("node", "address")
    # True for the provider whose update *is* acting on a new login key (the rotation).
    acts_on_login_change: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__ and not cls.acts_on_login_change:
            # setattr: a method assigned on a class is a type error to mypy, not to Python.
            setattr(cls, "update", _state_only_off_host(cls.__dict__["update"]))  # noqa: B010

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, check_connection_inputs(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return diff_inputs(olds, news, replace_on=self.replace_on, ignore=("recorded_host_key",))
