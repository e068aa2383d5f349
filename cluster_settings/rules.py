"""Rules that relate several settings, checked before any machine is touched.

Each rule returns problems that name the exact config key and the fix.
"""

from __future__ import annotations

import ipaddress
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from .models import HostSettings, StackSettings, WorkerSettings
from .values import NETWORK_ZONE_OF_LOCATION

# A Hetzner Cloud network holds at most 100 servers.
HETZNER_NETWORK_MAX_SERVERS = 100
NAMESPACE = "hk3s"


@dataclass(frozen=True)
class SettingProblem:
    """One invalid setting: the config key and what to do about it."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def _key(*parts: str | int) -> str:
    text = NAMESPACE + ":"
    for index, part in enumerate(parts):
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if index else "") + part
    return text


# A pool's worker takes these settings from the pool under another name.
_POOL_FIELD_NAMES = {"location": "locations"}


def _host_key(settings: StackSettings, host: HostSettings, field: str) -> str:
    if host is settings.server:
        return _key("server", field)
    assert isinstance(host, WorkerSettings)
    origin = settings.worker_config_key(host)
    if settings.pool_member(host) is not None:
        return f"{origin}.{_POOL_FIELD_NAMES.get(field, field)}"
    return f"{origin}.{field}"


def host_setting_key(settings: StackSettings, host: HostSettings, field: str) -> str:
    """The config key of one host's setting, e.g. `hk3s:workers[2].server_type`."""
    return _host_key(settings, host, field)


def _overlaps(a: str, b: str) -> bool:
    return ipaddress.ip_network(a).overlaps(ipaddress.ip_network(b))


def check_stack_rules(settings: StackSettings) -> list[SettingProblem]:
    """Every cross-field rule, all problems collected (not only the first)."""
    return [
        *_check_names(settings),
        *_check_hosts(settings),
        *_check_hetzner_servers(settings),
        *_check_addresses(settings),
        *_check_networks(settings),
        *_check_ssh(settings),
        *_check_cluster(settings),
        *_check_longhorn_chart(settings),
        *_check_fences(settings),
        *_check_workers(settings),
        *_check_pools(settings),
    ]


def _name_source(settings: StackSettings, worker: WorkerSettings) -> str:
    """Where a worker's name comes from, e.g. `hk3s:workers[1].name` or `worker 3 of pool batch
    (hk3s:worker_pools[0])`."""
    member = settings.pool_member(worker)
    if member is None:
        return f"{settings.worker_config_key(worker)}.name"
    return f"worker {member.number} of pool {member.pool} ({settings.worker_config_key(worker)})"


def _check_names(settings: StackSettings) -> Iterator[SettingProblem]:
    seen: dict[str, str] = {settings.server.name: _key("server", "name")}
    for worker in settings.all_workers():
        member = settings.pool_member(worker)
        key = _host_key(settings, worker, "name") if member is None else settings.worker_config_key(worker) + ".name"
        source = _name_source(settings, worker)
        if worker.name == settings.server.name:
            yield SettingProblem(
                key,
                f"{worker.name!r} ({source}) is the server's name (hk3s:server.name); "
                "give the worker or the pool another name",
            )
        elif worker.name in seen:
            yield SettingProblem(
                key,
                f"{worker.name!r} ({source}) is already the name of {seen[worker.name]}; node names must be "
                "unique: rename one of them",
            )
        else:
            seen[worker.name] = source


def _check_hosts(settings: StackSettings) -> Iterator[SettingProblem]:
    for host in [settings.server, *settings.all_workers()]:
        if host.kind == "existing":
            if host.address is None:
                yield SettingProblem(
                    _host_key(settings, host, "address"),
                    f"{host.name} is an existing host (kind: existing) but has no address; "
                    "set its public IPv4 address, e.g. address: 198.51.100.7",
                )
            for field in ("server_type", "image", "location"):
                if getattr(host, field) is not None:
                    yield SettingProblem(
                        _host_key(settings, host, field),
                        f"{host.name} is an existing host; {field} applies only to kind: hetzner. Remove it",
                    )
        else:
            for field in ("address", "ssh_address", "private_address"):
                if getattr(host, field) is not None:
                    yield SettingProblem(
                        _host_key(settings, host, field),
                        f"{host.name} is a Hetzner server the program creates, so Hetzner assigns its "
                        f"addresses; remove {field} or set kind: existing",
                    )


