"""Read-only health checks of the nodes, over SSH: k3s running, disk space, the clock,
how long the node's k3s client certificate has left, and on the server how long its own
certificates (the API's serving certificate, the admin and control-plane clients) have left.

k3s's certificates last a year; k3s renews one that expires within 90 days when it
starts (docs.k3s.io, "Certificate rotation"), so a node that has run for most of a year
without a restart needs one: the check warns 30 days ahead and says to reboot it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from host_scripts import script_path
from node_operations.k3s_install import parse_results
from node_operations.volume_copies import read_copies_warnings
from remote_access.kube import API_WAIT_SECONDS, ClusterApi, NodeStatus
from remote_access.ssh import SshError, SshTarget, open_session

HEALTH_DEADLINE_SECONDS = 60.0
CERT_WARN_DAYS = 30
DISK_WARN_FREE_PERCENT = 10
# k3s renews a server certificate only when it starts within this many days of the certificate's
# end (config.CertificateRenewDays, read by deps.go's expired()): from then on a restart renews it.
SERVER_CERT_RENEW_DAYS = 90


def time_left(seconds: int) -> str:
    """A certificate's time left, in the largest whole unit that is not zero."""
    if seconds <= 0:
        return "expired"
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"expires in {seconds // size} {unit}"
    return f"expires in {seconds} seconds"


def server_certificate_warning(node: str, seconds_left: int, file: str) -> str | None:
    """The warning for the server's own certificates, once the first of them to end is within
    k3s's renewal window; None before. k3s renews them only at a start inside the window, so a
    server that keeps running (or was restarted earlier) reaches their end: then its API refuses
    every client, the program's own among them."""
    if seconds_left >= SERVER_CERT_RENEW_DAYS * 86400:
        return None
    return (
        f"{node}: the k3s server's certificate {file} {time_left(seconds_left)} (k3s renews the server's "
        f"certificates only when it starts within {SERVER_CERT_RENEW_DAYS} days of their end); renew them: "
        "run `up` with hk3s:network.approve_server_restart: true (it rotates them: k3s is stopped, "
        "`k3s certificate rotate` run and k3s started, the API down for 10-30 s), or on the server run "
        "`systemctl stop k3s; k3s certificate rotate; systemctl start k3s`, or restart k3s (a start "
        "within the window renews them); then `refresh` or `up` stores the new kubeconfig"
    )


@dataclass(frozen=True)
class HostHealth:
    """One node's checks; `error` says why the node could not be checked at all."""

    node: str
    reachable: bool
    error: str | None = None
    k3s_unit: str | None = None
    k3s_active: bool | None = None
    disk_free_percent: dict[str, int] = field(default_factory=dict)
    time_synced: bool | None = None
    cert_expires_in_days: int | None = None
    warnings: tuple[str, ...] = ()


# k3s makes the server's CA and its encryption config in one start (deps.go GenServerDeps): a
# config written later than this after the CA was written by a later start.
ENCRYPTION_LATE_SECONDS = 10


def encrypted_since(results: dict[str, str]) -> int | None:
    """When secrets-encryption was turned on (epoch seconds), if that was after the server's
    first start and the Secrets stored before were never re-encrypted since (k3s's rotation
    stage is still `start`); None otherwise."""
    began, cluster = results.get("secrets_encryption_began", ""), results.get("cluster_began", "")
    if results.get("secrets_encryption_stage") != "start" or not (began.isdigit() and cluster.isdigit()):
        return None
    return int(began) if int(began) - int(cluster) > ENCRYPTION_LATE_SECONDS else None


