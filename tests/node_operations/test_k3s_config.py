"""The k3s server's config file as the program writes it."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from node_operations.k3s_install import K3sBinary, ServerSpec, k3s_ca_hash, server_config


def _spec(**overrides: object) -> ServerSpec:
    values: dict = dict(
        node="srv",
        node_ip="10.0.1.2",
        external_ip="198.51.100.2",
        pod_cidr="10.42.0.0/16",
        service_cidr="10.43.0.0/16",
        flannel_backend="vxlan",
        binary=K3sBinary(version="v1.36.1+k3s1"),
    )
    values.update(overrides)
    return ServerSpec(**values)


def test_private_mode_advertises_the_api_on_the_private_address() -> None:
    # With node-external-ip set, k3s would advertise the public address, which the server's
    # firewall closes to 6443 in private mode.
    config = yaml.safe_load(server_config(_spec(advertise_address="10.0.1.2"), "enp7s0"))
    assert config["advertise-address"] == "10.0.1.2"
    assert config["node-external-ip"] == "198.51.100.2" and config["node-ip"] == "10.0.1.2"


def test_public_mode_leaves_the_advertise_address_to_k3s() -> None:
    config = yaml.safe_load(server_config(_spec(node_ip="198.51.100.2"), "eth0"))
    assert "advertise-address" not in config and "node-external-ip" not in config


def test_uploaded_binary_architecture_from_its_elf_header(tmp_path: Path) -> None:
    def elf(machine: int) -> K3sBinary:
        path = tmp_path / f"k3s-{machine}"
        path.write_bytes(b"\x7fELF" + bytes(14) + machine.to_bytes(2, "little") + bytes(44))
        return K3sBinary(version="v1.36.1+k3s1", local_path=path)

    assert elf(0x3E).local_architecture() == "amd64"
    assert elf(0xB7).local_architecture() == "arm64"
    assert "unknown architecture" in (elf(0x28).local_architecture() or "")
    assert K3sBinary(version="v1.36.1+k3s1").local_architecture() is None


def _ca(name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None) -> tuple:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    signer_cert, signer_key = issuer if issuer else (None, key)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_cert.subject if signer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(signer_key, hashes.SHA256())
    )
    return cert, key


def test_ca_hash_is_k3s_s_raw_bytes_for_one_certificate_and_the_root_for_a_chain() -> None:
    root = _ca("custom root")
    intermediate = _ca("custom intermediate", root)
    one = root[0].public_bytes(serialization.Encoding.PEM)
    assert k3s_ca_hash(one) == hashlib.sha256(one).hexdigest()
    # A custom CA served with its intermediate first (k3s's hashCA: the root's DER).
    bundle = intermediate[0].public_bytes(serialization.Encoding.PEM) + one
    assert k3s_ca_hash(bundle) == hashlib.sha256(root[0].public_bytes(serialization.Encoding.DER)).hexdigest()
    # Nothing verifies: the raw bytes, as k3s.
    stranger = _ca("stranger")[0].public_bytes(serialization.Encoding.PEM)
    assert k3s_ca_hash(stranger + one) == hashlib.sha256(stranger + one).hexdigest()


def test_secrets_encryption_is_written_only_when_the_server_starts_with_it() -> None:
    assert yaml.safe_load(server_config(_spec(secrets_encryption=True), "eth0"))["secrets-encryption"] is True
    assert "secrets-encryption" not in yaml.safe_load(server_config(_spec(), "eth0"))
