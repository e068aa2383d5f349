"""The lab's real control plane: kine + kube-apiserver + kube-controller-manager.

Needs the binaries built by ``lab/build/kube.sh`` in ``$HK3S_LAB_CACHE/bin``
(default /var/cache/hk3s-lab/bin); skips only when they are absent.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509

from lab import controlplane
from lab.controlplane import ApiError, ControlPlane
from lab.stack_harness import BIN, skip_without_lab_binaries

pytestmark = pytest.mark.lab

BIN_DIR = BIN
T = TypeVar("T")


def _require_binaries() -> None:
    skip_without_lab_binaries("kine", "kube-apiserver", "kube-controller-manager", "kubectl")


def _wait_for(what: str, fn: Callable[[], T | None], timeout: float, cp: ControlPlane) -> T:
    deadline = time.monotonic() + timeout
    while True:
        cp.check_alive()
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not running any more.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _port_open(url: str) -> bool:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def test_real_control_plane_bootstraps_a_node(tmp_path: Path) -> None:
    _require_binaries()
    cp = controlplane.start(tmp_path / "cp", BIN_DIR)
    try:
        _exercise(cp, tmp_path)
    finally:
        pids = cp.pids
        cp.stop()
    assert set(pids) == {"kine", "kube-apiserver", "kube-controller-manager"}
    left = {name: pid for name, pid in pids.items() if _alive(pid)}
    assert not left, f"processes still running after stop(): {left}"
    assert not _port_open(cp.api_url), "the apiserver port still accepts connections"
    assert not _port_open(cp.kine_endpoint), "kine's port still accepts connections"
    cp.stop()  # idempotent


def _exercise(cp: ControlPlane, tmp_path: Path) -> None:
    admin = cp.admin_api()
    version = cp.kubectl("version", "-o", "json").stdout
    expected = _pinned_version()
    assert controlplane.kubernetes_version(BIN_DIR) == expected, "cached binaries differ from the pin: rerun kube.sh"
    assert f'"gitVersion": "{expected}"' in version, version

    # kubectl against the real API.
    assert cp.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    assert admin.get("/version")["gitVersion"] == expected

    # -- a bootstrap token authenticates as system:bootstrap:<id> with the extra group.
    tok = cp.create_bootstrap_token(ttl=3600, groups=["system:bootstrappers:hk3s-lab"])
    boot = cp.api(token=tok.token)
    who = boot.whoami()
    assert who["username"] == f"system:bootstrap:{tok.token_id}"
    assert "system:bootstrappers" in who["groups"]
    assert "system:bootstrappers:hk3s-lab" in who["groups"]

    # -- TLS bootstrap: the token creates a node client CSR; the real controllers approve and sign it.
    key_pem, csr_pem = controlplane.make_client_csr("system:node:test-node", ["system:nodes"])
    csr_name = "node-csr-test-node"
    boot.post(
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": csr_name},
            "spec": {
                "request": base64.b64encode(csr_pem).decode(),
                "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "usages": ["digital signature", "client auth"],
            },
        },
    )

    def signed() -> dict[str, Any] | None:
        obj = boot.get(f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr_name}")
        status = obj.get("status", {})
        return obj if status.get("certificate") else None

    csr = _wait_for("the CSR to be approved and signed", signed, 90, cp)
    conditions = {c["type"]: c for c in csr["status"].get("conditions", [])}
    assert conditions.get("Approved", {}).get("status") == "True", csr["status"]
    assert conditions["Approved"].get("reason") == "AutoApproved", conditions["Approved"]
    cert_pem = base64.b64decode(csr["status"]["certificate"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(cp.ca_path.read_bytes())
    assert cert.issuer == ca.subject
    assert cert.subject.rfc4514_string() == "CN=system:node:test-node,O=system:nodes"

    # -- with the signed certificate, the node registers itself (Node authorizer + NodeRestriction).
    node_crt, node_key = tmp_path / "node.crt", tmp_path / "node.key"
    node_crt.write_bytes(cert_pem)
    node_key.write_bytes(key_pem)
    node = cp.api(cert=node_crt, key=node_key)
    who = node.whoami()
    assert who["username"] == "system:node:test-node"
    assert "system:nodes" in who["groups"]
    created = node.post(
        "/api/v1/nodes",
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "test-node", "labels": {"hk3s-lab/test": "true"}}},
    )
    assert created["metadata"]["name"] == "test-node"
    # NodeRestriction: this node may not create another node.
    with pytest.raises(ApiError) as denied:
        node.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other-node"}})
    assert denied.value.status == 403
    # The node controller (node IPAM) gives the node a pod CIDR.
    got = _wait_for(
        "the node to get a pod CIDR",
        lambda: (
            admin.get("/api/v1/nodes/test-node")
            if admin.get("/api/v1/nodes/test-node")["spec"].get("podCIDR")
            else None
        ),
        60,
        cp,
    )
    assert got["spec"]["podCIDR"].startswith("10.42."), got["spec"]

    # -- a token that expires in a few seconds: it works, then fails, then the token cleaner deletes it.
    short = cp.create_bootstrap_token(expiration=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=6))
    short_api = cp.api(token=short.token)
    assert short_api.whoami()["username"] == f"system:bootstrap:{short.token_id}"
    secret_path = f"/api/v1/namespaces/kube-system/secrets/{short.secret_name}"

    def rejected() -> bool:
        status, _ = short_api.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            expect=None,
        )
        return status == 401

    _wait_for("the expired token to be rejected", rejected, 30, cp)

    def deleted() -> bool:
        status, _ = admin.request("GET", secret_path, expect=None)
        return status == 404

    _wait_for("the token cleaner to delete the expired token's Secret", deleted, 60, cp)
    # The long-lived token is still there.
    assert admin.request("GET", f"/api/v1/namespaces/kube-system/secrets/{tok.secret_name}")[0] == 200


def _pinned_version() -> str:
    script = Path(__file__).resolve().parents[2] / "lab" / "build" / "kube.sh"
    for line in script.read_text().splitlines():
        if line.startswith("readonly KUBE_VERSION="):
            return line.split("=", 1)[1].strip('"')
    raise AssertionError(f"no KUBE_VERSION pin in {script}")
