"""Longhorn's settings as the program keeps them, through the real engine and the real Kubernetes
provider plugin (lab/build/k8s_provider.sh) against the lab's real kube-apiserver, reached through
the forward of the server's SSH session. Longhorn itself cannot be fetched here: the product
installs the lab's stand-in chart (lab/longhorn_standin: Longhorn's CRDs and its Setting objects
at Longhorn's defaults, no manager) through its air-gapped path, storage.longhorn_chart.

After `up` every kept setting reads back with the program's value; a setting changed by hand
(kubectl on the server) is seen as drift by a refresh (through the operator API, which opens the
forward a refresh needs) and put back by the next `up`."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

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


@dataclass
class LonghornStack:
    lab: Lab
    server: Host
    stack: LabStack
    storage: dict[str, Any]

    def config(self, **network: Any) -> dict[str, Any]:
        config = base_config(self.lab, self.server, [], storage=self.storage)
        config.setdefault("network", {}).update(network)
        return config


@pytest.fixture(scope="module")
def longhorn_stack(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> LonghornStack:
    """One server running Longhorn (the stand-in chart) through the Kubernetes provider; the tests
    share it and run in order."""
    skip_without_kubernetes_provider()
    server = lab.add_host(server_spec("lh-server"))
    lab.wait_ssh_ready([server])
    storage = {
        "install_longhorn": True,
        "longhorn_chart": str(LONGHORN_STANDIN_CHART),
        "reserved_percent": 20,
        "minimal_available_percent": 15,
    }
    found = LonghornStack(lab, server, LabStack(tmp_path_factory.mktemp("longhorn-settings")), storage)
    found.stack.write_config(found.config())
    up_or_fail(found.stack)
    return found


def test_longhorn_settings_are_kept_and_put_back(longhorn_stack: LonghornStack) -> None:
    server, stack = longhorn_stack.server, longhorn_stack.stack
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


def _kubeconfig_copies(directory: Path) -> list[Path]:
    """Files the Kubernetes provider wrote its kubeconfig to (`os.CreateTemp("", "kubeconfig")`),
    anywhere under `directory`."""
    return sorted(path for path in directory.rglob("kubeconfig*") if path.is_file())


def test_scripts_hk3s_leaves_no_copy_of_the_admin_kubeconfig_in_the_temporary_directory(
    longhorn_stack: LonghornStack, tmp_path: Path
) -> None:
    """pulumi-kubernetes writes the kubeconfig it is configured with to a new file in $TMPDIR at
    every start (provider.go, `writeKubeconfigToFile` for Helm's settings) and never removes it:
    each run by hand leaves a copy of the cluster's admin credentials (the client key of
    cluster-admin) in the temporary directory, 192 of them in /tmp after one lab run. A run
    through scripts/hk3s (and so the operator API) gives the engine a temporary directory of its
    own (0700, inside $TMPDIR) and removes it with everything in it when the run ends."""
    stack = longhorn_stack.stack
    stack.env["TMPDIR"] = str(tmp_path)
    try:
        # As typed by hand (`pulumi preview`): the provider's copy stays behind.
        stack.preview()
        left = _kubeconfig_copies(tmp_path)
        assert left, f"the Kubernetes provider left no kubeconfig in {tmp_path}: this test no longer shows the leak"
        assert "client-key-data" in left[0].read_text()
        for path in left:
            path.unlink()

        run = stack.hk3s("up", "--yes")
        assert run.returncode == 0, run.output + run.stderr
        assert _kubeconfig_copies(tmp_path) == [], "scripts/hk3s up left the cluster's admin kubeconfig behind"
        assert list(tmp_path.glob("hk3s-run-*")) == [], "the run's temporary directory was not removed"
    finally:
        stack.env.pop("TMPDIR", None)


K3S = "/usr/local/bin/k3s"
SHORT_CERTS = "/etc/systemd/system/k3s.service.d/lab-short-certificates.conf"
SERVER_TLS = "/var/lib/rancher/k3s/server/tls"


def _admin_certificate(kubeconfig: str) -> x509.Certificate:
    """The client certificate a kubeconfig authenticates with (the first of its chain)."""
    user = yaml.safe_load(kubeconfig)["users"][0]["user"]
    return x509.load_pem_x509_certificate(base64.b64decode(user["client-certificate-data"]))


def _server_admin_certificate(server: Host) -> x509.Certificate:
    return _admin_certificate(server.run(["cat", "/etc/rancher/k3s/k3s.yaml"]).stdout)


def _stored_kubeconfig(stack: LabStack) -> tuple[str, bool]:
    """The server's kubeconfig as the state records it (the K3sServer resource's output, what the
    Kubernetes provider and the API forward are given; a refresh updates it, not the stack's
    outputs, which only an up sets) and whether it is still a secret."""
    deployment = stack.stack().export_stack().deployment or {}
    (server,) = [r for r in deployment["resources"] if r["urn"].endswith("-k3s") and "ca_hash" in r.get("outputs", {})]
    value = server["outputs"]["kubeconfig"]
    if isinstance(value, dict) and "plaintext" in value:
        return str(json.loads(value["plaintext"])), True
    return str(value), False


def _serial(path: str, server: Host) -> str:
    return server.run(["openssl", "x509", "-serial", "-noout", "-in", path]).stdout.strip()


def _rotate_by_hand(server: Host) -> None:
    """As k3s's documentation has it: stop k3s, `k3s certificate rotate`, start k3s."""
    server.run(["systemctl", "stop", "k3s"], timeout=120)
    server.run([K3S, "certificate", "rotate"])
    server.run(["systemctl", "start", "k3s"], timeout=300)


