"""StorageCopies: Longhorn with the program's departures from its defaults (one
copy unless a workload asks for two, never two copies on one node, no data
locality or auto-balance that would move copies behind the operator's back),
kept as Longhorn's Setting objects after the install (components/longhorn_settings.py),
and one storage class per number of copies offered. The chart comes from its repository,
or from a local path (storage.longhorn_chart) for an air-gapped install."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from cluster_settings.models import StorageSettings
from components.longhorn_network import longhorn_network_policies
from components.longhorn_settings import LONGHORN_NAMESPACE, LonghornSettingPatch, kept_settings, teardown_setting
from node_operations.control_plane_lost import (
    ControlPlaneAnswersError,
    answers_refusal,
    control_plane_answer,
    lost_hint,
)
from node_operations.longhorn_node_role import COPIES_TAG, SERVER_TAG
from providers.base import run_operation
from providers.copies_offer import CopiesOffer, CopiesOfferInputs
from providers.inputs import NodeLogin
from remote_access.api_forward import ApiForward, ApiForwardError, forwarded_kubeconfig, open_api_forward
from remote_access.ssh import SshError, SshTarget

LONGHORN_CHART_REPO = "https://charts.longhorn.io"
STORAGE_CLASS_BY_COPIES = {1: "hk3s-one-copy", 2: "hk3s-two-copies"}


def longhorn_values(storage: StorageSettings, node_taints: Sequence[str] = ()) -> dict[str, Any]:
    """Helm values: the kept settings as the chart's defaultSettings (the values Longhorn's
    manager starts from), and no default storage class of the chart's own.

    Longhorn runs on every node, tainted ones too: a node whose Longhorn manager pod does not
    run gets no Longhorn node (the program's LonghornNodeRole waits for it and fails) and its
    pods cannot mount a volume. Longhorn's manager is a DaemonSet with no tolerations of its own,
    and its system components (CSI plugin, instance and engine image managers) tolerate only
    what the `taint-toleration` setting names (Longhorn's "Taints and Tolerations" docs), so every
    taint the settings give a node (`node_taints`, `key=value:Effect` or `key:Effect`) is
    tolerated by both: the chart's `longhornManager.tolerations` and its default setting
    `taintToleration` (Longhorn's format, the taints joined by `;`)."""
    values: dict[str, Any] = {
        "defaultSettings": {setting.helm_key: setting.value for setting in kept_settings(storage)},
        "persistence": {"defaultClass": False, "defaultClassReplicaCount": 1},
    }
    taints = sorted(set(node_taints))
    if taints:
        values["longhornManager"] = {"tolerations": [_toleration(taint) for taint in taints]}
        values["defaultSettings"]["taintToleration"] = ";".join(taints)
    return values


def _toleration(taint: str) -> dict[str, str]:
    """The Kubernetes toleration of exactly `taint` (`key=value:Effect`, or `key:Effect`: any value)."""
    head, _, effect = taint.rpartition(":")
    key, has_value, value = head.partition("=")
    if has_value:
        return {"key": key, "operator": "Equal", "value": value, "effect": effect}
    return {"key": key, "operator": "Exists", "effect": effect}


def longhorn_chart_source(storage: StorageSettings) -> dict[str, Any]:
    """Where the Helm release takes the chart from: a local path (storage.longhorn_chart), else
    Longhorn's chart repository."""
    if storage.longhorn_chart is not None:
        return {"chart": str(storage.longhorn_chart.expanduser().resolve())}
    return {"chart": "longhorn", "repository_opts": k8s.helm.v3.RepositoryOptsArgs(repo=LONGHORN_CHART_REPO)}


def storage_class_parameters(copies: int) -> dict[str, str]:
    """Parameters of the storage class that keeps `copies` copies."""
    return {
        "numberOfReplicas": str(copies),
        "dataLocality": "disabled",
        "replicaAutoBalance": "disabled",
        # One copy is pinned to the server; two copies go to nodes that passed the disk probe.
        "nodeSelector": SERVER_TAG if copies == 1 else COPIES_TAG,
        "staleReplicaTimeout": "30",
    }


@dataclass(frozen=True)
class StorageCopiesArgs:
    """Arguments of `StorageCopies`."""

    storage: StorageSettings
    """hk3s:storage."""
    kubeconfig: pulumi.Output[str]
    """The server's kubeconfig (a secret)."""
    after: Sequence[pulumi.Resource]
    """What must exist first (the server's k3s)."""
    server_login: NodeLogin | None = None
    """How to log in to the server: the Kubernetes provider reaches the API through a forward of
    that SSH connection (remote_access.api_forward)."""
    forward_port: int = 0
    """The forward's local port (hk3s:cluster.api_forward_port, else derived from the stack)."""
    teardown_allowed: bool = False
    """hk3s:cluster.teardown: a destroy may then forget Longhorn's objects once the API is gone."""
    open_forward: Callable[[SshTarget, int], ApiForward] | None = None
    """Opens the forward; None: `open_api_forward`."""
    cluster_identity: pulumi.Input[str] | None = None
    """What names the cluster the Kubernetes provider talks to (`cluster_identity`); None: the
    provider's own rule (a changed or unknown kubeconfig replaces it)."""
    control_plane_lost: bool = False
    """hk3s:cluster.control_plane_lost (only with a teardown allowed): no forward is opened, the
    server is checked to answer no more, and the in-cluster objects are forgotten by the destroy
    (retain_on_delete) instead of deleted through an API that is gone."""
    wiped_after: Sequence[pulumi.Resource] = ()
    """What wipes a worker when a teardown deletes it (each worker's join): Longhorn's namespace,
    and with it its release, depend on them, so a destroy uninstalls Longhorn before any worker
    is wiped."""
    node_taints: Sequence[str] = ()
    """Every taint the settings give a node: Longhorn's manager and components tolerate them
    (`longhorn_values`)."""


def cluster_identity(server_name: str, machine: pulumi.Input[str]) -> pulumi.Output[str]:
    """The Kubernetes provider's `cluster_identifier`: the server's node name and its machine (its
    Hetzner server id, or the address of an existing host).

    pulumi-kubernetes replaces a provider whose kubeconfig is unknown in a preview or names another
    server, and with it every object it made (provider.go DiffConfig); with an identifier that is
    unchanged it updates it instead. The kubeconfig is unknown in the preview of any run that
    updates the server's k3s (an upgrade, a key rotation, hk3s:cluster.teardown), and its `server:`
    is the forward's local port (hk3s:cluster.api_forward_port, or one derived from the project and
    stack names): none of them is another cluster. A new machine is: its id (or address) is unknown
    until it exists, so the identifier changes and the provider and Longhorn's objects are made
    again on it. The stack's own names are left out, so renaming it moves nothing."""
    return pulumi.Output.concat("hk3s-server/", server_name, "/", machine)


def forwarded(args: StorageCopiesArgs) -> pulumi.Output[str]:
    """The kubeconfig the Kubernetes provider uses: the API at the local end of a forward of
    the server's SSH session, opened once the login is known (in `preview` as in `up`)."""
    login = args.server_login
    if login is None:
        return args.kubeconfig

    def through(values: list[Any]) -> str:
        address, ssh_port, user, private_key, host_key, kubeconfig = values
        target = SshTarget(
            node=str(login.node),
            address=str(address),
            port=int(ssh_port or 22),
            user=str(user or "root"),
            private_key=str(private_key),
            recorded_host_key=host_key or None,
        )
        if args.control_plane_lost:
            # Nothing is opened: the provider meets a closed port, takes the cluster as unreachable
            # and, with delete_unreachable, lets the destroy go on past Longhorn's objects.
            answer = run_operation(control_plane_answer(target))
            if answer is not None:
                raise ControlPlaneAnswersError(answers_refusal(answer))
            return forwarded_kubeconfig(str(kubeconfig), args.forward_port)
        try:
            forward = (args.open_forward or open_api_forward)(target, args.forward_port)
        except SshError as error:
            if not args.teardown_allowed:
                raise
            # A teardown stopped by a server that does not answer: say the one way on if it is gone.
            raise ApiForwardError(error.node, lost_hint(str(error).removeprefix(f"{error.node}: "))) from None
        return forwarded_kubeconfig(str(kubeconfig), forward.port)

    return pulumi.Output.secret(
        pulumi.Output.all(
            login.address, login.ssh_port, login.ssh_user, login.private_key, login.recorded_host_key, args.kubeconfig
        ).apply(through)
    )


class StorageCopies(pulumi.ComponentResource):
    """Longhorn and the storage classes for one and (when offered) two copies."""

    storage_classes: pulumi.Output[list[str]]

    def __init__(self, name: str, args: StorageCopiesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("hk3s:index:StorageCopies", name, None, opts)
        storage = args.storage
        classes: list[str] = []
        self.release: pulumi.Resource | None = None
        """Longhorn's Helm release (its CRDs and manager), when the stack installs Longhorn."""
        self.logins: list[pulumi.Resource] = []
        """Its resources that log in to the server (a rotated login key waits for them)."""
        if storage.install_longhorn:
            # With the control plane lost, a delete of these objects could only fail on the API that
            # is gone: the destroy removes them from the state alone (they went with the server).
            forget = args.control_plane_lost
            # Nor can they change: the run that records the loss keeps each as the state holds it.
            kept = ["*"] if forget else None
            provider = k8s.Provider(
                f"{name}-kubernetes",
                kubeconfig=forwarded(args),
                # Only in a teardown: Longhorn's objects go with the cluster, so once the API is
                # gone they are forgotten. Otherwise an API that does not answer stops the run.
                delete_unreachable=args.teardown_allowed,
                cluster_identifier=args.cluster_identity,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)),
            )
            # Before anything of Longhorn changes: a lower offer is refused while volumes keep more copies.
            offer = (
                [
                    CopiesOffer(
                        f"{name}-copies-offer",
                        CopiesOfferInputs(login=args.server_login, max_copies=storage.max_copies),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.after)),
                    )
                ]
                if args.server_login is not None
                else []
            )
            self.logins = list(offer)
            # A destroy deletes a resource only after everything that depends on it. Longhorn's
            # uninstall (the release's pre-delete job) reaches every node's Longhorn, and the
            # namespace's delete waits for the pods on every node to end: both must be done before
            # a worker is wiped (its join's delete in a teardown), so the namespace depends on the
            # joins and the release on the namespace.
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=LONGHORN_NAMESPACE),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=provider,
                    depends_on=[*offer, *args.wiped_after],
                    retain_on_delete=forget,
                    ignore_changes=kept,
                ),
            )
            # Before Longhorn's pods exist: its API and UI have no authentication
            # (components/longhorn_network.py says who may reach them).
            policies = [
                k8s.networking.v1.NetworkPolicy(
                    f"{name}-{policy_name}",
                    metadata=k8s.meta.v1.ObjectMetaArgs(name=policy_name, namespace=LONGHORN_NAMESPACE),
                    spec=spec,
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        provider=provider,
                        depends_on=[namespace],
                        retain_on_delete=forget,
                        ignore_changes=kept,
                    ),
                )
                for policy_name, spec in longhorn_network_policies(storage.longhorn_api_clients).items()
            ]
            release = k8s.helm.v3.Release(
                f"{name}-longhorn",
                name="longhorn",
                version=storage.longhorn_version,
                namespace=LONGHORN_NAMESPACE,
                values=longhorn_values(storage, args.node_taints),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=provider,
                    depends_on=[namespace, *policies],
                    retain_on_delete=forget,
                    ignore_changes=kept,
                ),
                **longhorn_chart_source(storage),
            )
            self.release = release
            for setting in [*kept_settings(storage), teardown_setting(args.teardown_allowed)]:
                LonghornSettingPatch(
                    f"{name}-setting-{setting.name}",
                    setting,
                    # Retained: deleting a patch gives its field back, which would empty the setting
                    # (Longhorn's manager set it before the program took it over). A setting the
                    # program stops keeping keeps its last value; a teardown removes it with Longhorn.
                    pulumi.ResourceOptions(
                        parent=self, provider=provider, depends_on=[release], retain_on_delete=True, ignore_changes=kept
                    ),
                )
            for copies in range(1, storage.max_copies + 1):
                class_name = STORAGE_CLASS_BY_COPIES[copies]
                k8s.storage.v1.StorageClass(
                    f"{name}-{class_name}",
                    metadata=k8s.meta.v1.ObjectMetaArgs(name=class_name),
                    provisioner="driver.longhorn.io",
                    # Retain: deleting a claim never deletes the data with it.
                    reclaim_policy="Retain",
                    allow_volume_expansion=True,
                    volume_binding_mode="Immediate",
                    parameters=storage_class_parameters(copies),
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        provider=provider,
                        depends_on=[release, *offer],
                        retain_on_delete=forget,
                        ignore_changes=kept,
                    ),
                )
                classes.append(class_name)
        self.storage_classes = pulumi.Output.from_input(classes)
        self.register_outputs({"storage_classes": self.storage_classes})
