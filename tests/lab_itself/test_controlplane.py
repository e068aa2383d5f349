"""The lab's real control plane, as the k3s stand-in's server starts it (lab/k3s_standin/server.go):
kine on SQLite, kube-apiserver, kube-controller-manager and kube-scheduler, built from Go
modules by ``lab/build/kube.sh``, behind the stand-in's supervisor.

This is the lab's only control-plane start: every product lab test runs it on a lab
server host as ``k3s server``. Here it runs directly on this machine, so no lab host is
needed: a data directory under a temporary directory, loopback ports of its own, and no
node of its own (``--disable-agent``), so the API holds only what this test creates.
Every request goes through the supervisor, as the product's do. Needs the stand-in and
the control-plane binaries in ``$HK3S_LAB_CACHE/bin`` (default /var/cache/hk3s-lab/bin);
skips only when they are absent.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lab.stack_harness import BIN, skip_without_lab_binaries
from tests.lab_itself.ports import free_port, port_pair

pytestmark = pytest.mark.lab

BIN_DIR = BIN
K3S = BIN_DIR / "k3s"
TOKEN_RE = re.compile(r"^K10[0-9a-f]{64}::([a-z0-9]{6})\.([a-z0-9]{16})$")
T = TypeVar("T")


def _require_binaries() -> None:
    skip_without_lab_binaries("k3s", "kine", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


class ApiError(RuntimeError):
    """An API request got an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: Any):
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {body}")


