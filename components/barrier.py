"""Barrier: one resource standing for "after all of these", so that N resources that must each come
after the same M resources declare N + M dependencies instead of N x M.

The Pulumi SDK walks every resource reachable from each dependency a resource declares (its cycle
check, `pulumi/runtime/resource_cycle_breaker.py`, with nothing remembered between walks): N x M
declarations make the program's own time grow with the cube of the workers.

What the barrier must be, from the SDK and the engine:
- Not a `pulumi.ComponentResource`: depending on a local component is depending on each of its
  children (`pulumi/runtime/rpc.py`, `_add_dependency`), which saves nothing. A plain
  `pulumi.Resource` registered as not custom is not expanded: its dependents record its URN.
- Not custom: the engine gives a resource that is not custom no provider (`loadResourceProvider`)
  and diffs its inputs itself (`stepGenerator.diff`), so the barrier costs no provider call, in a
  preview, an up or a refresh, and its step is the same step when nothing changed.
- It orders both ways. The SDK registers a resource only once every resource it depends on has
  been registered, whose URN the engine returns when its step (create, update, same) is done: the
  barrier after all it depends on, its dependents after it. Its dependencies are recorded in the
  state like any resource's, so a destroy deletes its dependents, then it, then what it depends on
  (`stepGenerator.ScheduleDeletes`).

The engine schedules the deletes of one run by the direct dependencies among the resources deleted
in that run (`ScheduleDeletes`): a barrier that stays (a worker leaves, the barrier remains) orders
nothing between the leaving worker's resources. A resource whose delete must come before that of
another resource of its own node keeps its direct dependency on it beside the barrier.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi


class Barrier(pulumi.Resource):
    """After every resource in `after` (components count as all their children): depend on it."""

    def __init__(self, name: str, after: Sequence[pulumi.Resource], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(
            "hk3s:order:Barrier",
            name,
            custom=False,
            props={},
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=list(after))),
        )
