"""Install or adopt k3s on a host (server or agent): the binary, its config file
and its systemd unit, written by the program; nothing fetched by a curl|sh
installer. Shared by the server set-up and the join."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import os
import shlex
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from host_scripts import script_path
from node_operations.host_facts import gather_facts, interface_of
from remote_access.private_dir import UnsafeDirectoryError, private_directory, runtime_directory
from remote_access.ssh import SshError, SshSession, SshTarget, open_session

K3S_BIN = "/usr/local/bin/k3s"
CONFIG_PATH = "/etc/rancher/k3s/config.yaml"
INSTALL_DEADLINE_SECONDS = 300.0
SERVER_READY_DEADLINE_SECONDS = 180
# Kubelet hardening passed on every node (CIS-style): no idle streaming sessions left open.
KUBELET_HARDENING_ARGS = ("streaming-connection-idle-timeout=5m", "make-iptables-util-chains=true")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class K3sBinary:
    """Which k3s to install, and from where."""

    version: str
    local_path: Path | None = None  # air-gapped: upload this file
    sha256: str | None = None

    def local_architecture(self) -> str | None:
        """amd64 or arm64 for an uploaded binary (its ELF header says), None when hosts download it."""
        if self.local_path is None:
            return None
        with self.local_path.expanduser().open("rb") as binary:
            header = binary.read(20)
        machine = int.from_bytes(header[18:20], "little") if header[:4] == b"\x7fELF" else -1
        return {0x3E: "amd64", 0xB7: "arm64"}.get(machine, f"an unknown architecture (ELF machine {machine})")

    def local_sha256(self) -> str | None:
        if self.local_path is None:
            return self.sha256
        digest = file_sha256(self.local_path.expanduser())
        if self.sha256 and digest != self.sha256:
            raise ValueError(
                f"{self.local_path} has SHA-256 {digest}, but hk3s:cluster.k3s_sha256 says {self.sha256}; "
                "fix the setting or the file"
            )
        return digest


@dataclass(frozen=True)
class ServerSpec:
    """How the k3s server is configured."""

    node: str
    node_ip: str
    external_ip: str
    pod_cidr: str
    service_cidr: str
    flannel_backend: str
    binary: K3sBinary
    tls_sans: tuple[str, ...] = ()
    # Public mode with a node behind a 1:1 NAT: flannel sends to the nodes' external addresses.
    flannel_external_ip: bool = False
    # The address the API is advertised on (the `kubernetes` Service endpoint, the server list the
    # agents' client-side load balancer switches to). Unset, k3s takes node-external-ip, else node-ip.
    advertise_address: str | None = None
    # Traefik and ServiceLB: off unless the stack asks for ingress, and then ServiceLB publishes
    # on the server alone (a node labelled enablelb restricts it to the labelled nodes).
    ingress: bool = False
    # Kubernetes Secrets encrypted at rest in k3s's datastore. k3s turns it on at any start with
    # the flag (deps.go genEncryptionConfigAndState writes its config when missing), but encrypts
    # only what is written from then on: a server that ran without it has its stored Secrets
    # re-encrypted after the start (_reencrypt_stored_secrets).
    secrets_encryption: bool = False
    # The DenyServiceExternalIPs admission plugin: a Service's externalIPs make kube-proxy on every
    # node send what is addressed to them (the server's 6443 or 22, say) to the Service's pods
    # (CVE-2020-8554), and any user who may create a Service may name any address. On for servers
    # this program starts; on a running server only when its restart is approved.
    deny_service_external_ips: bool = False
    # hk3s:network.approve_server_restart: the run may restart k3s, so server certificates inside
    # k3s's renewal window are rotated (rotate_server_certificates).
    may_restart: bool = False


# k3s runs the API server with --enable-admission-plugins=NodeRestriction; a kube-apiserver-arg of
# the same name replaces it (k3s pkg/util/args.go GetArgs), so NodeRestriction is named again.
DENY_SERVICE_EXTERNAL_IPS_ARG = "enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs"


# k3s's bundled components the program turns off without hk3s:cluster.ingress: ServiceLB publishes
# every LoadBalancer Service's ports as hostPorts on every node, Traefik is one such Service.
INGRESS_COMPONENTS = ("servicelb", "traefik")
SERVICELB_NODE_LABEL = "svccontroller.k3s.cattle.io/enablelb=true"


@dataclass(frozen=True)
class ServerInstalled:
    """The server as the rest of the cluster sees it. `kubeconfig` is secret."""

    version: str
    ca_hash: str
    api_endpoint: str
    kubeconfig: str
    certificates_end: int | None = None
    """When the first of the server's own certificates ends (epoch seconds; None: not read)."""


