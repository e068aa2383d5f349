"""NodeJoin: preflight, prepare, join under a taint, validate, release.

Create joins (and resumes an interrupted join); update rejoins, except a fenced
worker, whose join is left as it is until the fence is lifted; read reports the
Node's state. Removing a joined worker is refused until the remove
capability exists, so a worker dropped from the config is never silently
orphaned.
"""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from cluster_settings.defaults import VALIDATION_IMAGE_DEFAULT
from node_operations.firewall_plan import PortRule, port_rules_from
from node_operations.health import FENCE_ANNOTATION, read_node
from node_operations.join_host import joined_host_changed
from node_operations.k3s_release import K3S_VERSION
from node_operations.network_mode import fixed_mode_refusal
from node_operations.node_metadata import MetadataChange, update_node_metadata
from node_operations.teardown import wipe_node
from providers.base import (
    STATE_ONLY_INPUTS,
    NodeProvider,
    asked_once_per_update,
    check_connection_inputs,
    diff_inputs,
    in_update,
    other_node,
    pin_recorded_host_key,
    progress,
    record_join_judgement,
    resource_inputs,
    run_operation,
    ssh_target,
    state_only_change,
)
from providers.inputs import K3sRelease, NodeInputs, NodeLogin, checkable, flat, is_known, known
from remote_access.kube import API_WAIT_SECONDS, Taint
from remote_access.ssh import SshError, SshTarget

NETWORK_MODES = ("auto", "private", "public")


DEFAULT_VALIDATION_IMAGE = VALIDATION_IMAGE_DEFAULT


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeJoinInputs(NodeInputs):
    """Everything the join of one worker needs: the server it joins, the cluster's network
    and k3s, and the worker's own addresses and labels."""

    server_node: pulumi.Input[str]
    server_address: pulumi.Input[str]
    """The server's SSH address: the join logs in to it too (this node's token), with the same key."""
    server_ssh_port: pulumi.Input[int] | None = None
    server_host_key: pulumi.Input[str | None] = None
    server_firewall_managed: pulumi.Input[bool] = True
    server_url: pulumi.Input[str]
    ca_hash: pulumi.Input[str]
    k3s: K3sRelease = dataclasses.field(metadata=flat(K3sRelease))
    operator_firewall_rules: pulumi.Input[list[dict[str, Any]]] | None = None
    """The node's rules, checked against its own firewall where the operator runs it."""
    no_firewall_acknowledged: pulumi.Input[bool] = False
    """hk3s:firewall.none_acknowledged: with operator_firewall_rules, a node with no active
    firewall passes the join. Absent in a state written before the setting existed."""
    recorded_nodes: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)
    network_mode: pulumi.Input[str]
    node_ip: pulumi.Input[str]
    cluster_address: pulumi.Input[str] = ""
    """Where peers reach the node (differs from the node IP behind a 1:1 NAT)."""
    node_external_ip: pulumi.Input[str]
    labels: pulumi.Input[dict[str, str]] = dataclasses.field(default_factory=dict)
    taints: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)
    """The stack's taints (key=value:Effect), given at registration beside the validation taint."""
    validation_taint: pulumi.Input[str]
    registry: pulumi.Input[str] | None = None
    pod_network: pulumi.Input[str]
    api_wait_seconds: pulumi.Input[float] = API_WAIT_SECONDS
    """Absent in a state written before the setting existed."""
    validation_image: pulumi.Input[str] = DEFAULT_VALIDATION_IMAGE
    """Absent in a state written before the setting existed."""
    teardown_allowed: pulumi.Input[bool] = False
    """Read by delete: only a teardown wipes a joined worker (no copy moved)."""

    def server(self) -> SshTarget:
        """The server's SSH target: this node's user and key, the server's address and pinned key."""
        return other_node(self.login, self.server_node, self.server_address, self.server_ssh_port, self.server_host_key)

    def operator_rules(self) -> tuple[PortRule, ...] | None:
        rules = known(self.operator_firewall_rules) if self.operator_firewall_rules is not None else None
        if rules is None:
            return None
        return port_rules_from(rules)


def removed_taints(old: list[str], new: list[str]) -> tuple[str, ...]:
    """The taints (`key:Effect`) an earlier config set and this one no longer has. Kubernetes
    keys a taint by key and effect: a new value under a kept pair is overwritten, not removed."""

    def pairs(texts: list[str]) -> set[str]:
        return {f"{taint.key}:{taint.effect}" for taint in map(Taint.parse, texts)}

    return tuple(sorted(pairs(old) - pairs(new)))