def judge(node: str, results: dict[str, str]) -> HostHealth:
    """The checks' verdicts from the facts `host_health.sh` printed."""
    warnings: list[str] = []
    unit = results.get("unit")
    active = results.get("active") == "active" if unit else None
    if unit is None:
        warnings.append(f"{node}: no k3s unit is installed (neither k3s nor k3s-agent)")
    elif not active:
        warnings.append(f"{node}: {unit} is {results.get('active') or 'not active'}; see journalctl -u {unit}")
    disks = {
        key.split(":", 1)[1]: int(value)
        for key, value in results.items()
        if key.startswith("disk_free_percent:") and value.isdigit()
    }
    for mount, free in sorted(disks.items()):
        if free < DISK_WARN_FREE_PERCENT:
            warnings.append(f"{node}: only {free}% of {mount} is free; the kubelet evicts pods below 10%")
    synced = {"yes": True, "no": False}.get(results.get("time_synced", ""))
    if synced is False:
        warnings.append(f"{node}: the clock is not synchronised (timedatectl: NTPSynchronized=no)")
    days = None
    if results.get("cert_expires_epoch", "").isdigit() and results.get("now_epoch", "").isdigit():
        days = (int(results["cert_expires_epoch"]) - int(results["now_epoch"])) // 86400
        if days < CERT_WARN_DAYS:
            warnings.append(
                f"{node}: its k3s client certificate expires in {days} days; reboot it (k3s renews a certificate "
                "that expires within 90 days when it starts)"
            )
    if results.get("server_cert_expires_epoch", "").isdigit() and results.get("now_epoch", "").isdigit():
        left = int(results["server_cert_expires_epoch"]) - int(results["now_epoch"])
        warning = server_certificate_warning(node, left, results.get("server_cert_file", "?"))
        if warning:
            warnings.append(warning)
    encryption = results.get("secrets_encryption")
    if encryption == "no":
        warnings.append(
            f"{node}: Kubernetes Secrets are stored unencrypted in k3s's datastore (k3s secrets-encrypt status: "
            "Disabled): this server runs without secrets-encryption. Turn it on: run `up` with "
            "hk3s:network.approve_server_restart: true (k3s restarts with secrets-encryption, then the Secrets "
            "already stored are re-encrypted with `k3s secrets-encrypt rotate-keys`)"
        )
    elif encryption == "unknown" and active:
        warnings.append(
            f"{node}: `k3s secrets-encrypt status` did not answer, so whether Secrets are encrypted is not known"
        )
    began = encrypted_since(results)
    if encryption == "yes" and began is not None:
        warnings.append(
            f"{node}: Kubernetes Secrets stored before secrets-encryption was turned on "
            f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}) are still unencrypted in k3s's datastore "
            "(never re-encrypted since); re-encrypt them: `k3s secrets-encrypt rotate-keys` on the server, or "
            "run `up` (it does that)"
        )
    if results.get("deny_service_external_ips") == "no":
        warnings.append(
            f"{node}: the API server accepts Services with externalIPs, which redirect any address's "
            "traffic (the server's 6443 or 22) to a pod on every node (CVE-2020-8554): set "
            "hk3s:network.approve_server_restart: true and run up to turn on DenyServiceExternalIPs "
            "(k3s restarts on the server; the API is down for 10-30 s)"
        )
    return HostHealth(
        node=node,
        reachable=True,
        k3s_unit=unit,
        k3s_active=active,
        disk_free_percent=disks,
        time_synced=synced,
        cert_expires_in_days=days,
        warnings=tuple(warnings),
    )


async def check_host(target: SshTarget) -> HostHealth:
    try:
        async with open_session(target) as session:
            result = await session.run_script(script_path("host_health.sh"), deadline=HEALTH_DEADLINE_SECONDS)
    except SshError as error:
        return HostHealth(
            node=target.node,
            reachable=False,
            error=str(error),
            warnings=(f"{target.node}: could not be checked: {error}",),
        )
    return judge(target.node, parse_results(result.stdout))


async def check_hosts(targets: Sequence[SshTarget], longhorn_server: str | None = None) -> list[HostHealth]:
    """Every node at once; one that cannot be reached is named, not fatal. With `longhorn_server`
    (the server of a cluster that runs Longhorn), its entry also warns of every volume whose copies
    wait for a node that may hold them, of single copies on workers, and of little room for copies
    (node_operations/volume_copies.py)."""
    found = list(await asyncio.gather(*(check_host(target) for target in targets)))
    for index, target in enumerate(targets):
        if target.node == longhorn_server and found[index].reachable:
            try:
                copies = await read_copies_warnings(target, API_WAIT_SECONDS)
            except SshError as error:
                lines = [f"{target.node}: Longhorn's volumes could not be read: {error}"]
            else:
                lines = [f"{target.node}: {line}" for line in copies]
            found[index] = dataclasses.replace(found[index], warnings=(*found[index].warnings, *lines))
    return found


OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
# The fence's record on a Node (the time it was recorded): node_operations.fence writes it first.
FENCE_ANNOTATION = "hk3s.dev/fenced-at"


def live_state(node: NodeStatus | None) -> str:
    """A node's state as the cluster sees it now: `OutOfService` (fenced: Kubernetes' out-of-service
    taint, or the fence's record, which the fence writes first and the lift removes last: a fenced
    node never counts as Ready, even while its host runs), else `Ready` or `NotReady`, with
    `,cordoned` when it takes no new pods; `missing` when the cluster has no such Node."""
    if node is None:
        return "missing"
    if node.has_taint(OUT_OF_SERVICE_TAINT) or FENCE_ANNOTATION in node.annotations:
        return "OutOfService"
    state = "Ready" if node.ready else "NotReady"
    return f"{state},cordoned" if node.unschedulable else state


async def read_nodes(server: SshTarget, api_wait: float) -> dict[str, NodeStatus]:
    """Every Node the cluster has, by name, read through the server (read-only)."""
    async with open_session(server) as session:
        return {node.name: node for node in await ClusterApi(session, api_wait=api_wait).nodes()}


async def read_node(server: SshTarget, node: str, api_wait: float = API_WAIT_SECONDS) -> NodeStatus | None:
    """The Node's status as the server sees it (for refresh). Here, beside `read_nodes`, rather
    than with the join, so that a provider reading one Node does not load the join's modules."""
    async with open_session(server) as session:
        return await ClusterApi(session, api_wait=api_wait).get_node(node)
