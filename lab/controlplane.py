"""A real Kubernetes control plane for the lab: kine + kube-apiserver + kube-controller-manager.

The binaries come from ``lab/build/kube.sh`` (``$HK3S_LAB_CACHE/bin``); this module only
needs their directory.  :func:`start` generates a CA and the certificates it needs in a
directory of your choice, starts the three processes, waits for ``/readyz``, writes an
admin kubeconfig and installs the RBAC bindings that let a bootstrap-token client do a
real kubelet TLS bootstrap (create a CSR, have it auto-approved and signed).

What is configured:

* kine with its SQLite backend (plain gRPC on loopback) as the apiserver's etcd;
* kube-apiserver: client-certificate and bootstrap-token authentication, authorization
  ``Node,RBAC``, admission plugin ``NodeRestriction``, service-account signing keys;
* kube-controller-manager with ``*,bootstrapsigner,tokencleaner`` (CSR approving and
  signing with the cluster CA, pod GC, node lifecycle with a short
  ``--node-monitor-grace-period``, node CIDR allocation).

No Pulumi and no test framework is imported here; the only third-party dependency is
``cryptography``.  Re-using a directory keeps the CA, the service-account key and the
kine database, so a control plane can be stopped and started again with its state.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import datetime as _dt
import http.client
import ipaddress
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "ApiError",
    "BootstrapToken",
    "ControlPlane",
    "ControlPlaneError",
    "KubeApi",
    "free_port",
    "kubernetes_version",
    "make_client_csr",
    "start",
]

BINARIES = ("kine", "kube-apiserver", "kube-controller-manager")

# ClusterRoleBindings that make kubelet TLS bootstrap work with bootstrap tokens.
BOOTSTRAP_RBAC: tuple[tuple[str, str, str], ...] = (
    # (binding name, cluster role, group)
    ("hk3s-lab:kubelet-bootstrap", "system:node-bootstrapper", "system:bootstrappers"),
    (
        "hk3s-lab:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        "system:bootstrappers",
    ),
    (
        "hk3s-lab:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "system:nodes",
    ),
)


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or did not become ready."""


class ApiError(RuntimeError):
    """An API request got an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: Any):
        self.method, self.path, self.status, self.body = method, path, status, body
        super().__init__(f"{method} {path}: HTTP {status}: {body}")


# --------------------------------------------------------------------------- helpers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def kubernetes_version(bin_dir: str | os.PathLike[str]) -> str:
    """The Kubernetes version of the binaries in ``bin_dir`` (e.g. ``v1.37.2``).

    Kubelets that join this control plane should run the same version.
    """
    out = subprocess.run(
        [str(Path(bin_dir) / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    prefix = "Kubernetes "
    if not out.startswith(prefix):
        raise ControlPlaneError(f"unexpected kube-apiserver --version output: {out!r}")
    return out[len(prefix) :]


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _san(names: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for n in names:
        if not n or n in seen:
            continue
        seen.add(n)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            entries.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(entries)


def make_client_csr(common_name: str, organizations: Sequence[str] = ()) -> tuple[bytes, bytes]:
    """A new ECDSA key and a PEM CSR for a client certificate: ``(key_pem, csr_pem)``.

    ``make_client_csr("system:node:NAME", ["system:nodes"])`` is what a kubelet sends
    when it bootstraps its client certificate.
    """
    key = _new_key()
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(common_name, organizations))
        .sign(key, hashes.SHA256())
    )
    return _key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


@dataclass
class _CA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def load_or_create(cls, crt: Path, key: Path, cn: str) -> _CA:
        if crt.exists() and key.exists():
            k = serialization.load_pem_private_key(key.read_bytes(), None)
            if not isinstance(k, ec.EllipticCurvePrivateKey):
                raise ControlPlaneError(f"{key}: not an ECDSA key")
            return cls(x509.load_pem_x509_certificate(crt.read_bytes()), k)
        k = _new_key()
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(_name(cn))
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(hours=1))
            .not_valid_after(now + _dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(k.public_key()), critical=False)
            .sign(k, hashes.SHA256())
        )
        _write(key, _key_pem(k), 0o600)
        _write(crt, cert.public_bytes(serialization.Encoding.PEM))
        return cls(cert, k)

    def issue(
        self,
        crt: Path,
        key: Path,
        cn: str,
        orgs: Sequence[str] = (),
        *,
        server_names: Sequence[str] = (),
        client: bool = False,
        days: int = 365,
    ) -> None:
        k = _new_key()
        now = _now()
        usages = []
        if server_names:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self.cert.subject)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if server_names:
            b = b.add_extension(_san(server_names), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        _write(key, _key_pem(k), 0o600)
        _write(crt, cert.public_bytes(serialization.Encoding.PEM))


def _kubeconfig(server: str, ca: Path, crt: Path, key: Path, user: str) -> str:
    """A self-contained kubeconfig (JSON is valid YAML, so kubectl reads it)."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hk3s-lab", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)}}],
        "contexts": [{"name": "hk3s-lab", "context": {"cluster": "hk3s-lab", "user": user}}],
        "current-context": "hk3s-lab",
    }
    return json.dumps(cfg, indent=2) + "\n"


