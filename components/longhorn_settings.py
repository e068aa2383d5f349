"""Longhorn's settings the program keeps.

Longhorn keeps each setting as a `settings.longhorn.io` object (apiVersion longhorn.io/v1beta2,
kind Setting, namespace longhorn-system, named after the setting, its value a string in the
top-level `value` field), which Longhorn's manager creates at its start with Longhorn's default
or the chart's `defaultSettings` value. The program patches the settings it depends on after the
Helm release, by server-side apply with the Kubernetes provider's patch resource, so that
`pulumi refresh` sees a setting changed by hand (in the UI, with kubectl) as drift and the next
`pulumi up` puts the program's value back. The chart's `defaultSettings` carry the same values,
so a manager that re-reads them at a restart agrees with the program.

Names, value formats and Longhorn's defaults are those of longhorn-manager's types/setting.go for
the chart the program pins (storage.longhorn_version, 1.9.x): every value is a string, a boolean
"true" or "false".
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from cluster_settings.models import StorageSettings

LONGHORN_NAMESPACE = "longhorn-system"
SETTING_API_VERSION = "longhorn.io/v1beta2"
# The provider's own annotations on a patch resource: take the field over from whoever set it last
# (the manager at its start, a person with kubectl), and apply under one field manager of ours.
PATCH_FORCE_ANNOTATION = "pulumi.com/patchForce"
PATCH_FIELD_MANAGER_ANNOTATION = "pulumi.com/patchFieldManager"
FIELD_MANAGER = "hk3s"


@dataclass(frozen=True)
class LonghornSetting:
    """One Longhorn setting the program keeps."""

    name: str
    """The Setting object's name (Longhorn's setting name)."""
    helm_key: str
    """Its key under the chart's `defaultSettings`."""
    value: int | bool | str
    """The program's value."""
    longhorn_default: str
    """Longhorn's own default, as the Setting object holds it."""

    @property
    def text(self) -> str:
        """The value as the Setting object holds it."""
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return str(self.value)


def kept_settings(storage: StorageSettings) -> list[LonghornSetting]:
    """The settings the program depends on, with its values."""
    return [
        # Departs from Longhorn's 3: a volume keeps one copy unless its storage class asks for two
        # (storage.max_copies). Only the server and workers whose disk passed the probe hold copies,
        # and two copies never share a node, so a third copy would often have nowhere to go and
        # leave every volume made outside a storage class degraded.
        LonghornSetting("default-replica-count", "defaultReplicaCount", 1, "3"),
        # Longhorn's default, kept: two copies on one node are lost together with that node, so a
        # second copy waits unscheduled rather than land beside the first.
        LonghornSetting("replica-soft-anti-affinity", "replicaSoftAntiAffinity", False, "false"),
        # Longhorn's default, kept: best-effort or strict-local would build a copy on whichever node
        # runs the pod, also on a worker that failed the disk probe or opted out of holding copies.
        LonghornSetting("default-data-locality", "defaultDataLocality", "disabled", "disabled"),
        # Longhorn's default, kept: auto-balance moves copies between nodes by itself, under a
        # removal or a drain that the program has checked against where the copies were.
        LonghornSetting("replica-auto-balance", "replicaAutoBalance", "disabled", "disabled"),
        # Longhorn's default, kept: a two-copy volume with one eligible node is still created and
        # runs on one copy; the second is placed once a node qualifies.
        LonghornSetting(
            "allow-volume-creation-with-degraded-availability",
            "allowVolumeCreationWithDegradedAvailability",
            True,
            "true",
        ),
        # Longhorn's defaults (30 and 25) unless storage.reserved_percent / minimal_available_percent
        # say otherwise: the share of a node's disk the system and images keep.
        LonghornSetting(
            "storage-reserved-percentage-for-default-disk",
            "storageReservedPercentageForDefaultDisk",
            storage.reserved_percent,
            "30",
        ),
        LonghornSetting(
            "storage-minimal-available-percentage",
            "storageMinimalAvailablePercentage",
            storage.minimal_available_percent,
            "25",
        ),
        # Longhorn's default, kept: only a fence the operator recorded (hk3s:fences) deletes a down
        # node's pods; Longhorn force-deleting them on a node that is only unreachable could run a
        # pod twice against one volume.
        LonghornSetting("node-down-pod-deletion-policy", "nodeDownPodDeletionPolicy", "do-nothing", "do-nothing"),
        # Longhorn's default, kept: a drain (a reboot, a removal) never takes away the last healthy
        # copy of a volume.
        LonghornSetting(
            "node-drain-policy", "nodeDrainPolicy", "block-if-contains-last-replica", "block-if-contains-last-replica"
        ),
    ]


def teardown_setting(teardown_allowed: bool) -> LonghornSetting:
    """Longhorn's own guard against its uninstall, kept at the stack's hk3s:cluster.teardown.

    Longhorn's chart refuses to uninstall (its pre-delete hook, `longhorn-manager uninstall`, exits)
    unless `deleting-confirmation-flag` is true (longhorn-manager app/uninstall.go; default false in
    types/setting.go). A destroy deletes the Helm release, so the `up` that allows the teardown sets
    it true, and any other `up` keeps it false: an uninstall nobody allowed stays refused, by Longhorn
    too. Not in the chart's defaultSettings: changing it must not upgrade the Helm release."""
    return LonghornSetting("deleting-confirmation-flag", "deletingConfirmationFlag", teardown_allowed, "false")


class LonghornSettingPatch(pulumi.CustomResource):
    """One Longhorn Setting's `value`, applied server-side over the object Longhorn's manager
    created: the Kubernetes provider's patch resource for a custom resource
    (`kubernetes:longhorn.io/v1beta2:SettingPatch`). The SDK's CustomResourcePatch carries only a
    `spec`, and a Setting keeps its value at the top level, hence this class."""

    value: pulumi.Output[str]

    def __init__(self, resource_name: str, setting: LonghornSetting, opts: pulumi.ResourceOptions) -> None:
        properties = {
            "apiVersion": SETTING_API_VERSION,
            "kind": "Setting",
            "metadata": {
                "name": setting.name,
                "namespace": LONGHORN_NAMESPACE,
                "annotations": {PATCH_FORCE_ANNOTATION: "true", PATCH_FIELD_MANAGER_ANNOTATION: FIELD_MANAGER},
            },
            "value": setting.text,
        }
        super().__init__(f"kubernetes:{SETTING_API_VERSION}:SettingPatch", resource_name, properties, opts)
