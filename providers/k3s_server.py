"""K3sServer: installs or adopts k3s on the server host.

`check` guards what must never change on a running cluster (its pod and
service networks and its pod network's backend, a k3s downgrade) and refuses a change that restarts k3s
unless hk3s:network.approve_server_restart approves it. Create and update are
idempotent: rerunning them after an interruption adopts what is there.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from node_operations.firewall_plan import listening_ports, port_rules_from
from node_operations.health import server_certificate_warning, time_left
from node_operations.k3s_install import (
    ServerCredentials,
    ServerSpec,
    install_server,
    read_server_credentials,
    read_server_state,
    refresh_server_credentials,
    stop_server,
)
from node_operations.k3s_release import K3S_VERSION
from node_operations.teardown import wipe_node
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    pin_recorded_host_key,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import K3sRelease, NodeInputs, checkable, flat, is_known, known
from remote_access.ssh import HostKeyChangedError, SshError


@dataclasses.dataclass(frozen=True, kw_only=True)
class K3sServerInputs(NodeInputs):
    """The server's k3s: release, cluster networks, addresses and what may restart it."""

    k3s: K3sRelease = dataclasses.field(metadata=flat(K3sRelease))
    pod_cidr: pulumi.Input[str]
    service_cidr: pulumi.Input[str]
    flannel_backend: pulumi.Input[str]
    pod_network: pulumi.Input[str] | None = None
    ingress: pulumi.Input[bool] = False
    flannel_external_ip: pulumi.Input[bool | None] = None
    node_ip: pulumi.Input[str]
    node_external_ip: pulumi.Input[str]
    network_mode: pulumi.Input[str] | None = None
    approve_restart: pulumi.Input[bool] = False
    registry: pulumi.Input[str] | None = None
    teardown_allowed: pulumi.Input[bool] = False
    """Read by delete: a teardown wipes k3s and its data instead of only stopping it."""
    firewall_managed: pulumi.Input[bool] = True
    """False: the operator runs the server's firewall (hk3s:firewall.managed), so the first
    install checks that one is active. Absent in a state written before the input existed."""
    no_firewall_acknowledged: pulumi.Input[bool] = False
    """hk3s:firewall.none_acknowledged: a server whose firewall the operator runs may have none."""
    operator_firewall_rules: pulumi.Input[list[dict[str, Any]]] | None = None
    """The server's rules (the plan's), checked against its firewall where the operator runs it:
    nothing missing, nothing open wider. Absent in a state written before the input existed."""
    secrets_encryption: pulumi.Input[bool | None] = None
    """Decided by check: on for a server k3s starts here for the first time (or one it adopts);
    a server this stack already runs keeps what it runs with unless the stack allows a restart (k3s
    turns it on at a start with the flag; the install then re-encrypts the Secrets stored before)."""
    deny_service_external_ips: pulumi.Input[bool | None] = None
    """Decided by check: on for a server k3s starts here for the first time; a running server
    keeps what it runs unless hk3s:network.approve_server_restart approves turning it on (k3s
    restarts). Absent in a state written before the input existed: off."""
    kubeconfig_used: pulumi.Input[bool] = False
    """The run uses the server's kubeconfig (Longhorn, through the Kubernetes provider and the API
    forward): a stale one fails the run with an x509 error, so every run reads it from the server
    (a run with Longhorn logs in to the server for the API forward anyway). Without it, a run reads
    the server only when the recorded certificates are inside k3s's renewal window."""


FIRST_INSTALL_ONLY = K3sServerInputs.names("firewall_managed", "no_firewall_acknowledged", "operator_firewall_rules")
# What decides only whether a run reads the server (diff), never a reason to reinstall it.
READ_ONLY_INPUTS = K3sServerInputs.names("kubeconfig_used")
# What ssh_target reads: a run logs in only when every one of them is known.
LOGIN_INPUTS = ("node", "address", "ssh_port", "ssh_user", "private_key", "recorded_host_key")
# Changing these on a running server restarts k3s: the API is down for 10-30 s.
RESTARTING_INPUTS = K3sServerInputs.names("node_ip", "node_external_ip", "flannel_external_ip")
POD_NETWORK_OF_BACKEND = {"wireguard-native": "wireguard", "vxlan": "vxlan"}