# The state's record, written by refresh, that the worker's host no longer runs the agent it
# joined with (why, in words); the next run's diff joins it again, and the join's outputs drop it.
HOST_CHANGED = "host_changed"
# A joined worker whose Node was deleted (kubectl delete node) cannot register again by itself:
# k3s's supervisor refuses a node certificate whose Node is gone (pkg/nodepassword/validate.go
# verifyNode: 401), and the agent's fallback, its join token, was spent and deleted at the join.
# Only a join with a fresh one-time token brings it back, so a refreshed state that found the Node
# missing makes the next run join it again.
NODE_GONE = (
    "its Node is gone from the cluster, and its agent cannot register it again (k3s refuses the "
    "certificate of a deleted Node, and its join token is spent)"
)

# Inputs whose change never rejoins a worker.
DIFF_IGNORED = (
    *NodeJoinInputs.names(
        "recorded_host_key",
        "recorded_nodes",
        # Derived from the network plan, for the join's checks; never a reason to rejoin.
        "cluster_address",
        "operator_firewall_rules",
        "no_firewall_acknowledged",
        "server_firewall_managed",
        # How long API calls wait through an outage: a setting of the run, not of this node.
        "api_wait_seconds",
        # Checked at the join only: a new image must not rejoin a running node.
        "validation_image",
    ),
    # An input of earlier releases (the network plan's peers), still in older states.
    "peers",
)
# A joined worker's inputs that the API sets without a rejoin.
METADATA_INPUTS = NodeJoinInputs.names("labels", "taints")
# A joined worker's inputs that K3sUpgrade moves, without a rejoin.
RELEASE_INPUTS = NodeJoinInputs.names("k3s_version", "k3s_binary", "k3s_sha256")


