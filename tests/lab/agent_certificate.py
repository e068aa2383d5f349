"""A lab worker's kubelet client certificate replaced by one that expired, for the tests of a
worker whose certificate ran out (tests/lab/test_join.py, tests/lab/test_fence_address_private.py).
LAB ONLY."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.hosts import Host

AGENT_DIR = "var/lib/rancher/k3s/agent"
CLIENT_CA = "var/lib/rancher/k3s/server/tls/client-ca"


def expire_client_certificate(server: Host, worker: Host) -> None:
    """Put in place of `worker`'s kubelet client certificate one the cluster's client CA signed for
    the same node (CN system:node:<name>, O system:nodes), valid for a year that ended yesterday:
    what the agent holds once its certificate's year has passed. Every real part then judges it by
    its own clock and the certificate's notAfter: the API server and the supervisor refuse it, the
    agent's start finds it expired, openssl on the host reads its end. The stand-in keeps its
    credentials in client-kubelet.crt/.key and, embedded, in kubelet.kubeconfig: all three change."""
    # Read and written inside the hosts (their mounts, as k3s sees them), not through their root.
    ca_cert = x509.load_pem_x509_certificate(server.run(["cat", f"/{CLIENT_CA}.crt"]).stdout.encode())
    ca_key = serialization.load_pem_private_key(server.run(["cat", f"/{CLIENT_CA}.key"]).stdout.encode(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{worker.name}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=366))
        .not_valid_after(now - timedelta(days=1))
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    kubeconfig = yaml.safe_load(worker.run(["cat", f"/{AGENT_DIR}/kubelet.kubeconfig"]).stdout)
    for user in kubeconfig["users"]:
        user["user"]["client-certificate-data"] = base64.b64encode(cert_pem).decode()
        user["user"]["client-key-data"] = base64.b64encode(key_pem).decode()
    files = {"client-kubelet.crt": cert_pem, "client-kubelet.key": key_pem}
    files["kubelet.kubeconfig"] = yaml.safe_dump(kubeconfig).encode()
    for name, data in files.items():
        encoded = base64.b64encode(data).decode()
        worker.run(["sh", "-c", 'echo "$1" | base64 -d > "$2"', "-", encoded, f"/{AGENT_DIR}/{name}"])