def k3s_ca_hash(bundle: bytes) -> str:
    """The CA hash a secure k3s token pins, as k3s computes it (pkg/clientaccess/token.go,
    hashCA): for a single certificate, SHA-256 of the bundle's bytes as served; for a bundle
    of several (a custom CA with intermediates), SHA-256 of the DER of the root that the
    first certificate chains to; the raw bytes again when no chain verifies."""
    from cryptography import x509  # noqa: PLC0415 - only the server's set-up needs it

    try:
        certs = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return hashlib.sha256(bundle).hexdigest()
    if len(certs) > 1:
        chain, rest = certs[0], list(certs[1:])
        while rest:
            issuer = next((c for c in rest if _issued_by(chain, c)), None)
            if issuer is None:
                break
            rest.remove(issuer)
            if issuer.issuer == issuer.subject and _issued_by(issuer, issuer):
                return hashlib.sha256(issuer.public_bytes(_der())).hexdigest()
            chain = issuer
    return hashlib.sha256(bundle).hexdigest()


def _issued_by(cert: Any, issuer: Any) -> bool:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - only the server's set-up needs it

    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _der() -> Any:
    from cryptography.hazmat.primitives.serialization import Encoding  # noqa: PLC0415

    return Encoding.DER


def render_config(settings: Mapping[str, Any]) -> str:
    """k3s config.yaml: keys are flag names; unset values are left out."""
    import yaml  # noqa: PLC0415 - loaded on first use: most provider processes render no config

    cleaned = {key: value for key, value in settings.items() if value not in (None, [], "")}
    return "# Written by hk3s; changes here are overwritten on the next pulumi up.\n" + yaml.safe_dump(
        cleaned, sort_keys=True
    )


def server_config(spec: ServerSpec, flannel_iface: str | None) -> str:
    return render_config(
        {
            "node-name": spec.node,
            "node-ip": spec.node_ip,
            "node-external-ip": spec.external_ip if spec.external_ip != spec.node_ip else None,
            "advertise-address": spec.advertise_address,
            "flannel-iface": flannel_iface,
            "flannel-backend": spec.flannel_backend,
            "flannel-external-ip": True if spec.flannel_external_ip else None,
            "cluster-cidr": spec.pod_cidr,
            "service-cidr": spec.service_cidr,
            "tls-san": sorted({spec.node_ip, spec.external_ip, *spec.tls_sans}),
            "write-kubeconfig-mode": "0600",
            "kubelet-arg": list(KUBELET_HARDENING_ARGS),
            "disable": [] if spec.ingress else list(INGRESS_COMPONENTS),
            "node-label": [SERVICELB_NODE_LABEL] if spec.ingress else [],
            "secrets-encryption": True if spec.secrets_encryption else None,
            "kube-apiserver-arg": [DENY_SERVICE_EXTERNAL_IPS_ARG] if spec.deny_service_external_ips else [],
        }
    )


def agent_config(
    *,
    node: str,
    server_url: str,
    node_ip: str,
    external_ip: str,
    flannel_iface: str | None,
    labels: Mapping[str, str],
    taints: Sequence[str],
    token_file: str | None,
) -> str:
    return render_config(
        {
            "server": server_url,
            "token-file": token_file,
            "node-name": node,
            "node-ip": node_ip,
            "node-external-ip": external_ip if external_ip != node_ip else None,
            "flannel-iface": flannel_iface,
            "node-label": [f"{key}={value}" for key, value in sorted(labels.items())],
            "node-taint": list(taints),
            "kubelet-arg": list(KUBELET_HARDENING_ARGS),
        }
    )


# SHA-256 of local files by path, size and modification time, kept for the provider process's
# lifetime: every join checks the binary it uploads, and hashing tens of MB takes a while.
_HASHED: dict[tuple[str, int, int], str] = {}
_HASHING = threading.Lock()


