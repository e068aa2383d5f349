"""NodeJoin: preflight, prepare, join under a taint, validate, release.

Create joins (and resumes an interrupted join); update rejoins; read reports
the Node's state. Removing a joined worker is refused until the remove
capability exists, so a worker dropped from the config is never silently
orphaned.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from cluster_settings.models import K3S_VERSION, ClusterSettings
from node_operations.firewall_plan import PortRule
from node_operations.join import JoinSpec, join_worker, joined_host_changed, read_node
from node_operations.k3s_install import K3sBinary
from node_operations.teardown import wipe_node
from providers.base import (
    CapabilityMissingError,
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    is_known,
    pin_recorded_host_key,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
    teardown_allowed,
)
from remote_access.kube import API_WAIT_SECONDS, Taint
from remote_access.ssh import SshTarget

REMOVE_CAPABILITY = (
    "removing a worker (drain, move copies, wipe, deregister); put the worker back in hk3s:workers to keep it"
)
NETWORK_MODES = ("auto", "private", "public")


def other_node(props: dict[str, Any], node: Any, address: Any, port: Any, host_key: Any) -> SshTarget:
    """Another node's SSH target: same user and key as this node's, its own address and pinned key."""
    return dataclasses.replace(
        ssh_target(props),
        node=str(node),
        address=str(address),
        port=int(port or 22),
        recorded_host_key=host_key or None,
    )


DEFAULT_VALIDATION_IMAGE = ClusterSettings.model_fields["validation_image"].default


def _api_wait(props: dict[str, Any]) -> float:
    """hk3s:cluster.api_wait_seconds (absent in a state written before the setting existed)."""
    return float(props.get("api_wait_seconds") or API_WAIT_SECONDS)


def _server(props: dict[str, Any]) -> SshTarget:
    return other_node(
        props, props["server_node"], props["server_address"], props.get("server_ssh_port"), props.get("server_host_key")
    )


def removed_taints(old: list[str], new: list[str]) -> tuple[str, ...]:
    """The taints (`key:Effect`) an earlier config set and this one no longer has. Kubernetes
    keys a taint by key and effect: a new value under a kept pair is overwritten, not removed."""

    def pairs(texts: list[str]) -> set[str]:
        return {f"{taint.key}:{taint.effect}" for taint in map(Taint.parse, texts)}

    return tuple(sorted(pairs(old) - pairs(new)))


class NodeJoinProvider(NodeProvider):
    """Dynamic provider of `NodeJoin`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        version = news.get("k3s_version")
        if isinstance(version, str) and not K3S_VERSION.match(version):
            failures.append(CheckFailure("k3s_version", f"{version!r} is not a k3s release"))
        mode = news.get("network_mode") if is_known(news.get("network_mode")) else None
        if isinstance(mode, str) and mode not in NETWORK_MODES:
            failures.append(CheckFailure("network_mode", f"{mode!r} is not one of {', '.join(NETWORK_MODES)}"))
        old_mode = olds.get("network_mode_in_use")
        if isinstance(old_mode, str) and isinstance(mode, str) and mode not in ("auto", old_mode):
            failures.append(
                CheckFailure(
                    "network_mode",
                    f"the cluster runs in {old_mode} mode, fixed by its first join; hk3s:network.mode "
                    f"cannot change to {mode}. Set it back to {old_mode} or auto",
                )
            )
        return CheckResult(pin_recorded_host_key(olds, dict(news)), failures)

    def _join(
        self, props: dict[str, Any], old_labels: dict[str, str] | None = None, old_taints: list[str] | None = None
    ) -> dict[str, Any]:
        node = str(props["node"])
        operator_rules = props.get("operator_firewall_rules")
        spec = JoinSpec(
            node=node,
            node_ip=str(props["node_ip"]),
            external_ip=str(props["node_external_ip"]),
            cluster_address=str(props.get("cluster_address") or ""),
            server_url=str(props["server_url"]),
            ca_hash=str(props["ca_hash"]),
            binary=K3sBinary(
                version=str(props["k3s_version"]),
                local_path=Path(props["k3s_binary"]) if props.get("k3s_binary") else None,
                sha256=props.get("k3s_sha256") or None,
            ),
            pod_network=str(props["pod_network"]),
            network_mode=str(props["network_mode"]),
            validation_taint=str(props["validation_taint"]),
            labels=dict(props.get("labels") or {}),
            removed_labels=tuple(sorted(set(old_labels or {}) - set(props.get("labels") or {}))),
            taints=tuple(props.get("taints") or ()),
            removed_taints=removed_taints(old_taints or [], props.get("taints") or []),
            recorded_nodes=tuple(props.get("recorded_nodes") or ()),
            registry=props.get("registry") or None,
            api_wait=_api_wait(props),
            # Absent in a state written before the setting existed.
            validation_image=str(props.get("validation_image") or DEFAULT_VALIDATION_IMAGE),
            # The recorded nodes were checked once for the whole run (NodeAccessCheck), not per join.
            unmanaged_firewall_nodes=(
                (str(props["server_node"]),) if props.get("server_firewall_managed") is False else ()
            ),
            operator_firewall_rules=None
            if operator_rules is None
            else tuple(
                PortRule(str(r["port"]), r["protocol"], tuple(r["sources"]), str(r.get("purpose", "")))
                for r in operator_rules
            ),
        )
        server = _server(props)
        result = run_operation(join_worker(ssh_target(props), server, spec, lambda line: progress(node, line)))
        return {
            **props,
            "name": result.name,
            "addresses": result.addresses,
            "network_mode_in_use": result.network_mode,
            "k3s_version_in_use": result.k3s_version,
            "state": result.state,
            "checks": result.checks,
            "machine_id": result.machine_id,
            # When this join last ran: what runs after every join (the disk probe) takes it as an input.
            "join_run": datetime.now(UTC).isoformat(timespec="seconds"),
        }

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        inputs = self._diff_inputs(olds, news)
        if inputs.changes or not olds.get("state"):
            return inputs
        # Same inputs, but the host may have been rebuilt under the node's name (a fresh OS,
        # no k3s, a new node password): only the host can tell. Then the next run rejoins it,
        # and the join settles the node password (see Joiner._settle_node_password): removed
        # only when the old Node is gone or was this very machine, else the run stops naming
        # the conflict and its fix.
        node = str(olds["node"])
        changed = run_operation(joined_host_changed(ssh_target(olds), str(olds.get("machine_id") or "")))
        if changed is None:
            return inputs
        progress(node, f"{changed}: this run joins it again")
        return DiffResult(changes=True, replaces=[], delete_before_replace=False)

    def _diff_inputs(self, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The list of recorded nodes is context for preflight, not this node's configuration:
        # adding or removing another worker must not rejoin this one.
        # A state written before taints existed has none: the same as an empty list.
        return diff_inputs(
            {**olds, "taints": olds.get("taints") or []},
            {**news, "taints": news.get("taints") or []},
            replace_on=self.replace_on,
            ignore=(
                "recorded_host_key",
                "recorded_nodes",
                # Derived from the network plan, for the join's checks; never a reason to rejoin.
                "cluster_address",
                "peers",
                "operator_firewall_rules",
                "server_firewall_managed",
                # How long API calls wait through an outage: a setting of the run, not of this node.
                "api_wait_seconds",
                # Checked at the join only: a new image must not rejoin a running node.
                "validation_image",
            ),
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        # Deterministic id: a create retried after a crash resumes the same node's join.
        return CreateResult(id_=f"{props['node']}-join", outs=self._join(props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # A rejoin: cordoned for the checks, running pods untouched, uncordoned after.
        return UpdateResult(
            outs=self._join(news, old_labels=dict(olds.get("labels") or {}), old_taints=list(olds.get("taints") or []))
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        status = run_operation(read_node(_server(props), str(props["node"]), _api_wait(props)))
        if status is None:
            return ReadResult(id_=id_, outs={**props, "state": "missing"})
        return ReadResult(
            id_=id_,
            outs={
                **props,
                "state": "ready" if status.ready else "not-ready",
                "k3s_version_in_use": status.kubelet_version,
            },
        )

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        node = str(props["node"])
        if not teardown_allowed(props):
            raise CapabilityMissingError(node, "removing the worker", REMOVE_CAPABILITY)
        # The stack's teardown: no drain, no copy moved (the data goes with the cluster).
        outcome = run_operation(wipe_node(ssh_target(props), lambda line: progress(node, line)))
        progress(node, outcome.report())


class NodeJoin(Resource, module="hk3s", name="NodeJoin"):
    """A worker joined to the cluster, checked and released."""

    name: pulumi.Output[str]
    addresses: pulumi.Output[list[str]]
    network_mode_in_use: pulumi.Output[str]
    k3s_version_in_use: pulumi.Output[str]
    state: pulumi.Output[str]
    join_run: pulumi.Output[str]
    machine_id: pulumi.Output[str]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        outputs = ["name", "addresses", "network_mode_in_use", "k3s_version_in_use", "state", "checks", "join_run"]
        inputs = resource_inputs(props, [*outputs, "machine_id"])
        super().__init__(NodeJoinProvider(), resource_name, inputs, opts)