def pending_changes(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """The join's inputs that changed (by the diff's rule), each with its old and new value when
    that is one value; the state-only ones (a login key, the teardown flag) are left out."""
    skipped = {"__provider", *DIFF_IGNORED, *STATE_ONLY_INPUTS}
    changed = []
    for key in sorted((set(olds) | set(news)) - skipped):
        old, new = olds.get(key), news.get(key)
        if key == "taints":
            old, new = old or [], new or []
        if key not in news or old == new:
            continue
        scalar = all(isinstance(value, (str, int, float, bool, type(None))) for value in (old, new))
        changed.append(f"{key} {old} -> {new}" if scalar else key)
    return changed


# Set while the engine's diff of a join judges whether it runs again (its own questions to `diff`).
_JUDGING: ContextVar[bool] = ContextVar("judging_join", default=False)


class NodeJoinProvider(NodeProvider):
    """Dynamic provider of `NodeJoin`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        # The version comes from K3sUpgrade's output: unknown in the preview of an upgrade.
        version = checkable(news, "k3s_version")
        if isinstance(version, str) and not K3S_VERSION.match(version):
            failures.append(CheckFailure("k3s_version", f"{version!r} is not a k3s release"))
        mode = checkable(news, "network_mode")
        if isinstance(mode, str) and mode not in NETWORK_MODES:
            failures.append(CheckFailure("network_mode", f"{mode!r} is not one of {', '.join(NETWORK_MODES)}"))
        old_mode = olds.get("network_mode_in_use")
        refusal = fixed_mode_refusal(mode, old_mode) if isinstance(mode, str) and isinstance(old_mode, str) else None
        if refusal is not None:
            failures.append(CheckFailure("network_mode", refusal))
        return CheckResult(pin_recorded_host_key(olds, dict(news)), failures)

    def _join(
        self, props: dict[str, Any], old_labels: dict[str, str] | None = None, old_taints: list[str] | None = None
    ) -> dict[str, Any]:
        from node_operations.join import JoinSpec, join_worker  # noqa: PLC0415 - loaded on first use

        inputs = NodeJoinInputs.from_props(props)
        node = str(known(inputs.login.node))
        labels = dict(known(inputs.labels) or {})
        taints = [str(text) for text in known(inputs.taints) or []]
        spec = JoinSpec(
            node=node,
            node_ip=str(known(inputs.node_ip)),
            external_ip=str(known(inputs.node_external_ip)),
            cluster_address=str(known(inputs.cluster_address) or ""),
            server_url=str(known(inputs.server_url)),
            ca_hash=str(known(inputs.ca_hash)),
            binary=inputs.k3s.binary(),
            pod_network=str(known(inputs.pod_network)),
            network_mode=str(known(inputs.network_mode)),
            validation_taint=str(known(inputs.validation_taint)),
            labels=labels,
            removed_labels=tuple(sorted(set(old_labels or {}) - set(labels))),
            taints=tuple(taints),
            removed_taints=removed_taints(old_taints or [], taints),
            recorded_nodes=tuple(known(inputs.recorded_nodes) or ()),
            registry=(known(inputs.registry) or None) if inputs.registry is not None else None,
            api_wait=float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS),
            validation_image=str(known(inputs.validation_image) or DEFAULT_VALIDATION_IMAGE),
            # The recorded nodes were checked once for the whole run (NodeAccessCheck), not per join.
            unmanaged_firewall_nodes=(
                (str(known(inputs.server_node)),) if known(inputs.server_firewall_managed) is False else ()
            ),
            operator_firewall_rules=inputs.operator_rules(),
            no_firewall_acknowledged=known(inputs.no_firewall_acknowledged) is True,
        )
        target = ssh_target(inputs.login)
        result = run_operation(join_worker(target, inputs.server(), spec, lambda line: progress(node, line)))
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

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        if in_update() or _JUDGING.get():
            return self._diff(olds, news)
        # The engine's diff: it also records whether the join runs again (join_runs_again).
        scope = _JUDGING.set(True)
        try:
            result = self._diff(olds, news)
            node = str(news.get("node") if is_known(news.get("node")) else olds.get("node"))
            record_join_judgement(node, self._runs_again(id_, olds, news, result))
            return result
        finally:
            _JUDGING.reset(scope)

    def _runs_again(self, id_: str, olds: dict[str, Any], news: dict[str, Any], result: DiffResult) -> bool:
        """Whether the update (or replacement) `result` plans runs the join, by the rules `update`
        follows: not for a change of state-only inputs, of the release alone, or of labels and
        taints alone. An input not known yet counts as changed (the join may run). A fenced worker's
        join, which its update leaves as it is, counts as run: only the update finds the fence."""
        if not result.changes:
            return False
        # A replacement joins anew (the input diff's: a fenced worker's, which its diff turned into
        # an update, asks no host again here).
        if not olds.get("state") or self._diff_inputs(olds, news).replaces:
            return True
        if state_only_change(self, id_, olds, news) is not None:
            return False
        return not (self._release_only(id_, olds, news) or self._metadata_only(id_, olds, news))

    def _diff(self, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        inputs = self._diff_inputs(olds, news)
        if inputs.replaces and olds.get("state") and self._fence_record(olds, news) is not None:
            # A fenced worker's join is not replaced (a replacement would join the host, fighting
            # the fence's drop-in): its update leaves it as it is until the fence is lifted.
            return DiffResult(changes=True, replaces=[], delete_before_replace=False)
        if inputs.changes or not olds.get("state"):
            return inputs
        # Same inputs, but the host may have been rebuilt under the node's name (a fresh OS,
        # no k3s, a new node password) or lost its agent: drift that only the host can tell,
        # read by refresh (`read` asks each worker's host, read-only) and never by a plain
        # preview or up, which log in nowhere when nothing changed. A refreshed state that
        # recorded it makes this run join the host again, and the join settles the node
        # password (see Joiner._settle_node_password): removed only when the old Node is gone
        # or was this very machine, else the run stops naming the conflict and its fix.
        changed = olds.get(HOST_CHANGED)
        if not changed and olds.get("state") == "missing":
            changed = NODE_GONE
        if not changed:
            return inputs
        progress(str(olds["node"]), f"{changed}: this run joins it again")
        return DiffResult(changes=True, replaces=[], delete_before_replace=False)

    def _diff_inputs(self, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The list of recorded nodes is context for preflight, not this node's configuration:
        # adding or removing another worker must not rejoin this one.
        # A state written before taints existed has none: the same as an empty list.
        return diff_inputs(
            {**olds, "taints": olds.get("taints") or []},
            {**news, "taints": news.get("taints") or []},
            replace_on=self.replace_on,
            ignore=DIFF_IGNORED,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        # Deterministic id: a create retried after a crash resumes the same node's join.
        return CreateResult(id_=f"{props['node']}-join", outs=self._join(props))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from node_operations.join import WorkerFencedError  # noqa: PLC0415 - loaded on first use

        if self._release_only(id_, olds, news):
            return UpdateResult(outs=self._record_release(olds, news))
        if self._metadata_only(id_, olds, news):
            return UpdateResult(outs=self._update_metadata(olds, news))
        # A rejoin: cordoned for the checks, running pods untouched, uncordoned after. Its preflight
        # finds a fenced worker's Node before the host changes (WorkerFencedError).
        try:
            outs = self._join(
                news, old_labels=dict(olds.get("labels") or {}), old_taints=list(olds.get("taints") or [])
            )
        except WorkerFencedError as fenced:
            outs = self._leave_fenced(olds, news, fenced.recorded_at)
        except SshError as error:
            # A fenced worker may be powered off for good: a join that could not log in to it left
            # it as it was (the preflight stops a fenced worker's join before anything changes).
            fenced_at = self._fence_record(olds, news) if error.node == news.get("node") else None
            if fenced_at is None:
                raise
            outs = self._leave_fenced(olds, news, fenced_at)
        return UpdateResult(outs=outs)

    def _fence_record(self, olds: dict[str, Any], news: dict[str, Any]) -> str | None:
        """When the worker's Node carries the fence record (its time), else None (not fenced, or no
        Node). Asked through the server once per update (its diffs share the answer); the inputs
        the engine knows already win over the stored ones (at preview some are unknown)."""
        inputs = NodeJoinInputs.from_props({**olds, **{key: value for key, value in news.items() if is_known(value)}})
        node, server = str(known(inputs.login.node)), inputs.server()
        wait = float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS)
        status = asked_once_per_update(
            ("fence_record", server, node), lambda: run_operation(read_node(server, node, wait))
        )
        return status.annotations.get(FENCE_ANNOTATION) if status is not None else None

    def _leave_fenced(self, olds: dict[str, Any], news: dict[str, Any], fenced_at: str) -> dict[str, Any]:
        """A fenced worker's join changes nothing on its host: a rejoin now would rewrite the agent's
        configuration and start the agent the fence's drop-in holds down, before the fence is lifted
        (the engine runs the fence's delete, its lift, last). The state keeps the join as it last
        ran, so the next run's diff still finds the change: the first `up` after the lift applies it."""
        node = str(news["node"])
        pending = ", ".join(pending_changes(olds, news)) or "a rejoin"
        progress(
            node,
            f"fenced (recorded {fenced_at}): its join changes nothing on the host while it is fenced; pending until "
            f"the first up after the fence is lifted: {pending}",
        )
        # The state-only inputs (a rotated login key, the teardown flag) are stored either way.
        return {**olds, **{key: news[key] for key in STATE_ONLY_INPUTS if key in news}}

    def _metadata_only(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> bool:
        """Whether labels and taints are all that changed on a joined worker whose host, as last
        refreshed, still runs its agent: then they are set through the API, with no rejoin."""
        if not olds.get("state"):
            return False
        # A login key rotated in the same run is stored either way (state only).
        kept = {**news, **{key: olds.get(key) for key in (*METADATA_INPUTS, *STATE_ONLY_INPUTS) if key in olds}}
        return not self.diff(id_, dict(olds), kept).changes

    def _release_only(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> bool:
        """Whether the k3s release is all that changed on a joined worker: K3sUpgrade, which
        every NodeJoin comes after, has moved it already (binary swapped, agent restarted, Ready at
        the release: that is an upgrade). A rejoin would repeat the checks of a new node for a node
        that is not new, and restart its agent a second time."""
        if not olds.get("state") or olds.get("k3s_version") == news.get("k3s_version"):
            return False
        # A login key rotated in the same run is stored either way (state only).
        kept = {**news, **{key: olds.get(key) for key in (*RELEASE_INPUTS, *STATE_ONLY_INPUTS) if key in olds}}
        return not self.diff(id_, dict(olds), kept).changes

    def _record_release(self, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        """The release the worker's Node runs, as the upgrade left it; one that does not is an error."""
        inputs = NodeJoinInputs.from_props(news)
        node, version = str(known(inputs.login.node)), str(known(inputs.k3s.k3s_version))
        wait = float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS)
        status = run_operation(read_node(inputs.server(), node, wait))
        if status is not None and FENCE_ANNOTATION in status.annotations:
            # The upgrade leaves a fenced worker alone: it keeps the release it runs until it rejoins.
            # The state keeps the release it last ran (as for any change of a fenced worker's join),
            # so each run's diff still shows the move pending; the first run after the lift that
            # finds it at the release (K3sUpgrade moves it, before this join) records it.
            progress(
                node,
                f"fenced: left at {status.kubelet_version} by the upgrade to {version}; moved to {version} by the "
                "first up after the fence is lifted",
            )
            kept = {key: olds[key] for key in RELEASE_INPUTS if key in olds}
            outs = {**olds, **{key: value for key, value in news.items() if value is not None and key != "__provider"}}
            return {**outs, **kept, "k3s_version_in_use": status.kubelet_version, "state": "not-ready"}
        if status is None or status.kubelet_version != version:
            running = status.kubelet_version if status is not None else "no Node"
            raise SshError(
                node,
                f"runs {running}, not the release {version} the upgrade (k3s-upgrade) reported; run up again, "
                "which finishes the upgrade",
            )
        progress(node, f"runs {version} (upgraded in place, no rejoin)")
        outs = dict(olds)
        outs.update({key: value for key, value in news.items() if value is not None and key != "__provider"})
        return {**outs, "k3s_version_in_use": version, "state": "ready" if status.ready else "not-ready"}

    def _update_metadata(self, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        node = str(news["node"])
        old_labels, labels = dict(olds.get("labels") or {}), dict(news.get("labels") or {})
        change = MetadataChange(
            node=node,
            labels=labels,
            removed_labels=tuple(sorted(set(old_labels) - set(labels))),
            taints=tuple(news.get("taints") or ()),
            removed_taints=removed_taints(list(olds.get("taints") or []), list(news.get("taints") or [])),
        )
        inputs = NodeJoinInputs.from_props(news)
        wait = float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS)
        run_operation(update_node_metadata(inputs.server(), change, wait, lambda line: progress(node, line)))
        # Everything the last join recorded stays (its run, its checks, the machine-id); the
        # inputs are the new ones.
        outs = dict(olds)
        outs.update({key: value for key, value in news.items() if value is not None and key != "__provider"})
        return outs

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        inputs = NodeJoinInputs.from_props(props)
        api_wait = float(known(inputs.api_wait_seconds) or API_WAIT_SECONDS)
        node = str(known(inputs.login.node))
        status = run_operation(read_node(inputs.server(), node, api_wait))
        outs = {key: value for key, value in props.items() if key != HOST_CHANGED}
        if props.get("state") not in (None, "", "missing"):
            # Whether the host still runs the agent it joined with (same machine-id): kept in the
            # state for the next run's diff, which then joins it again. A host that cannot be
            # reached says nothing (a fenced or powered-off worker is not rebuilt).
            login = NodeLogin.from_props(props)
            changed = run_operation(joined_host_changed(ssh_target(login), str(props.get("machine_id") or "")))
            if changed is not None:
                progress(node, f"{changed}: the next up joins it again")
                outs[HOST_CHANGED] = changed
        if status is None:
            if props.get("state") not in (None, ""):
                progress(node, f"{NODE_GONE}: the next up joins it again")
            return ReadResult(id_=id_, outs={**outs, "state": "missing"})
        return ReadResult(
            id_=id_,
            outs={
                **outs,
                "state": "ready" if status.ready else "not-ready",
                "k3s_version_in_use": status.kubelet_version,
            },
        )

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        inputs = NodeJoinInputs.from_props(props)
        node = str(known(inputs.login.node))
        if known(inputs.teardown_allowed) is not True:
            # A worker leaving the stack was removed by the worker roster before anything else of
            # the run (providers.worker_roster); a join replaced under a new address leaves its
            # node to the new join. Either way nothing is left to do on any host.
            progress(node, "the join is forgotten; the host is left as it is")
            return
        # The stack's teardown: no drain, no copy moved (the data goes with the cluster).
        outcome = run_operation(wipe_node(ssh_target(inputs.login), lambda line: progress(node, line)))
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

    def __init__(self, resource_name: str, inputs: NodeJoinInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        outputs = ["name", "addresses", "network_mode_in_use", "k3s_version_in_use", "state", "checks", "join_run"]
        props = resource_inputs(inputs, [*outputs, "machine_id"])
        super().__init__(NodeJoinProvider(), resource_name, props, opts)