def file_sha256(path: Path) -> str:
    """The file's SHA-256, hashed once per process while the file is unchanged."""
    with _HASHING:
        found = path.stat()
        key = (str(path), found.st_size, found.st_mtime_ns)
        if key not in _HASHED:
            _HASHED[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        return _HASHED[key]


# Gzipped binaries by SHA-256, kept for the provider process's lifetime: joining many
# workers compresses the binary once and sends a third of its bytes to each host. Joins compress
# in threads (node_operations.join_host): one at a time, so the others find it done.
_GZIPPED: dict[str, bytes] = {}
_GZIPPING = threading.Lock()


# Compressed binaries kept on this machine between runs, in the user's private runtime directory:
# each run's provider process would compress the same tens of MB again (a second of CPU for a
# real k3s). An entry is named by the binary's SHA-256 and its own, and is used only when its
# bytes still hash to that name (a partial or damaged file is compressed anew); the newest few
# are kept.
_GZIP_CACHE = "k3s-gzipped"
_GZIP_CACHE_KEEP = 4


def gzipped_binary(path: Path, sha256: str) -> bytes:
    """The binary at `path` (whose SHA-256 is `sha256`), gzipped: from this process's memory, else
    from the cache on this machine, else compressed now and kept in both."""
    with _GZIPPING:
        if sha256 not in _GZIPPED:
            _GZIPPED[sha256] = _gzipped_from_cache(path, sha256)
        return _GZIPPED[sha256]


def _gzip_cache() -> Path | None:
    try:
        return private_directory(runtime_directory() / _GZIP_CACHE)
    except (OSError, UnsafeDirectoryError):
        return None  # no private place to keep it: compress every time


def _gzipped_from_cache(path: Path, sha256: str) -> bytes:
    cache = _gzip_cache()
    if cache is not None:
        for entry in cache.glob(f"{sha256}.*.gz"):
            with contextlib.suppress(OSError):
                packed = entry.read_bytes()
                if entry.name == f"{sha256}.{hashlib.sha256(packed).hexdigest()}.gz":
                    os.utime(entry)  # the newest are kept
                    return packed
            entry.unlink(missing_ok=True)
    packed = gzip.compress(path.expanduser().read_bytes(), compresslevel=1)
    if cache is not None:
        with contextlib.suppress(OSError):
            _keep(cache, f"{sha256}.{hashlib.sha256(packed).hexdigest()}.gz", packed)
    return packed


def _keep(cache: Path, name: str, packed: bytes) -> None:
    """Write the entry whole under its name (written aside, then renamed), and drop all but the
    newest few."""
    handle, temporary = tempfile.mkstemp(dir=cache, prefix=".new-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(packed)
        os.replace(temporary, cache / name)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        raise
    kept = sorted(cache.glob("*.gz"), key=lambda entry: entry.stat().st_mtime, reverse=True)
    for old in kept[_GZIP_CACHE_KEEP:]:
        old.unlink(missing_ok=True)


def parse_results(output: str) -> dict[str, str]:
    """`result <name> <value>` lines printed by host scripts."""
    results: dict[str, str] = {}
    for line in output.splitlines():
        words = line.split(" ", 2)
        if len(words) == 3 and words[0] == "result":
            results[words[1]] = words[2]
    return results


def relay_install_results(progress: Progress) -> Callable[[str], None]:
    """k3s_install.sh's result lines as progress, but for log_since (the host's clock when it
    started k3s, where the log of that start begins: for the program, not for the reader)."""

    def relay(line: str) -> None:
        if line.startswith("result ") and not line.startswith("result log_since "):
            progress(line.removeprefix("result "))

    return relay


async def remote_sha256(session: SshSession, path: str) -> str | None:
    result = await session.run(
        ["sh", "-c", f"sha256sum {shlex.quote(path)} 2>/dev/null | cut -d' ' -f1"], deadline=60, check=False
    )
    return result.stdout.strip() or None


async def install_k3s(
    session: SshSession,
    role: Literal["server", "agent"],
    binary: K3sBinary,
    config_text: str | None,
    progress: Progress,
) -> dict[str, str]:
    """Upload what is needed and run k3s_install.sh; returns its results. `config_text` None
    keeps the host's config as it is (an upgrade swaps the binary alone)."""
    want_sha = binary.local_sha256()
    await session.run(["mkdir", "-p", "/etc/rancher/k3s"], deadline=30)
    if binary.local_path is not None and want_sha is not None and await remote_sha256(session, K3S_BIN) != want_sha:
        packed = gzipped_binary(binary.local_path, want_sha)
        progress(f"uploading k3s {binary.version} ({len(packed) // 1_000_000} MB gzipped)")
        await session.upload(packed, f"{K3S_BIN}.hk3s-upload.gz", deadline=INSTALL_DEADLINE_SECONDS, mode=0o644)
    if config_text is not None:
        await session.upload(config_text.encode(), f"{CONFIG_PATH}.hk3s-new", deadline=60, mode=0o600)
    result = await session.run_script(
        script_path("k3s_install.sh"),
        [role, binary.version, want_sha or "-"],
        deadline=INSTALL_DEADLINE_SECONDS,
        on_line=relay_install_results(progress),
    )
    return parse_results(result.stdout)


async def served_ca_hash(session: SshSession) -> str:
    """The hash agents pin, over the CA bundle the server's /cacerts serves (public data)."""
    served = await session.run(
        ["curl", "-fsSk", "--max-time", "10", "https://127.0.0.1:6443/cacerts"], deadline=30, what="reading /cacerts"
    )
    return k3s_ca_hash(served.stdout.encode())


async def install_server(target: SshTarget, spec: ServerSpec, progress: Progress) -> ServerInstalled:
    """Install or adopt the k3s server and wait until its API is ready."""
    async with open_session(target, shared=True) as session:
        facts = await gather_facts(session)
        flannel_iface = interface_of(facts, spec.node_ip)
        if flannel_iface is None:
            raise SshError(
                spec.node,
                f"no interface of the host carries the node IP {spec.node_ip} (it has "
                f"{', '.join(facts.ipv4_addresses) or 'no IPv4 address'}); check the server's address settings",
            )
        running = await session.run(["systemctl", "is-active", "--quiet", "k3s"], deadline=30, check=False)
        previous = None
        if running.exit_status == 0:
            kept = await session.run(["cat", CONFIG_PATH], deadline=30, check=False)
            previous = kept.stdout if kept.exit_status == 0 else None
        installed = await install_k3s(session, "server", spec.binary, server_config(spec, flannel_iface), progress)
        progress("waiting for the Kubernetes API")
        try:
            results = await _wait_ready(session, spec)
        except SshError as failure:
            if previous is None or installed.get("config") != "changed":
                raise
            await _restore(session, spec, previous, progress)
            why = str(failure).removeprefix(f"{spec.node}: ")
            raise SshError(
                spec.node,
                f"the recovery checks failed after the server's configuration changed ({why}); the "
                "previous configuration was restored and k3s is running with it again. Find the cause in the log "
                "lines above, then run again",
            ) from None
        api_endpoint = f"https://{spec.external_ip}:6443"
        if spec.secrets_encryption:
            await _wait_encryption_stage(session)
        credentials = await _credentials_renewed(session, api_endpoint, rotate=spec.may_restart, progress=progress)
        if spec.secrets_encryption:
            await _reencrypt_stored_secrets(session, credentials.facts, progress)
        ca_hash = await served_ca_hash(session)
    return ServerInstalled(
        version=results["version"],
        ca_hash=ca_hash,
        api_endpoint=api_endpoint,
        kubeconfig=credentials.kubeconfig,
        certificates_end=credentials.ends_at(),
    )


KUBECONFIG_PATH = "/etc/rancher/k3s/k3s.yaml"


@dataclass(frozen=True)
class ServerCredentials:
    """What the server's certificates say now: the kubeconfig k3s wrote at its last start (with
    the API endpoint the program records; secret) and the first of its own certificates to end."""

    node: str
    kubeconfig: str
    seconds_left: int | None
    first_file: str | None
    facts: dict[str, str] = dataclasses.field(default_factory=dict)
    """All that host_health.sh printed."""

    def expiring(self) -> str | None:
        """The warning when the first certificate to end is inside k3s's renewal window."""
        from node_operations.health import server_certificate_warning  # noqa: PLC0415 - avoids a cycle

        if self.seconds_left is None:
            return None
        return server_certificate_warning(self.node, self.seconds_left, self.first_file or "?")

    def ends_at(self) -> int | None:
        """When the first of the server's certificates ends, epoch seconds (None: not read)."""
        end = self.facts.get("server_cert_expires_epoch", "")
        return int(end) if end.isdigit() else None

    def first_end(self) -> str:
        from node_operations.health import time_left  # noqa: PLC0415 - avoids a cycle

        return f"{self.first_file} {time_left(self.seconds_left or 0)}"


async def _read_credentials(session: SshSession, api_endpoint: str) -> ServerCredentials:
    kubeconfig = await session.run(["cat", KUBECONFIG_PATH], deadline=30, what="reading the kubeconfig")
    health = parse_results((await session.run_script(script_path("host_health.sh"), deadline=60)).stdout)
    left = None
    if health.get("server_cert_expires_epoch", "").isdigit() and health.get("now_epoch", "").isdigit():
        left = int(health["server_cert_expires_epoch"]) - int(health["now_epoch"])
    return ServerCredentials(
        node=session.target.node,
        kubeconfig=kubeconfig.stdout.replace("https://127.0.0.1:6443", api_endpoint),
        seconds_left=left,
        first_file=health.get("server_cert_file"),
        facts=health,
    )


async def read_server_credentials(target: SshTarget, api_endpoint: str) -> ServerCredentials:
    """The server's kubeconfig and its certificates' end, read-only (every `up` and `refresh`: k3s
    writes a new kubeconfig whenever it signs a new admin certificate, so a stored one goes stale)."""
    async with open_session(target, shared=True) as session:
        return await _read_credentials(session, api_endpoint)


async def _rotate_certificates(session: SshSession) -> None:
    """k3s's documented rotation (docs.k3s.io/cli/certificate): stop k3s, `k3s certificate rotate`
    (it backs up server/tls and removes the leaf certificates), start k3s, which signs new ones
    and writes a new kubeconfig; then wait for the API. The CAs stay, so agents are unaffected."""
    await session.run(["systemctl", "stop", "k3s"], deadline=120)
    stopped = (await session.run(["date", "+%s"], deadline=30)).stdout.strip()
    await session.run([K3S_BIN, "certificate", "rotate"], deadline=60, what="rotating the server's certificates")
    await session.run(["systemctl", "start", "--no-block", "k3s"], deadline=60)
    await session.run_script(
        script_path("k3s_server_ready.sh"),
        [str(SERVER_READY_DEADLINE_SECONDS)],
        deadline=SERVER_READY_DEADLINE_SECONDS + 30,
    )
    # k3s writes the kubeconfig with the new admin certificate during its start, not necessarily
    # before its API answers: the one read must be that start's.
    written = f'until [ "$(stat -c %Y {KUBECONFIG_PATH} 2>/dev/null || echo 0)" -ge {stopped} ]; do sleep 1; done'
    await session.run(["sh", "-c", written], deadline=120, what="waiting for k3s to write its new kubeconfig")


ENCRYPTION_STAGE_SECONDS = 60
REENCRYPT_SECONDS = 300


async def _wait_encryption_stage(session: SshSession) -> None:
    """Until `k3s secrets-encrypt status` names a rotation stage: k3s annotates its Node with the
    stage once the Node registers, a moment after the API is ready."""
    await session.run(
        [
            "sh",
            "-c",
            f'for i in $(seq {ENCRYPTION_STAGE_SECONDS}); do "$0" secrets-encrypt status 2>/dev/null | '
            "grep -q '^Current Rotation Stage: ' && exit 0; sleep 1; done",
            K3S_BIN,
        ],
        deadline=ENCRYPTION_STAGE_SECONDS + 30,
        check=False,
    )


async def _reencrypt_stored_secrets(session: SshSession, facts: dict[str, str], progress: Progress) -> None:
    """k3s encrypts the Secrets written after a start with secrets-encryption; those a server stored
    before (an adopted server that ran without it, or one turned on later) stay as they were until
    rewritten. `k3s secrets-encrypt rotate-keys` (docs.k3s.io/cli/secrets-encrypt) rewrites every
    Secret with a new key; done when k3s reports the stage reencrypt_finished. It restarts nothing.
    When it fails the run says the Secrets are not re-encrypted (and status --check keeps saying so)."""
    from node_operations.health import encrypted_since  # noqa: PLC0415 - avoids a cycle

    since = encrypted_since(facts)
    if since is None:
        return
    progress(
        "re-encrypting the Secrets stored before secrets-encryption was turned on (k3s secrets-encrypt rotate-keys)"
    )
    wait = (
        f'"$0" secrets-encrypt rotate-keys || exit 1; for i in $(seq {REENCRYPT_SECONDS}); do '
        '"$0" secrets-encrypt status | grep -qx "Current Rotation Stage: reencrypt_finished" && exit 0; sleep 1; '
        "done; echo 'the stage did not reach reencrypt_finished' >&2; exit 1"
    )
    done = await session.run(["sh", "-c", wait, K3S_BIN], deadline=REENCRYPT_SECONDS + 120, check=False)
    if done.exit_status == 0:
        progress("Secrets re-encrypted: every Secret is stored encrypted (k3s stage reencrypt_finished)")
        return
    why = (done.stderr.strip().splitlines() or ["no output"])[-1]
    progress(
        f"warning: the Secrets stored before secrets-encryption was turned on are NOT re-encrypted ({why}); "
        "run `k3s secrets-encrypt rotate-keys` on the server, or run up again"
    )


async def refresh_server_credentials(
    target: SshTarget, api_endpoint: str, *, rotate: bool, progress: Progress
) -> ServerCredentials:
    """The server's kubeconfig read again, after rotating its certificates when `rotate` and they
    are inside k3s's renewal window (the stack allows a server restart)."""
    async with open_session(target, shared=True) as session:
        return await _credentials_renewed(session, api_endpoint, rotate=rotate, progress=progress)


async def _credentials_renewed(
    session: SshSession, api_endpoint: str, *, rotate: bool, progress: Progress
) -> ServerCredentials:
    credentials = await _read_credentials(session, api_endpoint)
    if rotate and credentials.expiring() is not None:
        progress(
            f"rotating the server's certificates ({credentials.first_end()}, inside k3s's renewal window): "
            "k3s restarts, the Kubernetes API is down for 10-30 s"
        )
        await _rotate_certificates(session)
        credentials = await _read_credentials(session, api_endpoint)
        progress(f"certificates rotated: the first to end now {credentials.first_end()}")
    return credentials


async def _wait_ready(session: SshSession, spec: ServerSpec, deadline: int = SERVER_READY_DEADLINE_SECONDS) -> dict:
    """The recovery checks: the API answers and the server's node has its node IP."""
    ready = await session.run_script(
        script_path("k3s_server_ready.sh"),
        [str(deadline), spec.node, spec.node_ip],
        deadline=deadline + 30,
    )
    return parse_results(ready.stdout)


async def _restore(session: SshSession, spec: ServerSpec, previous: str, progress: Progress) -> None:
    """Put the previous configuration back, restart k3s with it and wait for the API."""
    progress("recovery checks failed: restoring the previous configuration and restarting k3s")
    await session.upload(previous.encode(), CONFIG_PATH, deadline=60, mode=0o600)
    await session.run(["systemctl", "reset-failed", "k3s"], deadline=30, check=False)
    await session.run(["systemctl", "restart", "k3s"], deadline=120)
    await session.run_script(
        script_path("k3s_server_ready.sh"),
        [str(SERVER_READY_DEADLINE_SECONDS)],
        deadline=SERVER_READY_DEADLINE_SECONDS + 30,
    )
    progress("k3s is running with the previous configuration")


@dataclass(frozen=True)
class ServerState:
    """What a refresh reads back from the server."""

    version: str
    ca_hash: str


async def read_server_state(target: SshTarget) -> ServerState | None:
    """The running server's version and CA hash, or None when k3s is not active."""
    async with open_session(target) as session:
        active = await session.run(["systemctl", "is-active", "--quiet", "k3s"], deadline=30, check=False)
        if active.exit_status != 0:
            return None
        ready = await session.run_script(script_path("k3s_server_ready.sh"), ["30"], deadline=60)
        results = parse_results(ready.stdout)
        return ServerState(version=results["version"], ca_hash=await served_ca_hash(session))


async def stop_server(target: SshTarget) -> None:
    """Stop and disable k3s on the server, keeping its data (nothing is wiped)."""
    async with open_session(target) as session:
        await session.run(["systemctl", "disable", "--now", "k3s"], deadline=120, check=False)