def _check_hetzner_servers(settings: StackSettings) -> Iterator[SettingProblem]:
    """hcloud_server names the Hetzner server an existing worker is, once: a fence powers it off."""
    named: dict[str, str] = {}
    for worker in settings.all_workers():
        if worker.hcloud_server is None:
            continue
        key = _host_key(settings, worker, "hcloud_server")
        if worker.kind == "hetzner":
            yield SettingProblem(
                key,
                f"{worker.name} is a Hetzner server the program creates, so the program knows its server; "
                "remove hcloud_server (it is for kind: existing hosts that are Hetzner servers)",
            )
        elif worker.hcloud_server in named:
            yield SettingProblem(
                key,
                f"Hetzner server {worker.hcloud_server} is already {named[worker.hcloud_server]}'s; a fence of "
                f"{worker.name} would power off the other worker. Give each worker its own server",
            )
        else:
            named[worker.hcloud_server] = worker.name


def _check_addresses(settings: StackSettings) -> Iterator[SettingProblem]:
    seen: dict[str, str] = {}
    cluster = settings.cluster
    for host in [settings.server, *settings.all_workers()]:
        for field in ("address", "private_address"):
            value = getattr(host, field)
            if value is None:
                continue
            key = _host_key(settings, host, field)
            if value in seen:
                yield SettingProblem(
                    key, f"{value} is already the address of {seen[value]}; every node needs its own address"
                )
            else:
                seen[value] = key
            for net_field, net in (("pod_cidr", cluster.pod_cidr), ("service_cidr", cluster.service_cidr)):
                if ipaddress.ip_address(value) in ipaddress.ip_network(net):
                    yield SettingProblem(
                        key,
                        f"{value} lies in the cluster's {net_field.replace('_', ' ')} {net} "
                        f"(hk3s:cluster.{net_field}); move that network or use another address",
                    )


def _check_networks(settings: StackSettings) -> Iterator[SettingProblem]:
    cluster, network = settings.cluster, settings.network
    if _overlaps(cluster.pod_cidr, cluster.service_cidr):
        yield SettingProblem(
            _key("cluster", "service_cidr"),
            f"{cluster.service_cidr} overlaps the pod network {cluster.pod_cidr}; choose disjoint networks",
        )
    private_nets = [("private_network_cidr", network.private_network_cidr)]
    if network.private_network is not None:
        private_nets.append(("private_network", network.private_network))
    for field, net in private_nets:
        for other_field, other in (("pod_cidr", cluster.pod_cidr), ("service_cidr", cluster.service_cidr)):
            if _overlaps(net, other):
                yield SettingProblem(
                    _key("network", field),
                    f"{net} overlaps the cluster's {other_field.replace('_', ' ')} {other} "
                    f"(hk3s:cluster.{other_field}); choose a private network outside it",
                )
    subnet = ipaddress.ip_network(network.private_subnet_cidr)
    if not subnet.subnet_of(ipaddress.ip_network(network.private_network_cidr)):  # type: ignore[arg-type]
        yield SettingProblem(
            _key("network", "private_subnet_cidr"),
            f"{network.private_subnet_cidr} is not inside hk3s:network.private_network_cidr "
            f"{network.private_network_cidr}; pick a subnet of it",
        )
    # vxlan is unencrypted: in public mode pod traffic would cross the internet in clear, into
    # flannel.1, which every host firewall trusts (a spoofed source address is all it takes).
    if network.mode == "public" and cluster.pod_network == "vxlan" and cluster.vxlan_over_public_addresses != "allowed":
        yield SettingProblem(
            _key("cluster", "pod_network"),
            "vxlan sends pod traffic unencrypted, and hk3s:network.mode is public, so it would cross the internet "
            "in clear; set pod_network: wireguard (encrypted; a running cluster keeps its pod network, so it "
            "takes a new stack), or hk3s:network.mode: private",
        )
    if network.mode == "public" and network.private_network is not None:
        yield SettingProblem(
            _key("network", "private_network"),
            "mode is public, so the nodes never use a private network; remove private_network or set mode: private",
        )
    if network.private_network is not None:
        for host in [settings.server, *settings.all_workers()]:
            if host.private_address and ipaddress.ip_address(host.private_address) not in ipaddress.ip_network(
                network.private_network
            ):
                yield SettingProblem(
                    _host_key(settings, host, "private_address"),
                    f"{host.private_address} is outside hk3s:network.private_network {network.private_network}; "
                    "fix the address or the network",
                )
    hetzner = settings.hetzner_hosts()
    if len(hetzner) > HETZNER_NETWORK_MAX_SERVERS:
        yield SettingProblem(
            _key("workers"),
            f"{len(hetzner)} Hetzner servers, but a Hetzner Cloud network holds at most "
            f"{HETZNER_NETWORK_MAX_SERVERS}; add the rest as existing hosts or split the cluster",
        )
    zone_of_server = NETWORK_ZONE_OF_LOCATION[settings.server.location or cluster.location]
    for host in hetzner:
        zone = NETWORK_ZONE_OF_LOCATION[host.location or cluster.location]
        if zone != zone_of_server:
            yield SettingProblem(
                _host_key(settings, host, "location"),
                f"{host.location or cluster.location} is in network zone {zone}, but the server's location is in "
                f"{zone_of_server}; one private network spans one zone, so choose a location in {zone_of_server}",
            )