@dataclass(frozen=True)
class KubeApi:
    """The Kubernetes API at ``url`` as one client: a client certificate, a bearer token, or neither."""

    url: str
    ca: Path
    cert: Path | None = None
    key: Path | None = None
    token: str | None = None

    def request(
        self, method: str, path: str, body: Any = None, *, expect: Iterable[int] | None = (200, 201)
    ) -> tuple[int, Any]:
        """Send one request; ``(status, decoded JSON)``; ApiError when ``expect`` lacks the status."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if self.cert is not None:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            resp = conn.getresponse()
            status, raw = resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()
        try:
            decoded: Any = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw
        if expect is not None and status not in set(expect):
            raise ApiError(method, path, status, decoded)
        return status, decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)[1]

    def whoami(self) -> dict[str, Any]:
        """The authenticated user info (a SelfSubjectReview)."""
        review = self.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        return dict(review["status"]["userInfo"])


@dataclass(frozen=True)
class BootstrapToken:
    token_id: str
    secret: str

    @property
    def token(self) -> str:
        return f"{self.token_id}.{self.secret}"

    @property
    def secret_name(self) -> str:
        return f"bootstrap-token-{self.token_id}"


@dataclass
class Server:
    """`k3s server` of the stand-in, running as a child of this test."""

    data_dir: Path
    https_port: int
    kubeconfig: Path
    env: dict[str, str]
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    def tls(self, name: str) -> Path:
        return self.data_dir / "server" / "tls" / name

    def api(self, *, token: str | None = None, cert: Path | None = None, key: Path | None = None) -> KubeApi:
        return KubeApi(self.url, self.tls("server-ca.crt"), cert=cert, key=key, token=token)

    def admin_api(self) -> KubeApi:
        return self.api(cert=self.tls("client-admin.crt"), key=self.tls("client-admin.key"))

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise AssertionError(f"k3s server exited with {self.popen.returncode}\n{tail}")

    def k3s(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(K3S), *args], capture_output=True, text=True, env=self.env, check=True, timeout=60)

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        # `k3s kubectl` runs the cached kubectl, here with the admin kubeconfig the server wrote.
        return self.k3s("kubectl", "--kubeconfig", str(self.kubeconfig), *args)

    def create_bootstrap_token(self, ttl: str, groups: str) -> BootstrapToken:
        """`k3s token create`: a bootstrap-token Secret in kube-system, as the product creates join tokens."""
        out = self.k3s("token", "create", "--data-dir", str(self.data_dir), "--ttl", ttl, "--groups", groups)
        m = TOKEN_RE.fullmatch(out.stdout.strip())
        assert m, out.stdout
        return BootstrapToken(m.group(1), m.group(2))


def _start_server(tmp: Path) -> Server:
    https_port = port_pair()
    config = tmp / "config.yaml"
    # The controller-manager and the scheduler get ports of their own: the default ones may
    # be taken on this machine by another stand-in server.
    config.write_text(
        f"kube-controller-manager-arg:\n  - secure-port={free_port()}\n"
        f"kube-scheduler-arg:\n  - secure-port={free_port()}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3S_") and k != "KUBECONFIG"}
    env["HK3S_LAB_KUBE_BIN"] = str(BIN_DIR)
    data_dir, kubeconfig, log = tmp / "server", tmp / "k3s.yaml", tmp / "server.log"
    args = ["server", "--config", str(config), "--data-dir", str(data_dir), "--disable-agent"]
    args += ["--bind-address", "127.0.0.1", "--https-listen-port", str(https_port)]
    args += ["--write-kubeconfig", str(kubeconfig)]
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [str(K3S), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Server(data_dir, https_port, kubeconfig, env, popen, log)


def _wait_for(what: str, fn: Callable[[], T | None], timeout: float, server: Server) -> T:
    deadline = time.monotonic() + timeout
    while True:
        server.check_alive()
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def _children(pid: int) -> dict[int, str]:
    """Direct children of pid: {pid: comm}."""
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out[int(d.name)] = stat[stat.index("(") + 1 : stat.rindex(")")]
    return out


def _alive(pid: int) -> bool:
    # A zombie is not running any more.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _accepts(family: socket.AddressFamily, address: str | tuple[str, int]) -> bool:
    with socket.socket(family) as s:
        s.settimeout(1)
        try:
            s.connect(address)
        except OSError:
            return False
        return True


def _make_client_csr(common_name: str, organization: str) -> tuple[bytes, bytes]:
    """A new ECDSA key and a PEM CSR for a client certificate, as a kubelet sends: ``(key_pem, csr_pem)``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(x509.NameOID.COMMON_NAME, common_name),
        ]
    )
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def test_real_control_plane_bootstraps_a_node(tmp_path: Path) -> None:
    _require_binaries()
    server = _start_server(tmp_path)
    kids: dict[int, str] = {}
    try:
        _wait_for("the server to be up", lambda: "k3s is up and running" in server.log.read_text(), 240, server)
        kids = _children(server.popen.pid)
        _exercise(server, tmp_path)
    finally:
        if server.popen.poll() is None:
            server.popen.send_signal(signal.SIGTERM)
        try:
            returncode = server.popen.wait(60)
        except subprocess.TimeoutExpired:
            server.popen.kill()
            server.popen.wait(10)
            raise
        finally:
            for pid, comm in kids.items():  # whatever a failed stop left behind
                with contextlib.suppress(OSError):
                    if _alive(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                        os.kill(pid, signal.SIGKILL)
    # The stand-in's server runs the control plane as its children (the controller-manager
    # by its 15-character comm) and stops every one of them on SIGTERM, as k3s does.
    assert sorted(kids.values()) == ["kine", "kube-apiserver", "kube-controller", "kube-scheduler"], kids
    assert returncode == 0, server.log.read_text()[-3000:]
    left = {pid: comm for pid, comm in kids.items() if _alive(pid)}
    assert not left, f"processes still running after the server stopped: {left}"
    assert not _accepts(socket.AF_INET, ("127.0.0.1", server.https_port)), "the supervisor port still accepts"
    assert not _accepts(socket.AF_INET, ("127.0.0.1", server.https_port + 1)), "the apiserver port still accepts"
    kine_socket = str(server.data_dir / "server" / "kine.sock")
    assert not _accepts(socket.AF_UNIX, kine_socket), "kine's socket still accepts connections"


def _exercise(server: Server, tmp_path: Path) -> None:
    admin = server.admin_api()
    version = server.kubectl("version", "-o", "json").stdout
    expected = _pinned_version()
    assert _binaries_version() == expected, "cached binaries differ from the pin: rerun kube.sh"
    assert f'"gitVersion": "{expected}"' in version, version

    # kubectl against the real API.
    assert server.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    assert admin.get("/version")["gitVersion"] == expected

    # -- a bootstrap token authenticates as system:bootstrap:<id> with the extra group.
    tok = server.create_bootstrap_token("1h", "system:bootstrappers:hk3s-lab")
    boot = server.api(token=tok.token)
    who = boot.whoami()
    assert who["username"] == f"system:bootstrap:{tok.token_id}"
    assert "system:bootstrappers" in who["groups"]
    assert "system:bootstrappers:hk3s-lab" in who["groups"]

    # -- a token that expires in a few seconds works now; its expiry is checked at the end,
    # so the wait for it runs alongside the node's bootstrap.
    short = server.create_bootstrap_token("8s", "system:bootstrappers:hk3s-lab")
    short_api = server.api(token=short.token)
    assert short_api.whoami()["username"] == f"system:bootstrap:{short.token_id}"

    _bootstrap_a_node(server, boot, tmp_path)

    # -- the short token: it fails once expired, then the token cleaner deletes its Secret.
    def rejected() -> bool:
        status, _ = short_api.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            expect=None,
        )
        return status == 401

    _wait_for("the expired token to be rejected", rejected, 30, server)
    secret_path = f"/api/v1/namespaces/kube-system/secrets/{short.secret_name}"
    _wait_for(
        "the token cleaner to delete the expired token's Secret",
        lambda: admin.request("GET", secret_path, expect=None)[0] == 404,
        60,
        server,
    )
    # The long-lived token is still there.
    assert admin.request("GET", f"/api/v1/namespaces/kube-system/secrets/{tok.secret_name}")[0] == 200