def _pod_network_change_failure(old_backend: str, new_backend: str) -> CheckFailure:
    """A running cluster keeps its pod network. Each k3s agent reads the flannel backend from the
    server once, at its start (the agent configuration it fetches from the server), and a worker
    keeps its running agent across a config-less rejoin: a switched server would run the new
    backend, every worker the old one, and the firewalls open the new port only, so pod traffic
    between nodes would stop. A rolling switch (each agent restarted and checked in turn) is not
    built; the procedure is a new stack."""
    old = POD_NETWORK_OF_BACKEND.get(old_backend, old_backend)
    new = POD_NETWORK_OF_BACKEND.get(new_backend, new_backend)
    return CheckFailure(
        "pod_network",
        f"hk3s:cluster.pod_network is {old} on the running cluster and cannot change to {new}: every k3s "
        "agent reads the pod network's backend only when it starts, so the server would move to "
        f"{new} while the workers stayed on {old}, and pod traffic between nodes would stop. Set "
        f"hk3s:cluster.pod_network back to {old}. To run {new}: create a new stack with "
        f"hk3s:cluster.pod_network: {new}, move the workloads and their data to it, then tear this one down",
    )


IMMUTABLE_CLUSTER_INPUTS = {
    "pod_cidr": "hk3s:cluster.pod_cidr",
    "service_cidr": "hk3s:cluster.service_cidr",
}


def _version_tuple(version: str) -> tuple[int, ...]:
    match = K3S_VERSION.match(version)
    return tuple(int(part) for part in match.groups()) if match else ()


def _version_change_failures(old_version: str, new_version: str) -> list[CheckFailure]:
    """A downgrade, or an upgrade past the next minor release, is refused before anything runs."""
    old, new = _version_tuple(old_version), _version_tuple(new_version)
    if not old or not new:
        return []
    if new < old:
        return [
            CheckFailure(
                "k3s_version",
                f"hk3s:cluster.k3s_version {new_version} is older than the running {old_version}; "
                f"k3s cannot be downgraded in place. Set it back to {old_version} or later",
            )
        ]
    # Kubernetes' version-skew policy: the control plane moves one minor release at a time
    # (its stored objects are migrated by each release in turn), and kubelets may not be newer.
    if new[:2] > (old[0], old[1] + 1):
        step = f"v{old[0]}.{old[1] + 1}"
        return [
            CheckFailure(
                "k3s_version",
                f"hk3s:cluster.k3s_version {new_version} skips minor releases from the running {old_version}; "
                f"Kubernetes upgrades one minor release at a time. Set it to the latest {step} release "
                f"(e.g. {step}.0+k3s1), run up, then go on to the next",
            )
        ]
    return []


