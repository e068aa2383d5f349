"""WorkerRoster: the stack's list of workers, kept so a removal is judged before
anything of the run changes.

Pulumi runs the creates and updates of a run before the deletes of what left
the program. A worker dropped from `hk3s:workers` would therefore first lose
its place in its peers' host and cloud firewalls, and only then reach its own
delete. The roster's `check` sees the previous list and the new one, so a
removal the program cannot carry out is refused there, in `preview` and at the
start of `up`; the program makes every other resource depend on the roster
(components.program), so nothing else of the run starts before it passed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from node_operations.refusal import tagged
from providers.inputs import ResourceInputs
from providers.node_join import REMOVE_CAPABILITY


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerRosterInputs(ResourceInputs):
    """The names of the stack's workers, sorted."""

    workers: list[str] = dataclasses.field(default_factory=list)


def refused_removals(old_workers: list[str], new_workers: list[str]) -> list[str]:
    """Workers the new list drops. No removal can be carried out in this release, so
    every one is refused."""
    return sorted(set(old_workers) - set(new_workers))


class WorkerRosterProvider(ResourceProvider):
    """Dynamic provider of `WorkerRoster`; it touches no host."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = [
            CheckFailure(
                "workers",
                tagged(
                    f"{name}: removing the worker is not available in this release: {REMOVE_CAPABILITY}. "
                    "Nothing was changed: the removal is judged before any other step of the run",
                    "capability-missing",
                ),
            )
            for name in refused_removals(
                WorkerRosterInputs.from_props(olds).workers, WorkerRosterInputs.from_props(news).workers
            )
        ]
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = sorted(WorkerRosterInputs.from_props(olds).workers) != sorted(
            WorkerRosterInputs.from_props(news).workers
        )
        return DiffResult(changes=changed, replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_="worker-roster", outs=props)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=news)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class WorkerRoster(Resource, module="hk3s", name="WorkerRoster"):
    """The workers the stack holds; a removal is refused here before anything changes."""

    workers: pulumi.Output[list[str]]

    def __init__(self, resource_name: str, workers: list[str], opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = WorkerRosterInputs(workers=sorted(workers))
        super().__init__(WorkerRosterProvider(), resource_name, inputs.props(), opts)
