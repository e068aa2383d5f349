"""LonghornNodeRole: whether one node holds copies of data, on its Longhorn node (tags and
scheduling flag; node_operations/longhorn_node_role.py has the rules and why).

One per node of a cluster that runs Longhorn: the server's always holds copies; a worker's follows
its disk probe's verdict (`holds_copies`: the probe's `eligible`, false for a worker that opted out).
Applied after Longhorn is installed and the node has joined (and its disk was probed); applied again
when the verdict changes (an on-demand `check_disk` targets it with the probe) and at every run of
the worker's join (`join_run`), since a rejoin may follow a Longhorn node made anew; a preview plans
it where the up applies it (not after an update of the join that does not rejoin). Delete leaves the
Longhorn node as it is: a node that leaves the cluster takes its Longhorn node with it (the removal
deletes it), and a stack that stops installing Longhorn leaves Longhorn's objects alone.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from node_operations.longhorn_node_role import NodeRole, set_node_role
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    join_run_as_planned,
    progress,
    resource_inputs,
    run_operation,
)
from providers.base import ssh_target as login_target
from providers.inputs import NodeInputs, checkable, is_known, known
from remote_access.kube import API_WAIT_SECONDS

OUTPUTS = ("tags", "allow_scheduling")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LonghornNodeRoleInputs(NodeInputs):
    """`login` is the server's (the Longhorn node is reached through its `k3s kubectl`)."""

    longhorn_node: pulumi.Input[str]
    """The node whose Longhorn node gets the role."""
    server: pulumi.Input[bool] = False
    holds_copies: pulumi.Input[bool] = False
    join_run: pulumi.Input[str] | None = None
    api_wait_seconds: pulumi.Input[float] = API_WAIT_SECONDS


def _apply(props: dict[str, Any]) -> dict[str, Any]:
    inputs = LonghornNodeRoleInputs.from_props(props)
    node = str(known(inputs.longhorn_node))
    role = NodeRole(node=node, server=bool(known(inputs.server)), holds_copies=bool(known(inputs.holds_copies)))
    applied = run_operation(
        set_node_role(
            login_target(inputs.login),
            role,
            api_wait=float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS),
            progress=functools.partial(progress, node),
        )
    )
    what = "holds copies" if role.allow_scheduling else "holds no copies (scheduling disabled on its Longhorn node)"
    progress(node, f"Longhorn node tags {applied.tags or 'none'}: {what}")
    return {**props, "tags": applied.tags, "allow_scheduling": applied.allow_scheduling}


class LonghornNodeRoleProvider(NodeProvider):
    """Dynamic provider of `LonghornNodeRole`."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        for flag in LonghornNodeRoleInputs.names("server", "holds_copies"):
            # `holds_copies` is the disk probe's verdict: unknown in the preview of a new worker.
            value = checkable(news, flag)
            if value is not None and not isinstance(value, bool):
                # No setting feeds it (the program does): a bad value is this program's bug.
                failures.append(
                    CheckFailure(
                        flag,
                        f"{flag} must be true or false, not {value!r} (set by the program from the disk probe's "
                        "verdict: a bug; report it with this line)",
                    )
                )
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Nothing replaces it: every change is applied in place by the same idempotent patch. A
        # preview plans it again only where the worker's join runs again (join_run_as_planned).
        node = news.get("longhorn_node") if is_known(news.get("longhorn_node")) else olds.get("longhorn_node")
        news = join_run_as_planned(str(node), olds, news)
        return diff_inputs(olds, news, replace_on=(), ignore=LonghornNodeRoleInputs.names("recorded_host_key"))

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=f"{props['longhorn_node']}-longhorn-role", outs=_apply(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=_apply(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class LonghornNodeRole(Resource, module="hk3s", name="LonghornNodeRole"):
    """One node's Longhorn tags and scheduling flag."""

    tags: pulumi.Output[list[str]]
    allow_scheduling: pulumi.Output[bool]

    def __init__(
        self, resource_name: str, inputs: LonghornNodeRoleInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(LonghornNodeRoleProvider(), resource_name, resource_inputs(inputs, list(OUTPUTS)), opts)