class K3sServerProvider(NodeProvider):
    """Dynamic provider of `K3sServer`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_connection_inputs(news)
        for key, setting in IMMUTABLE_CLUSTER_INPUTS.items():
            if olds.get(key) and checkable(news, key) and olds[key] != news[key]:
                failures.append(
                    CheckFailure(
                        key,
                        f"{setting} was {olds[key]} when the cluster was created and cannot change to "
                        f"{news[key]} on a running cluster; set it back",
                    )
                )
        old_backend, new_backend = olds.get("flannel_backend"), checkable(news, "flannel_backend")
        if isinstance(old_backend, str) and old_backend and isinstance(new_backend, str) and old_backend != new_backend:
            failures.append(_pod_network_change_failure(old_backend, new_backend))
        old_version, new_version = olds.get("k3s_version"), checkable(news, "k3s_version")
        if isinstance(old_version, str) and isinstance(new_version, str):
            failures += _version_change_failures(old_version, new_version)
        # Compared only once known: at preview an address the network plan is still deciding is unknown.
        restarting = [
            key
            for key in RESTARTING_INPUTS
            if olds.get(key) and key in news and is_known(news[key]) and olds[key] != news[key]
        ]
        if restarting and news.get("approve_restart") is False:
            failures.append(
                CheckFailure(
                    restarting[0],
                    f"changing {', '.join(restarting)} restarts k3s on the server: the Kubernetes API is down for "
                    "10-30 s. Set hk3s:network.approve_server_restart: true to approve it",
                )
            )
        checked = pin_recorded_host_key(olds, dict(news))
        # A server this stack already runs keeps what it runs with (an earlier release's: off) unless
        # the stack allows a restart: k3s turns secrets-encryption on at a start with the flag, and
        # the install then re-encrypts the Secrets stored before (node_operations.k3s_install).
        runs = bool(olds.get("node"))
        turn_on = not runs or news.get("approve_restart") is True
        checked["secrets_encryption"] = True if turn_on else olds.get("secrets_encryption")
        # Turning the admission plugin on restarts k3s: a running server gets it with approval only.
        checked["deny_service_external_ips"] = True if turn_on else olds.get("deny_service_external_ips")
        return CheckResult(checked, failures)

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """Also says, in preview, when applying the change restarts k3s (the API goes down)."""
        result = self._diff_inputs(olds, news)
        node = str(news.get("node"))
        restarting = [key for key in RESTARTING_INPUTS if olds.get(key) and is_known(news.get(key))]
        restarting = [key for key in restarting if olds[key] != news.get(key)]
        undecided = [key for key in RESTARTING_INPUTS if olds.get(key) and not is_known(news.get(key))]
        if restarting:
            changes = ", ".join(f"{key} {olds[key]} -> {news.get(key)}" for key in restarting)
            progress(node, f"plan: {changes} restarts k3s on the server; the Kubernetes API will be down for 10-30 s")
        elif undecided:
            progress(
                node,
                f"plan: {', '.join(undecided)} follow the network decision made during the run; if they change, "
                "k3s restarts on the server (the API is down for 10-30 s; needs hk3s:network.approve_server_restart)",
            )
        if olds.get("node") and not olds.get("deny_service_external_ips") and news.get("deny_service_external_ips"):
            progress(
                node,
                "plan: turning on DenyServiceExternalIPs restarts k3s on the server; the Kubernetes API will be "
                "down for 10-30 s",
            )
        elif olds.get("node") and not news.get("deny_service_external_ips"):
            progress(
                node,
                "the server's API accepts Services with externalIPs, which take any address's traffic (the server's "
                "6443 or 22) to a pod (CVE-2020-8554); hk3s:network.approve_server_restart: true turns on "
                "DenyServiceExternalIPs (k3s restarts on the server; the API is down for 10-30 s)",
            )
        if olds.get("node") and not olds.get("secrets_encryption") and news.get("secrets_encryption") is True:
            progress(
                node,
                "plan: secrets-encryption is turned on: k3s restarts on the server (the API is down for 10-30 s), "
                "then the Secrets it already stores are re-encrypted (k3s secrets-encrypt rotate-keys)",
            )
        if not result.replaces and self._server_changed(olds, news):
            return DiffResult(changes=True, replaces=[], delete_before_replace=False)
        return result

    def _diff_inputs(self, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Who runs the server's firewall is checked at its first install only: never a reason
        # to reinstall a running server.
        return diff_inputs(
            olds, news, replace_on=self.replace_on, ignore=(*FIRST_INSTALL_ONLY, *READ_ONLY_INPUTS, "recorded_host_key")
        )

    def _server_changed(self, olds: dict[str, Any], news: dict[str, Any]) -> bool:
        """What the stored state cannot know, read from the running server when it can have changed:
        the kubeconfig k3s wrote at its last start (a new one whenever it signed a new admin
        certificate: a rotation, or a start inside the renewal window) and how long its own
        certificates have left. A changed kubeconfig is stored by this run (the Kubernetes provider
        and the API forward use it); certificates inside k3s's renewal window are named with the
        fix, and rotated by this run when hk3s:network.approve_server_restart allows a restart.

        A run with nothing to do logs in nowhere: outside the renewal window k3s signs nothing new
        at a start, so the kubeconfig changes only by a rotation by hand (after which `refresh`
        reads it) and the server is read only when the run uses the kubeconfig (Longhorn) or the
        recorded end is inside the window (or not recorded yet). A preview never logs in with an
        input it does not know yet (a login key or host key this run changes): it decides from
        the recorded end alone."""
        if not olds.get("kubeconfig") or not olds.get("api_endpoint"):
            return False
        node = str(news.get("node"))
        recorded_end = olds.get("certificates_end")
        left = int(recorded_end - time.time()) if isinstance(recorded_end, (int, float)) else None
        in_window = left is not None and server_certificate_warning(node, left, "?") is not None
        approved = news.get("approve_restart") is True
        if not (in_window or recorded_end is None or news.get("kubeconfig_used") is True):
            return False
        if not all(is_known(news.get(key)) for key in LOGIN_INPUTS):
            if in_window and left is not None:
                progress(
                    node,
                    f"warning: the first of the k3s server's certificates to end (as last read) {time_left(left)}; "
                    "the run reads them again once it can log in",
                )
            return bool(in_window and approved)
        try:
            found = run_operation(
                read_server_credentials(ssh_target(pin_recorded_host_key(olds, dict(news))), str(olds["api_endpoint"]))
            )
        except HostKeyChangedError:
            raise
        except SshError as error:
            # The run goes on: anything it changes on the server logs in again, and fails there.
            progress(node, f"the server's kubeconfig and certificates could not be read: {error}")
            return bool(in_window and approved)
        changed = found.kubeconfig != olds.get("kubeconfig")
        if changed:
            progress(
                node,
                "plan: the server's kubeconfig changed since the last run (k3s signed a new admin certificate); "
                "this run stores the new one",
            )
        if found.ends_at() != recorded_end:
            changed = True  # recorded, so the next runs decide from it without logging in
        warning = found.expiring()
        if warning and approved:
            progress(node, f"plan: the server's certificates are rotated: {found.first_end()}; k3s restarts (10-30 s)")
            return True
        if warning:
            progress(node, f"warning: {warning}")
        return changed

    def _install(self, props: dict[str, Any]) -> dict[str, Any]:
        from node_operations.host_preparation import prepare_host  # noqa: PLC0415 - loaded on first use

        inputs = K3sServerInputs.from_props(props)
        node = str(known(inputs.login.node))
        node_ip = str(known(inputs.node_ip))
        flannel_backend = str(known(inputs.flannel_backend))
        spec = ServerSpec(
            node=node,
            node_ip=node_ip,
            external_ip=str(known(inputs.node_external_ip)),
            pod_cidr=str(known(inputs.pod_cidr)),
            service_cidr=str(known(inputs.service_cidr)),
            flannel_backend=flannel_backend,
            flannel_external_ip=bool(known(inputs.flannel_external_ip)),
            # k3s advertises node-external-ip when it is set (k3s issues #2087, #5544); in private
            # mode the agents, the pods and the server's firewall use the private address.
            advertise_address=node_ip if known(inputs.network_mode) == "private" else None,
            ingress=bool(known(inputs.ingress)),
            binary=inputs.k3s.binary(),
            secrets_encryption=known(inputs.secrets_encryption) is True,
            deny_service_external_ips=known(inputs.deny_service_external_ips) is True,
            may_restart=known(inputs.approve_restart) is True,
        )
        # The server gets the workers' host preparation and hardening before k3s runs on it.
        pod_network = known(inputs.pod_network) or ("wireguard" if "wireguard" in flannel_backend else "vxlan")
        target = ssh_target(inputs.login)
        run_operation(prepare_host(target, str(pod_network), lambda line: progress(node, line)))
        installed = run_operation(install_server(target, spec, lambda line: progress(node, line)))
        return {
            **props,
            "version": installed.version,
            "ca_hash": installed.ca_hash,
            "kubeconfig": installed.kubeconfig,
            "api_endpoint": installed.api_endpoint,
            "certificates_end": installed.certificates_end,
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        from node_operations.host_firewall.operator_firewall import require_host_firewall  # noqa: PLC0415 - loaded on first use

        inputs = K3sServerInputs.from_props(props)
        if known(inputs.firewall_managed) is False:
            # The operator runs the server's firewall: with none active every port the server
            # listens on (the API's, the kubelet's, 8888/tcp) is open to whoever reaches it, and
            # one that opens any of them wider than the plan lets those sources in. Stop before
            # the host changes (none active: unless the stack acknowledges it), as a join does.
            acknowledged = known(inputs.no_firewall_acknowledged) is True
            rules = known(inputs.operator_firewall_rules) or []
            pod_network = known(inputs.pod_network) or POD_NETWORK_OF_BACKEND.get(
                str(known(inputs.flannel_backend)), "vxlan"
            )
            run_operation(
                require_host_firewall(
                    ssh_target(inputs.login),
                    port_rules_from(rules),
                    listening=listening_ports("server", str(pod_network)),
                    none_acknowledged=acknowledged,
                )
            )
        # Deterministic id: a create retried after a crash adopts the k3s it installed.
        return CreateResult(id_=f"{props['node']}-k3s", outs=self._install(props))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if self._diff_inputs(olds, news).changes or not olds.get("api_endpoint"):
            return UpdateResult(outs=self._install(news))
        # Only the server changed (diff: a new kubeconfig, certificates to rotate): no reinstall.
        inputs = K3sServerInputs.from_props(news)
        node = str(known(inputs.login.node))
        found = run_operation(
            refresh_server_credentials(
                ssh_target(inputs.login),
                str(olds["api_endpoint"]),
                rotate=known(inputs.approve_restart) is True,
                progress=lambda line: progress(node, line),
            )
        )
        outputs = {key: olds.get(key) for key in ("version", "ca_hash", "api_endpoint")}
        return UpdateResult(
            outs={**news, **outputs, "kubeconfig": found.kubeconfig, "certificates_end": found.ends_at()}
        )

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        login = K3sServerInputs.from_props(props).login
        node = str(known(login.node))
        state = run_operation(read_server_state(ssh_target(login)))
        if state is None:
            progress(node, "k3s is not running on the server")
            return ReadResult(id_=id_, outs={**props, "version": None})
        outs = {**props, "version": state.version, "ca_hash": state.ca_hash}
        if props.get("api_endpoint"):
            # The kubeconfig k3s wrote at its last start: a rotation or a start inside the renewal
            # window signs a new admin certificate, and the stored one would go stale.
            found: ServerCredentials = run_operation(read_server_credentials(ssh_target(login), props["api_endpoint"]))
            outs["kubeconfig"] = found.kubeconfig
            outs["certificates_end"] = found.ends_at()
            if found.expiring():
                progress(node, f"warning: {found.expiring()}")
        return ReadResult(id_=id_, outs=outs)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        inputs = K3sServerInputs.from_props(props)
        node = str(known(inputs.login.node))
        if known(inputs.teardown_allowed) is True:
            # The stack's teardown: the cluster's data goes with it.
            outcome = run_operation(wipe_node(ssh_target(inputs.login), lambda line: progress(node, line)))
            progress(node, outcome.report())
            return
        run_operation(stop_server(ssh_target(inputs.login)))
        progress(
            node, "k3s stopped and disabled; its data stays (rm -rf /var/lib/rancher/k3s /etc/rancher/k3s wipes it)"
        )


class K3sServer(Resource, module="hk3s", name="K3sServer"):
    """k3s on the server: version, CA hash, kubeconfig (secret), API endpoint."""

    version: pulumi.Output[str]
    ca_hash: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    api_endpoint: pulumi.Output[str]
    certificates_end: pulumi.Output[int | None]

    def __init__(self, resource_name: str, inputs: K3sServerInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        props = resource_inputs(inputs, ["version", "ca_hash", "kubeconfig", "api_endpoint", "certificates_end"])
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"]))
        super().__init__(K3sServerProvider(), resource_name, props, opts)