def _check_ssh(settings: StackSettings) -> Iterator[SettingProblem]:
    key_file = settings.ssh.private_key_file.expanduser()
    if not key_file.is_file():
        yield SettingProblem(
            _key("ssh", "private_key_file"),
            f"{key_file} does not exist; point it at the private key that logs in to every node "
            "(e.g. ~/.ssh/id_ed25519)",
        )
    elif settings.hetzner_hosts() and not key_file.with_name(key_file.name + ".pub").is_file():
        yield SettingProblem(
            _key("ssh", "private_key_file"),
            f"{key_file}.pub is missing; Hetzner servers are created with that public key. "
            f"Write it with: ssh-keygen -y -f {key_file} > {key_file}.pub",
        )
    previous = settings.ssh.previous_private_key_file
    if previous is not None and not previous.expanduser().is_file():
        yield SettingProblem(
            _key("ssh", "previous_private_key_file"),
            f"{previous.expanduser()} does not exist; point it at the key the nodes accept today "
            "(the one private_key_file replaced), or remove the setting",
        )
    if settings.ssh.hetzner_key is not None and not settings.hetzner_hosts():
        yield SettingProblem(
            _key("ssh", "hetzner_key"),
            "no node is a Hetzner server the program creates (kind: hetzner), so no key is given to one; remove it",
        )
    names = {settings.server.name, *(worker.name for worker in settings.all_workers())}
    for node in settings.ssh.host_keys:
        if node not in names:
            yield SettingProblem(
                _key("ssh", "host_keys", node),
                f"{node!r} is neither the server nor a worker; remove the key or fix the name",
            )


def _check_cluster(settings: StackSettings) -> Iterator[SettingProblem]:
    cluster = settings.cluster
    if cluster.control_plane_lost and not cluster.teardown_allowed:
        # The loss is declared only to tear the stack down: a run that forgot the cluster's
        # objects and then went on building would leave a stack whose state names nothing real.
        yield SettingProblem(
            _key("cluster", "control_plane_lost"),
            "is true but hk3s:cluster.teardown is not 'allowed': a lost control plane is only torn down; set "
            'hk3s:cluster.teardown: allowed too (docs/teardown.md, "When the control plane is lost"), or '
            "remove control_plane_lost",
        )
    if cluster.k3s_binary is not None:
        if cluster.k3s_sha256 is None:
            yield SettingProblem(
                _key("cluster", "k3s_sha256"),
                "k3s_binary is set, so its SHA-256 is required; compute it with: sha256sum <binary>",
            )
        if not cluster.k3s_binary.expanduser().is_file():
            yield SettingProblem(
                _key("cluster", "k3s_binary"),
                f"{cluster.k3s_binary} does not exist; give the path of the k3s binary to upload, "
                "or unset it to download the release on the host",
            )


