"""K3sUpgrade: moves the joined workers to the server's k3s release, one at a time.

Why one resource for every worker, and not each worker's NodeJoin: Pulumi runs independent
resources side by side, and its `depends_on` is fixed when the program runs, while only the
provider learns (from the state) whether a run changes the version. Chaining the workers'
NodeJoins one after another would also serialise every join of a new pool, in every run, for
an order that matters only in an upgrade. One resource that comes after the server's
`K3sServer` (its input is the version the server reports, so it waits for the server's upgrade)
and before every `NodeJoin` (their k3s version is its output) holds the order in its own loop:
the server, then each worker in the stack's order (node_operations.k3s_upgrade).

Its diff says an update only when the release changes; the preview then shows the order. A
NodeJoin whose version alone changed records the version its Node runs, with no rejoin
(providers.node_join). A worker added in the same run joins after it, at the new release.
A fenced worker (hk3s:fences) is left alone and listed, in the preview's plan and in the run; each
worker's Node is read again at its turn, and one gone NotReady since the run began stops it there,
untouched; right before a worker is taken down every other node is read again, its kubelet asked
itself, and one down stops the run there (node_operations.k3s_upgrade).

A fenced worker the upgrade left at another release is kept in the output `left_behind`. Once it
leaves hk3s:fences the diff says an update (and the preview names it) in every run until it runs
the release: the run that lifts its fence finds it still fenced (the lift, the fence's delete, runs
last), the next one moves it as an upgrade moves any worker. So a worker fenced across an upgrade
never stays on the old release unnoticed after its lift.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from providers.base import NodeProvider, progress, resource_inputs, run_operation, ssh_target
from providers.inputs import K3sRelease, NodeInputs, ResourceInputs, flat, is_known, known, nested
from remote_access.kube import API_WAIT_SECONDS
from remote_access.ssh import SshTarget


@dataclasses.dataclass(frozen=True, kw_only=True)
class UpgradedWorker(ResourceInputs):
    """Where a worker is reached (the server's login user and key)."""

    node: pulumi.Input[str]
    address: pulumi.Input[str]
    ssh_port: pulumi.Input[int] = 22
    recorded_host_key: pulumi.Input[str | None] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class K3sUpgradeInputs(NodeInputs):
    """The server's login, the release it runs, and the workers in the order they move."""

    k3s: K3sRelease = dataclasses.field(metadata=flat(K3sRelease))
    """`k3s_version` is the server's output: the upgrade starts once the server runs it."""
    target_version: pulumi.Input[str]
    """hk3s:cluster.k3s_version, known at preview (where the server's output is not yet)."""
    workers: list[UpgradedWorker] = dataclasses.field(default_factory=list, metadata=nested(UpgradedWorker))
    drain_on_minor_upgrade: pulumi.Input[bool] = True
    api_wait_seconds: pulumi.Input[float] = API_WAIT_SECONDS
    fenced: list[str] = dataclasses.field(default_factory=list)
    """The workers hk3s:fences names: left alone by an upgrade."""


# Inputs whose change is an upgrade; any other (a worker added, a setting) waits for the next one.
UPGRADE_INPUTS = K3sUpgradeInputs.names("k3s_version", "k3s_sha256")


def unfenced_behind(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """The workers the last upgrade left behind at their release while fenced that are still in the
    stack and no longer in hk3s:fences: each run moves them until they run the release."""
    left = [str(name) for name in olds.get("left_behind") or []]
    if not left:
        return []
    # At preview the lists may be unknown (a worker's address comes from a resource that changes):
    # the stored ones stand in for them.
    listed = news.get("workers") if is_known(news.get("workers")) else olds.get("workers")
    fenced_now = news.get("fenced") if is_known(news.get("fenced")) else olds.get("fenced")
    workers = {str(w.get("node")) for w in listed or [] if isinstance(w, dict)}
    fenced = {str(name) for name in fenced_now or []}
    return [name for name in left if name in workers and name not in fenced]


def upgrade_plan(olds: dict[str, Any], news: dict[str, Any]) -> str | None:
    """The preview's line for a change of release: the order, and what each worker goes through."""
    from node_operations.k3s_upgrade import release_step  # noqa: PLC0415 - loaded on first use

    old = str(olds.get("k3s_version") or "")
    new = str(news["k3s_version"] if is_known(news.get("k3s_version")) else news.get("target_version"))
    if not old or old == new:
        return None
    step = release_step(old, new)
    fenced = [str(name) for name in news.get("fenced") or []]
    workers = [str(w.get("node")) for w in news.get("workers") or [] if str(w.get("node")) not in fenced]
    if step == "minor" and news.get("drain_on_minor_upgrade") is not False:
        how = "each cordoned and drained first (a minor release; hk3s:cluster.drain_on_minor_upgrade)"
    else:
        how = f"each in place, pods running (a {step} release)"
    left = f". Fenced, left alone at their release: {', '.join(fenced)}" if fenced else ""
    return (
        f"plan: k3s {old} -> {new}: the server first, then one worker at a time, each Ready at {new} before the "
        f"next: {', '.join(workers) or '(no workers)'}; {how}. A worker not joined yet joins at {new}{left}"
        + beyond_skew_after(olds, fenced, new)
    )


def beyond_skew_after(olds: dict[str, Any], fenced: list[str], new: str) -> str:
    """What the plan says of the fenced workers the upgrade to `new` takes beyond Kubernetes'
    version-skew policy: each runs the release an upgrade left it at (`behind_releases`), else the
    one before this upgrade; its fence's lift will be refused at that release."""
    from node_operations.k3s_release import beyond_skew  # noqa: PLC0415 - loaded on first use

    releases = dict(olds.get("behind_releases") or {})
    old = str(olds.get("k3s_version") or "")
    lines = [
        f"{name}: {why}" for name in fenced if (why := beyond_skew(str(releases.get(name) or old), new)) is not None
    ]
    if not lines:
        return ""
    return (
        f". Beyond the version-skew policy after this upgrade, fenced: {'; '.join(lines)}. Its fence cannot be "
        "lifted at that release: lift it before upgrading this far (an upgrade moves it once it is back), or give "
        "it up (hk3s node remove NAME --force) and add it back, so that its join installs the new release"
    )


class K3sUpgradeProvider(NodeProvider):
    """Dynamic provider of `K3sUpgrade`."""

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [key for key in UPGRADE_INPUTS if key in news and olds.get(key) != news.get(key)]
        if not is_known(news.get("k3s_version")) and news.get("target_version") == olds.get("k3s_version"):
            # The server's output is unknown at preview whenever the server updates for another
            # reason; the configured release says whether it moves.
            changed = [key for key in changed if key != "k3s_version"]
        plan = upgrade_plan(olds, news) if changed else None
        if plan is not None:
            progress(str(news.get("node")), plan)
        behind = unfenced_behind(olds, news)
        if behind:
            release = news.get("k3s_version") if is_known(news.get("k3s_version")) else news.get("target_version")
            progress(
                str(news.get("node")),
                f"plan: {', '.join(behind)} left at an older release while fenced, unfenced now: moved to k3s "
                f"{release} one at a time, as in an upgrade, by the first run that finds its fence lifted (the run "
                "that lifts it finds it still fenced: then the next)",
            )
        # A rotated login key is stored (the update of a state-only change touches no host).
        rotated = "private_key" in olds and olds.get("private_key") != news.get("private_key")
        return DiffResult(changes=bool(changed) or bool(behind) or rotated, replaces=[], delete_before_replace=False)

    def _upgrade(self, props: dict[str, Any]) -> dict[str, Any]:
        from node_operations.k3s_upgrade import UpgradeSettings, upgrade_workers  # noqa: PLC0415 - loaded on first use

        inputs = K3sUpgradeInputs.from_props(props)
        server = ssh_target(inputs.login)
        workers = [_worker_target(server, worker) for worker in inputs.workers]
        settings = UpgradeSettings(
            binary=inputs.k3s.binary(),
            drain_on_minor=known(inputs.drain_on_minor_upgrade) is not False,
            api_wait=float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS),
            fenced=frozenset(str(name) for name in inputs.fenced),
        )
        report = run_operation(upgrade_workers(server, workers, settings, lambda line: print_line(server.node, line)))
        progress(server.node, report.summary())
        return {
            **props,
            "version": report.version,
            "upgraded": list(report.upgraded),
            "left_behind": list(report.behind),
            "behind_releases": dict(report.behind_releases),
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        # A new stack, or one from before this resource: every joined worker already runs the
        # server's release, or is moved to it now.
        return CreateResult(id_=f"{props['node']}-k3s-upgrade", outs=self._upgrade(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._upgrade(news))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # Each worker's version is read by its NodeJoin's refresh; this resource keeps the release
        # the last finished upgrade reached, so an interrupted one is resumed by the next up.
        return ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


def print_line(node: str, line: str) -> None:
    """A line of the upgrade's own (already prefixed with the worker it is about) or the server's."""
    if line.startswith("["):
        print(line, file=sys.stderr, flush=True)
    else:
        progress(node, line)


def _worker_target(server: SshTarget, worker: UpgradedWorker) -> SshTarget:
    return dataclasses.replace(
        server,
        node=str(known(worker.node)),
        address=str(known(worker.address)),
        port=int(known(worker.ssh_port) or 22),
        recorded_host_key=known(worker.recorded_host_key) or None,
    )


class K3sUpgrade(Resource, module="hk3s", name="K3sUpgrade"):
    """The workers moved to the server's k3s release, one at a time."""

    version: pulumi.Output[str]
    upgraded: pulumi.Output[list[str]]
    left_behind: pulumi.Output[list[str]]

    def __init__(
        self, resource_name: str, inputs: K3sUpgradeInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(
            K3sUpgradeProvider(), resource_name, resource_inputs(inputs, ["version", "upgraded", "left_behind"]), opts
        )