# --------------------------------------------------------------------------- API client


@dataclass
class KubeApi:
    """A minimal JSON client for the Kubernetes API (stdlib only).

    Authenticate with a client certificate (``cert``/``key`` paths), a bearer ``token``,
    or neither (anonymous).
    """

    url: str
    ca: Path
    cert: Path | None = None
    key: Path | None = None
    token: str | None = None
    timeout: float = 30.0

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if self.cert is not None:
            ctx.load_cert_chain(str(self.cert), str(self.key) if self.key else None)
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        expect: Iterable[int] | None = (200, 201),
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """Send one request; return ``(status, decoded JSON or text)``.

        Raises :class:`ApiError` when ``expect`` is given and the status is not in it.
        """
        host = self.url.split("://", 1)[1].rstrip("/")
        hostname, _, port = host.rpartition(":")
        conn = http.client.HTTPSConnection(
            hostname.strip("[]"), int(port), context=self._context(), timeout=self.timeout
        )
        headers = {"Accept": "application/json"}
        data: bytes | None = None
        if body is not None:
            text_body = body if isinstance(body, (str, bytes)) else json.dumps(body)
            data = text_body.encode() if isinstance(text_body, str) else text_body
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            status = resp.status
        finally:
            conn.close()
        text = raw.decode("utf-8", "replace")
        try:
            decoded: Any = json.loads(text) if text else None
        except ValueError:
            decoded = text
        if expect is not None and status not in set(expect):
            raise ApiError(method, path, status, decoded)
        return status, decoded

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)[1]

    def post(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body, **kw)[1]

    def whoami(self) -> dict[str, Any]:
        """The authenticated user info (``SelfSubjectReview``)."""
        review = self.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        return dict(review["status"]["userInfo"])


# --------------------------------------------------------------------------- control plane


@dataclass(frozen=True)
class BootstrapToken:
    token_id: str
    secret: str
    expiration: _dt.datetime | None = None

    @property
    def token(self) -> str:
        return f"{self.token_id}.{self.secret}"

    @property
    def secret_name(self) -> str:
        return f"bootstrap-token-{self.token_id}"


