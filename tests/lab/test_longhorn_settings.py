"""Longhorn's settings as the program keeps them, through the real engine and the real Kubernetes
provider plugin (lab/build/k8s_provider.sh) against the lab's real kube-apiserver, reached through
the forward of the server's SSH session. Longhorn itself cannot be fetched here: the product
installs the lab's stand-in chart (lab/longhorn_standin: Longhorn's CRDs and its Setting objects
at Longhorn's defaults, no manager) through its air-gapped path, storage.longhorn_chart.

After `up` every kept setting reads back with the program's value; a setting changed by hand
(kubectl on the server) is seen as drift by a refresh (through the operator API, which opens the
forward a refresh needs) and put back by the next `up`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    LabStack,
    base_config,
    server_spec,
    skip_without_kubernetes_provider,
    up_or_fail,
)

pytestmark = pytest.mark.lab

SETTING_PATCH = "kubernetes:longhorn.io/v1beta2:SettingPatch"
# What every kept setting must read back as: Longhorn's Setting name -> value, written out here (not
# read from the component) so a wrong value or a missing patch fails. The percentages are the
# stack's (20 and 15), away from Longhorn's defaults (30 and 25), which the stand-in starts at.
EXPECTED = {
    "default-replica-count": "1",
    "replica-soft-anti-affinity": "false",
    "default-data-locality": "disabled",
    "replica-auto-balance": "disabled",
    "allow-volume-creation-with-degraded-availability": "true",
    "storage-reserved-percentage-for-default-disk": "20",
    "storage-minimal-available-percentage": "15",
    "node-down-pod-deletion-policy": "do-nothing",
    "node-drain-policy": "block-if-contains-last-replica",
    # Longhorn's guard against its uninstall: kept false until hk3s:cluster.teardown allows it.
    "deleting-confirmation-flag": "false",
}


def _kubectl(server: Host, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return server.run(["/usr/local/bin/k3s", "kubectl", "-n", "longhorn-system", *args], check=check)


def _live_settings(server: Host) -> dict[str, str]:
    items = json.loads(_kubectl(server, "get", "settings.longhorn.io", "-o", "json").stdout)["items"]
    return {item["metadata"]["name"]: item["value"] for item in items}


def _longhorn_node(server: Host, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = _kubectl(server, "get", "nodes.longhorn.io", server.name, "-o", "json", check=False)
        if got.returncode == 0 and json.loads(got.stdout).get("status", {}).get("diskStatus"):
            return dict(json.loads(got.stdout))
        if time.monotonic() > deadline:
            raise AssertionError(f"no Longhorn node for {server.name} after {timeout:.0f}s: {got.stderr}")
        time.sleep(1)


def _recorded_settings(stack: LabStack) -> dict[str, str]:
    """The kept settings' values as the stack's state records them."""
    deployment = stack.stack().export_stack().deployment or {}
    resources = deployment["resources"]
    return {r["outputs"]["metadata"]["name"]: r["outputs"]["value"] for r in resources if r["type"] == SETTING_PATCH}


def test_longhorn_settings_are_kept_and_put_back(lab: Lab, tmp_path: Path) -> None:
    skip_without_kubernetes_provider()
    server = lab.add_host(server_spec("lh-server"))
    lab.wait_ssh_ready([server])
    stack = LabStack(tmp_path)
    storage = {
        "install_longhorn": True,
        "longhorn_chart": str(LONGHORN_STANDIN_CHART),
        "reserved_percent": 20,
        "minimal_available_percent": 15,
    }
    stack.write_config(base_config(lab, server, [], storage=storage))
    up_or_fail(stack)

    live = _live_settings(server)
    assert {name: live.get(name) for name in EXPECTED} == EXPECTED
    # A setting the program does not keep stays at Longhorn's default.
    assert live["engine-replica-timeout"] == "8"
    assert _recorded_settings(stack) == EXPECTED
    # The lab's Longhorn manager stand-in, started beside the stack, made the server's Longhorn node
    # with its disk's real figures.
    node = _longhorn_node(server)
    (disk,) = node["status"]["diskStatus"].values()
    assert disk["storageMaximum"] > 0 and node["spec"]["disks"]

    # The storage classes went in through the same provider.
    classes = _kubectl(server, "get", "storageclass", "-o", "name").stdout.split()
    assert "storageclass.storage.k8s.io/hk3s-one-copy" in classes

    # By hand, as an operator in Longhorn's UI or with kubectl would.
    _kubectl(server, "patch", "settings.longhorn.io", "default-replica-count", "--type", "merge", "-p", '{"value":"3"}')
    # A value Longhorn refuses is refused by the stand-in too.
    bad = ["patch", "settings.longhorn.io", "node-drain-policy", "--type", "merge", "-p", '{"value":"x"}']
    refused = _kubectl(server, *bad, check=False)
    assert refused.returncode != 0 and "node-drain-policy is not one of Longhorn's choices" in refused.stderr

    # Through the operator API, as an operator refreshes: a refresh does not run the program, so
    # the API opens the forward to the Kubernetes API the provider's kubeconfig points at.
    stack.api().refresh()
    assert _recorded_settings(stack) == {**EXPECTED, "default-replica-count": "3"}, "refresh did not see the drift"
    assert _live_settings(server)["default-replica-count"] == "3"

    result = up_or_fail(stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert changes.get("update") == 1, changes
    assert _live_settings(server)["default-replica-count"] == "1"
    assert _recorded_settings(stack) == EXPECTED