def _bootstrap_a_node(server: Server, boot: KubeApi, tmp_path: Path) -> None:
    """TLS bootstrap with the token: a node client CSR the real controllers approve and sign;
    with the signed certificate the node registers itself (Node authorizer + NodeRestriction)."""
    key_pem, csr_pem = _make_client_csr("system:node:test-node", "system:nodes")
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
        return obj if obj.get("status", {}).get("certificate") else None

    csr = _wait_for("the CSR to be approved and signed", signed, 90, server)
    conditions = {c["type"]: c for c in csr["status"].get("conditions", [])}
    assert conditions.get("Approved", {}).get("status") == "True", csr["status"]
    assert conditions["Approved"].get("reason") == "AutoApproved", conditions["Approved"]
    cert_pem = base64.b64decode(csr["status"]["certificate"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    # As on k3s, kubelet client certificates are signed by the cluster's client CA.
    ca = x509.load_pem_x509_certificate(server.tls("client-ca.crt").read_bytes())
    assert cert.issuer == ca.subject
    assert cert.subject.rfc4514_string() == "CN=system:node:test-node,O=system:nodes"

    node_crt, node_key = tmp_path / "node.crt", tmp_path / "node.key"
    node_crt.write_bytes(cert_pem)
    node_key.write_bytes(key_pem)
    node = server.api(cert=node_crt, key=node_key)
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
    admin = server.admin_api()
    got = _wait_for(
        "the node to get a pod CIDR",
        lambda: n if (n := admin.get("/api/v1/nodes/test-node"))["spec"].get("podCIDR") else None,
        60,
        server,
    )
    assert got["spec"]["podCIDR"].startswith("10.42."), got["spec"]


def _binaries_version() -> str:
    """The Kubernetes version of the cached kube-apiserver (e.g. ``v1.37.2``)."""
    out = subprocess.run(
        [str(BIN_DIR / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    assert out.startswith("Kubernetes "), out
    return out.removeprefix("Kubernetes ")


def _pinned_version() -> str:
    script = Path(__file__).resolve().parents[2] / "lab" / "build" / "kube.sh"
    for line in script.read_text().splitlines():
        if line.startswith("readonly KUBE_VERSION="):
            return line.split("=", 1)[1].strip('"')
    raise AssertionError(f"no KUBE_VERSION pin in {script}")