def _short_certificates(server: Host) -> None:
    """The stand-in's lab setting (lab/k3s_standin/certlife.go): certificates signed from now on last
    3 hours and are renewed at a start within 10 minutes of their end (k3s: a year and 90 days)."""
    server.run(
        [
            "sh",
            "-c",
            f"mkdir -p {SHORT_CERTS.rsplit('/', 1)[0]} && printf '%s\\n' '[Service]' "
            "'Environment=HK3S_LAB_CERT_LIFETIME=3h' 'Environment=HK3S_LAB_CERT_RENEW_WINDOW=10m' "
            f"> {SHORT_CERTS} && systemctl daemon-reload",
        ]
    )


def test_refresh_and_every_up_store_the_kubeconfig_the_server_wrote(longhorn_stack: LonghornStack) -> None:
    """k3s writes a new kubeconfig (a new admin client certificate) whenever it signs one: after a
    rotation, or at a start within the renewal window. The next `up` stores it without being asked
    (before the Kubernetes provider and the API forward use it), and so does a `refresh`; it stays
    a Pulumi secret."""
    server, stack = longhorn_stack.server, longhorn_stack.stack
    before = _server_admin_certificate(server)
    assert _admin_certificate(_stored_kubeconfig(stack)[0]).serial_number == before.serial_number
    _rotate_by_hand(server)
    rotated = _server_admin_certificate(server)
    assert rotated.serial_number != before.serial_number
    up_or_fail(stack)
    stored, secret = _stored_kubeconfig(stack)
    assert _admin_certificate(stored).serial_number == rotated.serial_number, "up kept the stale kubeconfig"
    assert secret, "the stored kubeconfig is no longer a secret"
    # Longhorn's settings are read and kept through the Kubernetes provider, on the new credentials.
    assert {name: _live_settings(server).get(name) for name in EXPECTED} == EXPECTED

    # Rotated again, now with the lab's short-lived certificates (the next test's starting point).
    _short_certificates(server)
    _rotate_by_hand(server)
    again = _server_admin_certificate(server)
    stack.api().refresh()
    stored, secret = _stored_kubeconfig(stack)
    assert _admin_certificate(stored).serial_number == again.serial_number, "refresh kept the stale kubeconfig"
    assert secret, "the refreshed kubeconfig is no longer a secret"


def test_the_server_certificates_are_named_before_their_end_and_rotated_when_allowed(
    longhorn_stack: LonghornStack,
) -> None:
    """k3s signs the server's own certificates for a year and renews them only at a start within 90
    days of their end (deps.go); the lab's stand-in does the same with hours and minutes. Certificates
    three hours from their end are inside k3s's window: `status --check` and `up` name them and the
    fix; an `up` that may restart the server rotates them and stores the new kubeconfig in the same
    run."""
    server, stack = longhorn_stack.server, longhorn_stack.stack
    _short_certificates(server)
    if _server_admin_certificate(server).not_valid_after_utc.timestamp() - time.time() > 3 * 3600:
        _rotate_by_hand(server)  # the previous test did not get this far
    short = _server_admin_certificate(server)
    hours_left = (short.not_valid_after_utc.timestamp() - time.time()) / 3600
    assert 2 < hours_left <= 3, hours_left

    # status --check names the server's certificates and the fix.
    status = stack.api().status(check_hosts=True)
    warnings = "\n".join(status.warnings)
    assert "lh-server: the k3s server's certificate " in warnings, warnings
    assert "expires in 2 hours" in warnings and "k3s certificate rotate" in warnings, warnings
    assert "approve_server_restart" in warnings, warnings

    # An up that may not restart the server warns, naming the fix, and changes nothing on it.
    serving = _serial(f"{SERVER_TLS}/serving-kube-apiserver.crt", server)
    output = stack.up_output()
    assert output == "", output
    text = stack.text()
    assert "lh-server: the k3s server's certificate " in text and "k3s certificate rotate" in text, text[-3000:]
    assert _serial(f"{SERVER_TLS}/serving-kube-apiserver.crt", server) == serving

    # With server restarts allowed, the run rotates them itself and stores the kubeconfig.
    stack.write_config(longhorn_stack.config(approve_server_restart=True))
    try:
        up_or_fail(stack)
        after = _server_admin_certificate(server)
        assert after.serial_number != short.serial_number, "up did not rotate the certificates"
        assert _serial(f"{SERVER_TLS}/serving-kube-apiserver.crt", server) != serving
        stored, secret = _stored_kubeconfig(stack)
        assert _admin_certificate(stored).serial_number == after.serial_number and secret
        assert {name: _live_settings(server).get(name) for name in EXPECTED} == EXPECTED
    finally:
        stack.write_config(longhorn_stack.config())
        server.run(["sh", "-c", f"rm -f {SHORT_CERTS} && systemctl daemon-reload"])