def _chart_metadata(chart: Path) -> dict[str, object]:
    """Chart.yaml of a chart folder or of a packaged chart (.tgz, its one top folder)."""
    if chart.is_dir():
        text = (chart / "Chart.yaml").read_text()
    else:
        with tarfile.open(chart) as archive:
            member = next(m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml"))
            extracted = archive.extractfile(member)
            if extracted is None:
                raise OSError(f"{member.name} in {chart} is not a file")
            text = extracted.read().decode()
    metadata = yaml.safe_load(text)
    return metadata if isinstance(metadata, dict) else {}


def _check_longhorn_chart(settings: StackSettings) -> Iterator[SettingProblem]:
    storage = settings.storage
    chart = storage.longhorn_chart
    if chart is None:
        return
    key = _key("storage", "longhorn_chart")
    if not storage.install_longhorn:
        yield SettingProblem(key, "install_longhorn is false, so no chart is installed; remove longhorn_chart")
        return
    path = chart.expanduser()
    try:
        metadata = _chart_metadata(path)
    except (OSError, StopIteration, tarfile.TarError, yaml.YAMLError):
        yield SettingProblem(
            key,
            f"{path} is not a Helm chart (a folder with Chart.yaml, or a packaged .tgz); give the path of "
            "Longhorn's chart, or unset it to fetch the chart from its repository",
        )
        return
    name, version = metadata.get("name"), str(metadata.get("version"))
    if name != "longhorn" or version != storage.longhorn_version:
        yield SettingProblem(
            key,
            f"{path} holds chart {name} {version}, not longhorn {storage.longhorn_version} "
            "(storage.longhorn_version); give that chart, or set longhorn_version to the chart's version",
        )


def _check_fences(settings: StackSettings) -> Iterator[SettingProblem]:
    workers = {worker.name for worker in settings.all_workers()}
    for name, fence in settings.fences.items():
        if name == settings.server.name:
            yield SettingProblem(
                _key("fences", name),
                f"{name} is the server; only workers can be fenced. Remove this entry",
            )
        elif fence.force_remove and name in workers:
            yield SettingProblem(
                f"{_key('fences', name)}.force_remove",
                f"{name} is still in hk3s:workers or hk3s:worker_pools: a worker given up leaves the stack. Drop it "
                "from there too (CLI: node remove NAME --force), or remove force_remove to keep it fenced",
            )
        elif fence.force_remove:
            continue
        elif name not in workers:
            yield SettingProblem(
                _key("fences", name),
                f"there is no worker named {name!r} in hk3s:workers or hk3s:worker_pools; fix the name or "
                "remove the entry",
            )


def _check_workers(settings: StackSettings) -> Iterator[SettingProblem]:
    reported: set[str] = set()
    for worker in settings.all_workers():
        key = _host_key(settings, worker, "ignore_slow_disk")
        if worker.ignore_slow_disk and not worker.holds_copies and key not in reported:
            reported.add(key)
            yield SettingProblem(
                key,
                f"{worker.name} does not hold copies (holds_copies: false), so there is no disk check "
                "to override; remove ignore_slow_disk",
            )


def _check_pools(settings: StackSettings) -> Iterator[SettingProblem]:
    seen: dict[str, str] = {}
    for index, pool in enumerate(settings.worker_pools):
        key = _key("worker_pools", index, "name")
        if pool.name in seen:
            yield SettingProblem(
                key, f"{pool.name!r} is already the name of {seen[pool.name]}; pool names must be unique"
            )
        else:
            seen[pool.name] = key
    for index, worker in enumerate(settings.workers):
        if worker.pool is not None and worker.pool not in seen:
            known = ", ".join(pool.name for pool in settings.worker_pools) or "none"
            yield SettingProblem(
                _key("workers", index, "pool"),
                f"there is no pool named {worker.pool!r} in hk3s:worker_pools (pools: {known}); "
                "fix the name or remove pool",
            )