@dataclass
class ControlPlane:
    """A running control plane; stop it with :meth:`stop` (or use it as a context manager)."""

    directory: Path
    api_url: str
    ca_path: Path
    ca_key_path: Path
    admin_kubeconfig: Path
    admin_cert: Path
    admin_key: Path
    bin_dir: Path
    kine_endpoint: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    # -- processes
    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes.items()}

    def check_alive(self) -> None:
        """Raise :class:`ControlPlaneError` if a process has exited."""
        for name, p in self.processes.items():
            if p.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {p.returncode}\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs.get(name)
        if not path or not path.exists():
            return ""
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate all processes (controller-manager, apiserver, then kine); idempotent."""
        for name in ("kube-controller-manager", "kube-apiserver", "kine"):
            p = self.processes.get(name)
            if p is None or p.poll() is not None:
                continue
            # Popen's own signalling never hits a re-used pid; these binaries do not fork.
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- API
    def admin_api(self) -> KubeApi:
        return KubeApi(self.api_url, self.ca_path, cert=self.admin_cert, key=self.admin_key)

    def api(self, *, token: str | None = None, cert: Path | None = None, key: Path | None = None) -> KubeApi:
        return KubeApi(self.api_url, self.ca_path, cert=cert, key=key, token=token)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the cached kubectl against this control plane as admin."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.admin_kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def create_bootstrap_token(
        self,
        *,
        ttl: float | None = 24 * 3600,
        expiration: _dt.datetime | None = None,
        groups: Sequence[str] = ("system:bootstrappers:hk3s-lab",),
        token_id: str | None = None,
        secret: str | None = None,
        description: str = "hk3s lab bootstrap token",
    ) -> BootstrapToken:
        """Create a ``bootstrap.kubernetes.io/token`` Secret in kube-system.

        ``expiration`` (an aware datetime) wins over ``ttl`` seconds; ``ttl=None`` and no
        expiration make a token that does not expire.
        """
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        token_id = token_id or "".join(secrets.choice(alphabet) for _ in range(6))
        secret = secret or "".join(secrets.choice(alphabet) for _ in range(16))
        if expiration is None and ttl is not None:
            expiration = _now() + _dt.timedelta(seconds=ttl)
        data = {
            "token-id": token_id,
            "token-secret": secret,
            "description": description,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
        }
        if groups:
            data["auth-extra-groups"] = ",".join(groups)
        if expiration is not None:
            data["expiration"] = expiration.astimezone(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        tok = BootstrapToken(token_id, secret, expiration)
        self.admin_api().post(
            "/api/v1/namespaces/kube-system/secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": tok.secret_name, "namespace": "kube-system"},
                "type": "bootstrap.kubernetes.io/token",
                "stringData": data,
            },
        )
        return tok


def _preexec_die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Ask the kernel to SIGTERM the child when the starting process dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _wait_port(host: str, port: int, deadline: float, cp: ControlPlane) -> None:
    while True:
        cp.check_alive()
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"nothing listens on {host}:{port}")
        time.sleep(0.2)


def _wait_ready(api: KubeApi, path: str, deadline: float, cp: ControlPlane) -> None:
    last: object = None
    while True:
        cp.check_alive()
        try:
            status, body = api.request("GET", path, expect=None)
            if status == 200:
                return
            last = f"HTTP {status}: {body}"
        except (OSError, ssl.SSLError, http.client.HTTPException) as e:
            last = e
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{api.url}{path} not ready: {last}")
        time.sleep(0.5)


def start(
    directory: str | os.PathLike[str],
    bin_dir: str | os.PathLike[str],
    *,
    bind_address: str = "127.0.0.1",
    advertise_address: str | None = None,
    api_port: int | None = None,
    kine_port: int | None = None,
    controller_manager_port: int | None = None,
    extra_sans: Sequence[str] = (),
    service_cidr: str = "10.43.0.0/16",
    cluster_cidr: str | None = "10.42.0.0/16",
    node_monitor_grace_period: str = "20s",
    terminated_pod_gc_threshold: int = 50,
    extra_apiserver_args: Sequence[str] = (),
    extra_controller_manager_args: Sequence[str] = (),
    ready_timeout: float = 180.0,
    die_with_parent: bool = True,
) -> ControlPlane:
    """Start kine, kube-apiserver and kube-controller-manager; return when ``/readyz`` is ok.

    ``directory`` holds certificates, kubeconfigs, the kine database and process logs
    (``logs/<name>.log``); ``bin_dir`` holds the binaries built by ``lab/build/kube.sh``.
    The apiserver listens on ``bind_address:api_port`` (a free port when ``None``); kine
    and the controller-manager always listen on 127.0.0.1.  ``extra_sans`` adds names or
    IPs to the apiserver's serving certificate (e.g. the address nodes connect to).
    ``cluster_cidr=None`` turns node pod-CIDR allocation off.
    With ``die_with_parent`` the processes get SIGTERM when the thread that called
    :func:`start` ends (Linux ``PR_SET_PDEATHSIG``): call it from a long-lived thread,
    or pass ``False`` and rely on :meth:`ControlPlane.stop`.
    On failure everything already started is stopped and :class:`ControlPlaneError`
    (with the failing process's log tail) is raised.
    """
    d = Path(directory).resolve()
    bins = Path(bin_dir).resolve()
    for b in BINARIES:
        if not os.access(bins / b, os.X_OK):
            raise ControlPlaneError(f"missing binary {bins / b} (build it with lab/build/kube.sh)")
    pki, logs, kine_dir = d / "pki", d / "logs", d / "kine"
    for sub in (pki, logs, kine_dir, d / "kcm-certs", d / "apiserver-certs"):
        sub.mkdir(parents=True, exist_ok=True)

    api_port = api_port or free_port("127.0.0.1" if bind_address in ("0.0.0.0", "::") else bind_address)
    kine_port = kine_port or free_port()
    kcm_port = controller_manager_port or free_port()
    if advertise_address is None:
        advertise_address = "127.0.0.1" if bind_address in ("0.0.0.0", "::") else bind_address
    local_host = "127.0.0.1" if bind_address in ("0.0.0.0", "::") else bind_address
    api_url = f"https://{local_host}:{api_port}" if ":" not in local_host else f"https://[{local_host}]:{api_port}"

    # -- certificates (CA and service-account key are kept across restarts)
    ca = _CA.load_or_create(pki / "ca.crt", pki / "ca.key", "hk3s-lab-ca")
    # A separate CA for the aggregation layer's front proxy (requestheader authentication),
    # as kubeadm and k3s have: delegating components (the controller-manager, metrics-server)
    # read it from the kube-system/extension-apiserver-authentication ConfigMap.
    front_proxy_ca = _CA.load_or_create(
        pki / "front-proxy-ca.crt", pki / "front-proxy-ca.key", "hk3s-lab-front-proxy-ca"
    )
    front_proxy_ca.issue(
        pki / "front-proxy-client.crt", pki / "front-proxy-client.key", "front-proxy-client", client=True
    )
    kubernetes_svc_ip = str(next(ipaddress.ip_network(service_cidr).hosts()))
    ca.issue(
        pki / "apiserver.crt",
        pki / "apiserver.key",
        "kube-apiserver",
        server_names=[
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
            "127.0.0.1",
            kubernetes_svc_ip,
            advertise_address,
            *([bind_address] if bind_address not in ("0.0.0.0", "::") else []),
            *extra_sans,
        ],
    )
    ca.issue(
        pki / "apiserver-kubelet-client.crt",
        pki / "apiserver-kubelet-client.key",
        "kube-apiserver-kubelet-client",
        ["system:masters"],
        client=True,
    )
    ca.issue(pki / "admin.crt", pki / "admin.key", "hk3s-lab-admin", ["system:masters"], client=True)
    ca.issue(
        pki / "controller-manager.crt", pki / "controller-manager.key", "system:kube-controller-manager", client=True
    )
    if not (pki / "sa.key").exists():
        sa = _new_key()
        _write(pki / "sa.key", _key_pem(sa), 0o600)
        _write(
            pki / "sa.pub",
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )
    admin_kubeconfig = d / "admin.kubeconfig"
    _write(
        admin_kubeconfig,
        _kubeconfig(api_url, pki / "ca.crt", pki / "admin.crt", pki / "admin.key", "admin").encode(),
        0o600,
    )
    kcm_kubeconfig = d / "controller-manager.kubeconfig"
    _write(
        kcm_kubeconfig,
        _kubeconfig(
            api_url,
            pki / "ca.crt",
            pki / "controller-manager.crt",
            pki / "controller-manager.key",
            "system:kube-controller-manager",
        ).encode(),
        0o600,
    )

    kine_endpoint = f"http://127.0.0.1:{kine_port}"
    cp = ControlPlane(
        directory=d,
        api_url=api_url,
        ca_path=pki / "ca.crt",
        ca_key_path=pki / "ca.key",
        admin_kubeconfig=admin_kubeconfig,
        admin_cert=pki / "admin.crt",
        admin_key=pki / "admin.key",
        bin_dir=bins,
        kine_endpoint=kine_endpoint,
    )

    def launch(name: str, args: list[str]) -> None:
        log = logs / f"{name}.log"
        cp.logs[name] = log
        with open(log, "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(args)}\n".encode())
            out.flush()
            cp.processes[name] = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=d,
                start_new_session=True,
                # Only prctl() runs there (no locks taken), so it is safe with threads.
                preexec_fn=_preexec_die_with_parent if die_with_parent else None,  # noqa: PLW1509
            )

    deadline = time.monotonic() + ready_timeout
    try:
        launch(
            "kine",
            [
                str(bins / "kine"),
                f"--listen-address=127.0.0.1:{kine_port}",
                f"--endpoint=sqlite://{kine_dir / 'state.db'}?_journal=WAL&_busy_timeout=30000",
                "--metrics-bind-address=0",
            ],
        )
        _wait_port("127.0.0.1", kine_port, deadline, cp)

        launch(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={kine_endpoint}",
                f"--bind-address={bind_address}",
                f"--secure-port={api_port}",
                f"--advertise-address={advertise_address}",
                # The lease endpoint reconciler refuses loopback addresses; without it the
                # "kubernetes" Service simply has no endpoints (no in-cluster clients on loopback).
                *(["--endpoint-reconciler-type=none"] if ipaddress.ip_address(advertise_address).is_loopback else []),
                f"--cert-dir={d / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
                "--enable-bootstrap-token-auth=true",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--service-cluster-ip-range={service_cidr}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--profiling=false",
                *extra_apiserver_args,
            ],
        )
        admin = cp.admin_api()
        _wait_ready(admin, "/readyz", deadline, cp)

        kcm_args = [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={kcm_kubeconfig}",
            f"--authentication-kubeconfig={kcm_kubeconfig}",
            f"--authorization-kubeconfig={kcm_kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={kcm_port}",
            f"--cert-dir={d / 'kcm-certs'}",
            "--leader-elect=false",
            "--controllers=*,bootstrapsigner,tokencleaner",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={service_cidr}",
            f"--node-monitor-grace-period={node_monitor_grace_period}",
            f"--terminated-pod-gc-threshold={terminated_pod_gc_threshold}",
            "--profiling=false",
        ]
        if cluster_cidr:
            kcm_args += ["--allocate-node-cidrs=true", f"--cluster-cidr={cluster_cidr}"]
        launch("kube-controller-manager", [*kcm_args, *extra_controller_manager_args])

        _apply_bootstrap_rbac(admin)
        # The controller-manager's own health endpoint (anonymous access is allowed to /healthz).
        _wait_kcm_healthy(kcm_port, deadline, cp)
    except BaseException:
        cp.stop()
        raise
    return cp


def _wait_kcm_healthy(port: int, deadline: float, cp: ControlPlane) -> None:
    # Its serving certificate is self-signed, so skip verification for this probe only.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    last: object = None
    while True:
        cp.check_alive()
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
            try:
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                body = resp.read().decode(errors="replace")
            finally:
                conn.close()
            if resp.status == 200:
                return
            last = f"HTTP {resp.status}: {body}"
        except (OSError, http.client.HTTPException) as e:
            last = e
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"kube-controller-manager not healthy: {last}\n{cp.log_tail('kube-controller-manager')}"
            )
        time.sleep(0.5)


def _apply_bootstrap_rbac(admin: KubeApi) -> None:
    for name, role, group in BOOTSTRAP_RBAC:
        body = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "hk3s-lab"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
        }
        # Server-side apply: idempotent when the directory (and its database) is re-used.
        admin.request(
            "PATCH",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}?fieldManager=hk3s-lab&force=true",
            body,
            content_type="application/apply-patch+yaml",
        )
