"""Real Debian hosts for tests: systemd-nspawn containers on lab bridges, reached by real SSH.

A :class:`Lab` owns, on this machine:

* a Debian bookworm base tree, built once by debootstrap into
  ``cache_dir/base-<hash of the package list>`` and shared read-only;
* a "public" bridge ``<id>-pub`` in the root network namespace.  The root
  namespace is its gateway (``.1``) and masquerades it to the uplink so hosts
  reach Debian's packages, PyPI and the Go proxy;
* a "private" bridge ``<id>-prv`` (a Hetzner-like network, ``10.0.0.0/16`` by
  default) with no address in the root namespace.  Its gateway ``.1`` lives in
  the lab's gateway namespace ``<id>-gw``, which NATs it out through the
  public bridge, so a host whose default route is the private NIC still
  reaches the packages;
* per host: a network namespace ``<id>-h-<name>`` with ``eth0`` (public) and
  optionally ``enp7s0`` (private, MTU 1450 like Hetzner), an overlay mount of
  the base tree, per-host SSH host keys, machine-id and hostname, and a
  detached supervisor process running ``systemd-nspawn --boot``;
* a host "behind NAT" gets a small router namespace ``<id>-r-<name>`` between
  its ``eth0`` and the public bridge: it can connect out, nothing on the
  public bridge can connect in.  The lab reaches it over SSH from inside that
  router namespace (its LAN).

Address ranges are picked when the lab's network is set up, so they clash with
no route or address of this machine, no resolver, and no address the
machine's resolver gives for the package registries (see
:func:`reserved_networks`).  The picks are logged (logger ``lab.hosts``) and
kept on :attr:`Lab.plan`.

Every name the lab creates starts with its id (``hk`` + 4 hex digits), so
labs never collide; :meth:`Lab.teardown` removes them all, and
:meth:`Lab.leftovers` lists whatever is still there.

On the machine itself the lab turns on ``net.ipv4.ip_forward`` (and leaves
it on) and needs the Debian packages in :data:`MACHINE_PACKAGES` (install
them with ``--no-install-recommends``).

Command line: ``python -m lab.hosts up --hosts 3 [--variety]`` / ``python -m
lab.hosts list`` / ``python -m lab.hosts down [--lab ID | --all]``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from lab import pod_hosts, slow_disk

log = logging.getLogger("lab.hosts")

IPv4Network = ipaddress.IPv4Network
IPv4Address = ipaddress.IPv4Address

FILES_DIR = Path(__file__).resolve().parent / "hosts_files"
SUPERVISOR = FILES_DIR / "supervisor.py"
NETDELAY = FILES_DIR / "netdelay.py"

DEFAULT_CACHE_DIR = Path(os.environ.get("HK3S_LAB_CACHE", "/var/cache/hk3s-lab"))
DEFAULT_RUN_ROOT = Path(os.environ.get("HK3S_LAB_RUN", "/var/tmp/hk3s-lab"))
GLOBAL_LOCK = Path("/run/hk3s-lab.lock")

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
#: Packages of the base tree, on top of debootstrap's minbase.  No firewall:
#: tests install ufw/firewalld through NAT, or ask for a variant base.
BASE_PACKAGES: tuple[str, ...] = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "openssh-sftp-server",  # SFTP-based file copies (e.g. pulumi-command CopyToRemote)
    "iproute2",
    "iputils-ping",
    "curl",
    "ca-certificates",
    "kmod",
    "procps",
    "nftables",
    "iptables",  # k3s and kube-proxy use it; UFW sits on it
    "python3",
    "sudo",
    "netbase",  # /etc/services, /etc/protocols
    "netcat-openbsd",
)
#: Bump when the post-processing of the base tree changes.
BASE_LAYOUT = 1
#: Machine packages the lab needs (the CI script installs them).
MACHINE_PACKAGES: tuple[str, ...] = (
    "debootstrap",
    "systemd-container",
    "iproute2",
    "nftables",
    "iptables",
    "openssh-client",
    "util-linux",
    "procps",
)

#: Hosts whose addresses (as this machine's resolver gives them) the lab must keep reachable.
REGISTRY_HOSTS: tuple[str, ...] = (
    "deb.debian.org",
    "pypi.org",
    "files.pythonhosted.org",
    "proxy.golang.org",
)
#: k3s's default pod and service networks: lab-picked ranges avoid them.
K3S_DEFAULT_NETS: tuple[IPv4Network, ...] = (IPv4Network("10.42.0.0/16"), IPv4Network("10.43.0.0/16"))

PUBLIC_CANDIDATES: tuple[IPv4Network, ...] = (
    IPv4Network("198.51.100.0/24"),
    IPv4Network("203.0.113.0/24"),
    IPv4Network("192.0.2.0/24"),
    *(IPv4Network(f"198.{18 + n // 256}.{n % 256}.0/24") for n in range(512)),
)
PRIVATE_CANDIDATES: tuple[IPv4Network, ...] = (
    *(IPv4Network(f"10.{n}.0.0/16") for n in range(0, 40)),
    *(IPv4Network(f"172.{n}.0.0/16") for n in range(16, 32)),
)
NAT_CANDIDATES: tuple[IPv4Network, ...] = (
    *(IPv4Network(f"100.{n}.0.0/16") for n in range(64, 128)),
    IPv4Network("192.168.0.0/16"),
)

#: Where lab hosts' traffic must never go through the uplink (resolvers and registries excepted).
SPECIAL_NETS: tuple[IPv4Network, ...] = tuple(
    IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "240.0.0.0/4",
    )
)

PUBLIC_IFNAME = "eth0"
PRIVATE_IFNAME = "enp7s0"
PRIVATE_MTU = 1450
NETEM_QUEUES = {"public": 4101, "private": 4102}
NETEM_COMMENT = "hk3s-lab-netem"
SSH_USER = "root"
MAX_HOSTS = 80
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
_LAB_ID_RE = re.compile(r"^hk[0-9a-f]{4}$")

Link = Literal["public", "private"]


class LabError(RuntimeError):
    """A lab operation failed; the message says what and, where known, why."""


class HostNotRunningError(LabError):
    """The host's container is not running (powered off or failed to boot)."""


HostNotRunning = HostNotRunningError


# --------------------------------------------------------------------------- helpers


def _run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    check: bool = True,
    timeout: float | None = 120,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    args = [os.fspath(a) for a in argv]
    log.debug("run: %s", shlex.join(args))
    try:
        proc = subprocess.run(
            args,
            check=False,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=None if input_text is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as err:
        raise LabError(f"timed out after {timeout}s: {shlex.join(args)}") from err
    except FileNotFoundError as err:
        raise LabError(f"command not found: {args[0]}") from err
    if check and proc.returncode != 0:
        raise LabError(f"command failed ({proc.returncode}): {shlex.join(args)}\n{proc.stderr.strip()}")
    return proc


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return _run(argv, check=check)


def _ip_json(*args: str, netns: str | None = None) -> list[dict[str, Any]]:
    out = _ip("-j", *args, netns=netns).stdout.strip()
    return list(json.loads(out)) if out else []


def _nft(ruleset: str, netns: str | None = None) -> None:
    argv = (["ip", "netns", "exec", netns] if netns else []) + ["nft", "-f", "-"]
    _run(argv, input_text=ruleset)


def _sysctl(key: str, value: str, netns: str | None = None) -> None:
    argv = (["ip", "netns", "exec", netns] if netns else []) + ["sysctl", "-qw", f"{key}={value}"]
    _run(argv)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _container_leader(nspawn_pid: int) -> int | None:
    """PID of the container's init: a child of systemd-nspawn whose innermost NSpid is 1."""
    try:
        children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                if len(ids) > 1 and ids[-1] == "1":
                    return int(child)
    return None


def _mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path``, deepest first."""
    found: list[Path] = []
    prefix = os.fspath(path).rstrip("/")
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == prefix or mount_point.startswith(prefix + "/"):
                found.append(Path(mount_point))
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _umount_all(path: Path) -> None:
    for _ in range(3):
        mounts = _mounts_under(path)
        if not mounts:
            return
        for mount_point in mounts:
            if _run(["umount", mount_point], check=False).returncode != 0:
                _run(["umount", "-l", mount_point], check=False)
    remaining = _mounts_under(path)
    if remaining:
        raise LabError(f"could not unmount {', '.join(map(str, remaining))}")


def _safe_rmtree(path: Path) -> None:
    """Remove a tree only when nothing is mounted inside it (never follow a bind of /dev or /proc)."""
    if not path.exists():
        return
    _umount_all(path)
    shutil.rmtree(path)


def _key_fingerprint(public_key_line: str) -> str:
    blob = base64.b64decode(public_key_line.split()[1])
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _resolve_ipv4(names: Iterable[str], timeout: float = 5.0) -> dict[str, list[str]]:
    results: dict[str, list[str]] = {}

    def resolve(name: str) -> None:
        try:
            infos = socket.getaddrinfo(name, 443, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            return
        results[name] = sorted({str(info[4][0]) for info in infos})

    threads = [threading.Thread(target=resolve, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return dict(results)


def machine_nameservers() -> list[str]:
    """IPv4 nameservers the hosts can use (the machine's, skipping loopback stubs)."""
    found: list[str] = []
    for candidate in (Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf")):
        try:
            lines = candidate.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                try:
                    addr = IPv4Address(parts[1])
                except ValueError:
                    continue
                if not addr.is_loopback and str(addr) not in found:
                    found.append(str(addr))
        if found:
            break
    return found


@dataclass(frozen=True)
class Reserved:
    """A network the lab must not use, and why."""

    network: IPv4Network
    reason: str


def reserved_networks(registry_hosts: Sequence[str] = REGISTRY_HOSTS) -> list[Reserved]:
    """Everything lab ranges must not overlap: this machine's IPv4 routes (all
    tables, default routes aside) and addresses, its resolvers, and the
    addresses its resolver gives for the package registries."""
    reserved: list[Reserved] = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst = str(route.get("dst", ""))
        if not dst or dst == "default" or dst.startswith("0.0.0.0/0"):
            continue
        if route.get("type") in ("multicast",):
            continue
        try:
            network = IPv4Network(dst, strict=False)
        except ValueError:
            continue
        reserved.append(Reserved(network, f"route to {dst} dev {route.get('dev', '?')}"))
    for link in _ip_json("-4", "addr", "show"):
        for info in link.get("addr_info", []):
            try:
                network = IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            except (KeyError, ValueError):
                continue
            reserved.append(Reserved(network, f"address {info['local']} on {link.get('ifname', '?')}"))
    for server in machine_nameservers():
        reserved.append(Reserved(IPv4Network(f"{server}/32"), f"resolver {server}"))
    for name, addresses in _resolve_ipv4(registry_hosts).items():
        for addr in addresses:
            reserved.append(Reserved(IPv4Network(f"{addr}/32"), f"{name} resolves to {addr}"))
    return reserved


def pick_network(candidates: Iterable[IPv4Network], reserved: Sequence[Reserved]) -> IPv4Network:
    """The first candidate overlapping nothing reserved."""
    for candidate in candidates:
        if not any(candidate.overlaps(r.network) for r in reserved):
            return candidate
    raise LabError("no free address range among the candidates; reserved: " + "; ".join(r.reason for r in reserved))


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class HostSpec:
    """What a host looks like.  Addresses follow from the lab's ranges and the host's index.

    * ``private_nic``: attach a NIC (``enp7s0``) to the lab's private bridge.
    * ``private_default_route``: the default route goes through the private
      NIC (via the network's gateway ``.1``, which NATs to the packages); the
      public NIC keeps its address but has no default route.
    * ``behind_nat``: ``eth0`` sits behind a small NAT router: the host can
      connect out, nothing on the public bridge can connect in.
    * ``nat_inbound``: with ``behind_nat``, the router forwards every connection
      to its public address to the host (a cloud's 1:1 NAT: the host's public
      address is on none of its interfaces, yet others reach it there).
    * ``private_cidr``: the private NIC's network, if not the lab's (e.g. to
      overlap k3s's pod network 10.42.0.0/16).
    * ``extra_binds``: ``(machine path, container path)`` read-only binds;
      ``extra_binds_rw`` read-write ones.
    * ``extra_packages``: boot from a variant base with these packages too.
    * ``extra_nspawn_args``: passed to systemd-nspawn as they are.
    * ``pods``: the host can run pods (LAB ONLY, see :mod:`lab.pod_hosts`): its own
      writable cgroup subtree, plain directories for containerd and the kubelet, the
      runtime built by ``lab/build/pod_runtime.sh`` where k3s keeps its bundled binaries.
    * ``disk_sync_delay_ms``: ``/var/lib/longhorn`` is a disk whose every sync waits this
      long (LAB ONLY, see :mod:`lab.slow_disk`; changeable while the host runs).
    """

    name: str
    private_nic: bool = True
    private_default_route: bool = False
    behind_nat: bool = False
    nat_inbound: bool = False
    private_cidr: str | None = None
    extra_binds: tuple[tuple[Path, str], ...] | list[tuple[Path, str]] = ()
    extra_binds_rw: tuple[tuple[Path, str], ...] | list[tuple[Path, str]] = ()
    extra_packages: tuple[str, ...] = ()
    extra_nspawn_args: tuple[str, ...] = ()
    pods: bool = False
    disk_sync_delay_ms: float | None = None
    private_mtu: int = PRIVATE_MTU
    index: int | None = None

    def validate(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"host name {self.name!r}: use 1-32 of a-z, 0-9 and '-' (a hostname label)")
        if self.private_default_route and not self.private_nic:
            raise ValueError(f"host {self.name}: private_default_route needs private_nic")
        if self.nat_inbound and not self.behind_nat:
            raise ValueError(f"host {self.name}: nat_inbound needs behind_nat")
        if self.private_cidr is not None and not self.private_nic:
            raise ValueError(f"host {self.name}: private_cidr needs private_nic")
        if self.private_cidr is not None:
            net = IPv4Network(self.private_cidr, strict=False)
            if net.num_addresses < 4:
                raise ValueError(f"host {self.name}: private_cidr {net} is too small")
        if self.index is not None and not 1 <= self.index <= MAX_HOSTS:
            raise ValueError(f"host {self.name}: index must be within 1..{MAX_HOSTS}")
        for _src, dst in list(self.extra_binds) + list(self.extra_binds_rw):
            if not dst.startswith("/") or ":" in dst:
                raise ValueError(f"host {self.name}: bind target {dst!r} must be an absolute path without ':'")


@dataclass(frozen=True)
class AddressPlan:
    """The lab's ranges, picked at set-up time."""

    public_net: IPv4Network
    private_net: IPv4Network
    nat_net: IPv4Network
    excluded: tuple[str, ...] = ()

    @property
    def public_gateway(self) -> str:
        return str(self.public_net.network_address + 1)

    @property
    def gateway_public_ip(self) -> str:
        return str(self.public_net.network_address + 2)

    @property
    def private_gateway(self) -> str:
        return str(self.private_net.network_address + 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "public_net": str(self.public_net),
            "private_net": str(self.private_net),
            "nat_net": str(self.nat_net),
            "excluded": list(self.excluded),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AddressPlan:
        return cls(
            IPv4Network(data["public_net"]),
            IPv4Network(data["private_net"]),
            IPv4Network(data["nat_net"]),
            tuple(data.get("excluded", ())),
        )


# --------------------------------------------------------------------------- host


@dataclass
class Host:
    """A booted (or powered-off) lab host.  Create through :meth:`Lab.add_host`."""

    spec: HostSpec
    index: int
    netns: str
    public_ip: str | None
    """Address on the public bridge; None for a host behind NAT."""
    private_ip: str | None
    egress_ip: str
    """The source address the public bridge sees for this host's connections."""
    ssh_ip: str
    """The address the lab connects to (the NAT'd address for a host behind NAT)."""
    ssh_private_key_path: Path
    known_hosts_path: Path
    dir: Path
    ssh_host_key_fingerprint: str = ""
    ssh_host_public_key: str = ""
    machine_id: str = ""
    router_netns: str | None = None
    nat_inner_ip: str | None = None
    private_network: str | None = None
    private_gateway: str | None = None
    cgroup_dirs: dict[str, str] = field(default_factory=dict)
    """A pod-capable host's cgroup subtree: hierarchy name -> directory on the machine."""
    lab: Lab | None = field(default=None, repr=False, compare=False)

    # ---- identity

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def root(self) -> Path:
        """The host's root filesystem (overlay mount) as seen from the machine."""
        return self.dir / "root"

    @property
    def public_ifname(self) -> str:
        return PUBLIC_IFNAME

    @property
    def private_ifname(self) -> str | None:
        return PRIVATE_IFNAME if self.spec.private_nic else None

    @property
    def ssh_user(self) -> str:
        return SSH_USER

    def _lab(self) -> Lab:
        if self.lab is None:
            raise LabError(f"host {self.name} is detached from its lab")
        return self.lab

    # ---- process state

    @property
    def supervisor_pid(self) -> int | None:
        pid = _read_pid(self.dir / "supervisor.pid")
        return pid if pid is not None and _pid_alive(pid) else None

    @property
    def nspawn_pid(self) -> int | None:
        pid = _read_pid(self.dir / "nspawn.pid")
        return pid if pid is not None and _pid_alive(pid) else None

    @property
    def leader_pid(self) -> int | None:
        """PID (on the machine) of the container's systemd."""
        nspawn = self.nspawn_pid
        return _container_leader(nspawn) if nspawn is not None else None

    @property
    def boots(self) -> int:
        """How many times the container was started (reboots included)."""
        try:
            return int((self.dir / "boots").read_text())
        except (OSError, ValueError):
            return 0

    @property
    def is_running(self) -> bool:
        return self.supervisor_pid is not None

    # ---- commands

    def ssh_argv(self, command: str | Sequence[str] | None = None, *, connect_timeout: int = 5) -> list[str]:
        """argv that runs ``command`` on the host with the ``ssh`` client, checking
        the recorded host key (StrictHostKeyChecking=yes).  For a host behind
        NAT the client runs inside its router namespace (the host's LAN)."""
        argv: list[str] = []
        if self.router_netns:
            argv += ["ip", "netns", "exec", self.router_netns]
        argv += [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.ssh_private_key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "UpdateHostKeys=no",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={connect_timeout}",
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            "LogLevel=ERROR",
            f"{SSH_USER}@{self.ssh_ip}",
        ]
        if command is not None:
            argv += ["--", command if isinstance(command, str) else shlex.join(command)]
        return argv

    def ssh(
        self, command: str | Sequence[str], *, check: bool = True, timeout: float = 60, connect_timeout: int = 5
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` over real SSH."""
        return _run(self.ssh_argv(command, connect_timeout=connect_timeout), check=check, timeout=timeout)

    def nsenter_argv(self, command: str | Sequence[str]) -> list[str]:
        leader = self.leader_pid
        if leader is None:
            raise HostNotRunningError(f"host {self.name} is not running")
        argv = ["nsenter", "-t", str(leader), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"]
        if isinstance(command, str):
            return [*argv, "/bin/sh", "-c", command]
        return argv + list(command)

    def run(
        self,
        command: str | Sequence[str],
        *,
        via: Literal["nsenter", "ssh"] = "nsenter",
        check: bool = True,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on the host: a string goes through ``sh -c``, a list is
        run as it is.  ``via="nsenter"`` (default) enters the container's
        namespaces directly and works while a link is down; ``via="ssh"`` uses
        real SSH."""
        if via == "ssh":
            return self.ssh(command, check=check, timeout=timeout)
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
        }
        return _run(self.nsenter_argv(command), check=check, timeout=timeout, env=env)

    def netns_run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a machine binary inside the host's network namespace (works while powered off)."""
        return _run(["ip", "netns", "exec", self.netns, *argv], check=check, timeout=timeout)

    def routes(self) -> list[dict[str, Any]]:
        """The host's IPv4 main routing table (``ip -j route``)."""
        return _ip_json("-4", "route", "show", netns=self.netns)

    def addresses(self) -> dict[str, list[str]]:
        """IPv4 addresses per interface (``ip -j addr``), as ``addr/prefix``."""
        result: dict[str, list[str]] = {}
        for link in _ip_json("-4", "addr", "show", netns=self.netns):
            result[str(link["ifname"])] = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
        return result

    # ---- links

    def _outer(self, link: Link) -> tuple[str | None, str]:
        """(namespace, interface) of the far end of the host's link."""
        lab = self._lab()
        if link == "public":
            if self.router_netns:
                return self.router_netns, "lan0"
            return None, lab._veth(self.index, "p")
        if link == "private":
            if not self.spec.private_nic:
                raise LabError(f"host {self.name} has no private NIC")
            return None, lab._veth(self.index, "v")
        raise ValueError(f"link must be 'public' or 'private', not {link!r}")

    def _ifname(self, link: Link) -> str:
        if link == "public":
            return PUBLIC_IFNAME
        if not self.spec.private_nic:
            raise LabError(f"host {self.name} has no private NIC")
        return PRIVATE_IFNAME

    def link_down(self, link: Link) -> None:
        """Pull the cable: the far end goes down, the host's NIC loses carrier (its addresses and routes stay)."""
        netns, ifname = self._outer(link)
        _ip("link", "set", ifname, "down", netns=netns)

    def link_up(self, link: Link) -> None:
        netns, ifname = self._outer(link)
        _ip("link", "set", ifname, "up", netns=netns)

    def link_is_up(self, link: Link) -> bool:
        netns, ifname = self._outer(link)
        info = _ip_json("link", "show", "dev", ifname, netns=netns)
        return bool(info) and "UP" in info[0].get("flags", [])

    # ---- network emulation

    def netem(self, delay_ms: float = 0, loss_pct: float = 0.0, link: Link | Literal["all"] = "public") -> None:
        """Add ``delay_ms`` of latency to ``link`` and drop ``loss_pct`` percent of what the host sends on it.

        Uses ``tc qdisc netem`` (on the host's egress) when the kernel has it.
        Kernels built without sch_netem (like this lab machine's) get an
        emulation in the host's network namespace: an iptables NFQUEUE rule
        feeds packets arriving on the link to a small delay daemon
        (``hosts_files/netdelay.py``), and a ``statistic`` rule drops
        outgoing packets.  Either way a round trip over the link takes
        ``delay_ms`` longer.  Needs the machine's ``iptables`` (nf_tables)."""
        links: list[Link] = ["public", "private"] if link == "all" else [link]
        if link == "all" and not self.spec.private_nic:
            links = ["public"]
        for one in links:
            self._netem_one(one, float(delay_ms), float(loss_pct))

    def _netem_one(self, link: Link, delay_ms: float, loss_pct: float) -> None:
        self.clear_netem(link)
        ifname = self._ifname(link)
        if delay_ms <= 0 and loss_pct <= 0:
            return
        if self._lab().kernel_has_netem():
            args = ["tc", "qdisc", "replace", "dev", ifname, "root", "netem"]
            if delay_ms > 0:
                args += ["delay", f"{delay_ms}ms"]
            if loss_pct > 0:
                args += ["loss", f"{loss_pct}%"]
            self.netns_run(args)
            return
        comment = ["-m", "comment", "--comment", f"{NETEM_COMMENT}-{link}"]
        mangle = ["iptables", "-w", "5", "-t", "mangle", "-A"]
        if loss_pct > 0:
            probability = f"{min(loss_pct, 100.0) / 100.0:.6f}"
            drop = ["-m", "statistic", "--mode", "random", "--probability", probability, "-j", "DROP"]
            self.netns_run([*mangle, "POSTROUTING", "-o", ifname, *comment, *drop])
        if delay_ms > 0:
            # Delay what arrives: queueing the host's own outgoing packets would
            # keep them charged to their sockets and TCP small queues would
            # throttle bulk sends to a few packets per delay period.
            queue = NETEM_QUEUES[link]
            self._start_delay_daemon(link, queue, delay_ms)
            nfqueue = ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
            self.netns_run([*mangle, "PREROUTING", "-i", ifname, *comment, *nfqueue])

    def _start_delay_daemon(self, link: Link, queue: int, delay_ms: float) -> None:
        pid_file = self.dir / f"netdelay-{link}.pid"
        log_file = self.dir / f"netdelay-{link}.log"
        tag = f"{self._lab().lab_id}/{self.name}/{link}"
        argv = ["ip", "netns", "exec", self.netns, sys.executable, "-I", str(NETDELAY), str(queue), str(delay_ms), tag]
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out, start_new_session=True
            )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        proc.stdout.close()
        if line != "ready":
            proc.kill()
            proc.wait()
            raise LabError(f"netem delay daemon for {self.name}/{link} did not start; see {log_file}")
        pid_file.write_text(str(proc.pid))

    def clear_netem(self, link: Link | Literal["all"] = "all") -> None:
        links: list[Link] = ["public", "private"] if link == "all" else [link]
        for one in links:
            if one == "private" and not self.spec.private_nic:
                continue
            ifname = self._ifname(one)
            self.netns_run(["tc", "qdisc", "del", "dev", ifname, "root"], check=False)
            if shutil.which("iptables"):
                for chain in ("PREROUTING", "POSTROUTING"):
                    listing = self.netns_run(["iptables", "-w", "5", "-t", "mangle", "-S", chain], check=False)
                    for rule in listing.stdout.splitlines():
                        if f"{NETEM_COMMENT}-{one}" in rule and rule.startswith("-A "):
                            spec = shlex.split(rule)[1:]
                            self.netns_run(["iptables", "-w", "5", "-t", "mangle", "-D", *spec], check=False)
            pid_file = self.dir / f"netdelay-{one}.pid"
            pid = _read_pid(pid_file)
            if pid is not None:
                _terminate(pid)
                pid_file.unlink(missing_ok=True)

    # ---- power

    def power_off(self, *, graceful: bool = False, timeout: float = 60) -> None:
        """Stop the container.  ``graceful=False`` is a hard power off (the
        container's init is killed, like Hetzner's poweroff); ``graceful=True``
        is an orderly shutdown.  The disk (overlay upper dir) is kept."""
        pid = self.supervisor_pid
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM if graceful else signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                raise LabError(f"host {self.name} did not power off within {timeout}s")
            time.sleep(0.1)

    def shutdown(self, timeout: float = 60) -> None:
        """Orderly shutdown (``systemctl poweroff`` semantics)."""
        self.power_off(graceful=True, timeout=timeout)

    def power_on(self, *, wait: bool = False, timeout: float = 120) -> None:
        """Start the container again (same disk).  ``wait=True`` waits until SSH answers."""
        if self.is_running:
            return
        self._lab()._start_container(self)
        if wait:
            self._lab().wait_ssh_ready([self], timeout=timeout)

    def reboot(self, *, wait: bool = True, timeout: float = 120) -> None:
        """``systemctl reboot`` inside; the supervisor starts the container again."""
        if not self.is_running:
            raise HostNotRunningError(f"host {self.name} is not running")
        boots_before = self.boots
        leader_before = self.leader_pid
        self.run(["systemctl", "reboot"], check=False, timeout=30)
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader_pid
            if (
                self.boots > boots_before
                or (leader is not None and leader_before is not None and leader != leader_before)
            ) and leader is not None:
                break
            if not self.is_running:
                # nspawn ended without asking for a restart: start it ourselves.
                self._lab()._start_container(self)
                boots_before = self.boots
            if time.monotonic() > deadline:
                raise LabError(f"host {self.name} did not come back from reboot within {timeout}s")
            time.sleep(0.1)
        if wait:
            self._lab().wait_ssh_ready([self], timeout=max(10.0, deadline - time.monotonic()))

    # ---- SSH host keys

    def regenerate_host_key(self) -> str:
        """New SSH host keys (all types); the lab's known_hosts follows.  Returns the new fingerprint."""
        lab = self._lab()
        for key in (self.root / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()
        lab._generate_host_keys(self)
        if self.is_running and self.leader_pid is not None:
            self.run(["systemctl", "reload-or-restart", "ssh.service"], check=False, timeout=30)
            # sshd re-executes on reload: wait until it listens again.
            self.wait_sshd_listening("after the host key change")
        return self.ssh_host_key_fingerprint

    def wait_sshd_listening(self, after: str, timeout: float = 15) -> None:
        """Wait until sshd accepts connections again (it re-executes itself on a reload)."""
        probe = "import socket; socket.create_connection(('127.0.0.1', 22), 1).close()"
        deadline = time.monotonic() + timeout
        while self.run(["python3", "-c", probe], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise LabError(f"host {self.name}: sshd did not come back {after}")
            time.sleep(0.1)

    def set_sshd_options(self, lines: Sequence[str]) -> None:
        """Put `lines` in an sshd drop-in read before every other (sshd keeps the first value
        it reads), e.g. ``MaxStartups 2:100:2``, and restart sshd with them."""
        conf = self.root / "etc/ssh/sshd_config.d/05-hk3s-lab-test.conf"
        conf.write_text("".join(f"{line}\n" for line in lines))
        self.run(["sshd", "-t"], timeout=30)
        self.run(["systemctl", "restart", "ssh.service"], timeout=30)
        self.wait_sshd_listening("with the new options")

    def sshd_log(self, since: float | None = None) -> list[str]:
        """sshd's journal lines, each led by its UNIX time (``journalctl -o short-unix``)."""
        argv = ["journalctl", "-u", "ssh.service", "-o", "short-unix", "--no-pager"]
        if since is not None:
            argv += ["--since", f"@{since:.0f}"]
        return self.run(argv, timeout=60).stdout.splitlines()

    # ---- state

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for item in fields(self):
            if item.name in ("lab", "spec"):
                continue
            value = getattr(self, item.name)
            data[item.name] = str(value) if isinstance(value, Path) else value
        data["spec"] = _spec_to_json(self.spec)
        return data


def _spec_to_json(spec: HostSpec) -> dict[str, Any]:
    data = asdict(spec)
    data["extra_binds"] = [[str(src), dst] for src, dst in spec.extra_binds]
    data["extra_binds_rw"] = [[str(src), dst] for src, dst in spec.extra_binds_rw]
    data["extra_packages"] = list(spec.extra_packages)
    data["extra_nspawn_args"] = list(spec.extra_nspawn_args)
    return data


def _spec_from_json(data: dict[str, Any]) -> HostSpec:
    values = dict(data)
    values["extra_binds"] = tuple((Path(src), dst) for src, dst in data.get("extra_binds", []))
    values["extra_binds_rw"] = tuple((Path(src), dst) for src, dst in data.get("extra_binds_rw", []))
    values["extra_packages"] = tuple(data.get("extra_packages", []))
    values["extra_nspawn_args"] = tuple(data.get("extra_nspawn_args", []))
    return HostSpec(**values)


def _terminate(pid: int, timeout: float = 5.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- lab


@dataclass
class Leftovers:
    """What of a lab is still on the machine (all empty after a teardown)."""

    netns: list[str]
    links: list[str]
    mounts: list[str]
    processes: list[str]
    nft_tables: list[str]
    cgroups: list[str] = field(default_factory=list)
    """Cgroup directories a pod-capable host created on the machine."""

    def empty(self) -> bool:
        return not (self.netns or self.links or self.mounts or self.processes or self.nft_tables or self.cgroups)


class Lab:
    """A set of lab hosts and their networks.  Use as a context manager, or call :meth:`teardown`."""

    def __init__(
        self,
        cache_dir: Path = DEFAULT_CACHE_DIR,
        run_dir: Path | None = None,
        *,
        lab_id: str | None = None,
        private_cidr: str | None = None,
        mirror: str = MIRROR,
        registry_hosts: Sequence[str] = REGISTRY_HOSTS,
    ) -> None:
        self.lab_id = lab_id or self._new_lab_id()
        if not _LAB_ID_RE.match(self.lab_id):
            raise ValueError(f"lab id {self.lab_id!r} must be 'hk' + 4 hex digits")
        self.cache_dir = Path(cache_dir)
        self.run_dir = Path(run_dir) if run_dir is not None else DEFAULT_RUN_ROOT / self.lab_id
        for char in ",:":
            if char in os.fspath(self.run_dir.resolve()) or char in os.fspath(self.cache_dir.resolve()):
                raise ValueError(f"run_dir and cache_dir must not contain {char!r} (overlayfs options)")
        self.mirror = mirror
        self.registry_hosts = tuple(registry_hosts)
        self.requested_private_cidr = private_cidr
        self.plan: AddressPlan | None = None
        self.hosts: dict[str, Host] = {}
        self.created_by_cli = False
        self.owner_pid = os.getpid()
        self._lock = threading.RLock()
        self._netem_available: bool | None = None
        self._torn_down = False
        self._gateway_networks: list[IPv4Network] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "hosts").mkdir(exist_ok=True)
        self.ssh_dir = self.run_dir / "ssh"
        self.ssh_dir.mkdir(mode=0o700, exist_ok=True)
        self.ssh_private_key_path = self.ssh_dir / "id_ed25519"
        self.known_hosts_path = self.ssh_dir / "known_hosts"
        if not self.ssh_private_key_path.exists():
            _run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    f"hk3s-lab-{self.lab_id}",
                    "-f",
                    self.ssh_private_key_path,
                ]
            )
        self.ssh_public_key = self.ssh_private_key_path.with_suffix(".pub").read_text().strip()
        self.known_hosts_path.touch()
        if not (self.run_dir / "state.json").exists():
            self._save_state()

    # ---- names

    @staticmethod
    def _new_lab_id() -> str:
        existing = {entry.name for entry in DEFAULT_RUN_ROOT.glob("hk*")} if DEFAULT_RUN_ROOT.exists() else set()
        netns = set(_run(["ip", "netns", "list"], check=False).stdout.split())
        for _ in range(100):
            candidate = "hk" + secrets.token_hex(2)
            if candidate not in existing and not any(n.startswith(candidate + "-") for n in netns):
                return candidate
        raise LabError("could not find a free lab id")

    @property
    def prefix(self) -> str:
        return self.lab_id

    @property
    def public_bridge(self) -> str:
        return f"{self.lab_id}-pub"

    @property
    def private_bridge(self) -> str:
        return f"{self.lab_id}-prv"

    @property
    def gateway_netns(self) -> str:
        return f"{self.lab_id}-gw"

    @property
    def nft_table(self) -> str:
        return f"hk3slab_{self.lab_id}"

    def _veth(self, index: int, kind: str) -> str:
        name = f"{self.lab_id}-{index}{kind}"
        assert len(name) <= 15, name
        return name

    def _host_netns(self, name: str) -> str:
        return f"{self.lab_id}-h-{name}"

    def _router_netns(self, name: str) -> str:
        return f"{self.lab_id}-r-{name}"

    # ---- public address attributes

    def _require_plan(self) -> AddressPlan:
        if self.plan is None:
            self.setup_network()
        assert self.plan is not None
        return self.plan

    @property
    def public_net(self) -> str:
        return str(self._require_plan().public_net)

    @property
    def public_gateway(self) -> str:
        return self._require_plan().public_gateway

    @property
    def private_net(self) -> str:
        return str(self._require_plan().private_net)

    @property
    def private_gateway(self) -> str:
        return self._require_plan().private_gateway

    @property
    def nat_net(self) -> str:
        return str(self._require_plan().nat_net)

    # ---- base tree

    @staticmethod
    def base_packages(extra_packages: Iterable[str] = ()) -> tuple[str, ...]:
        return tuple(sorted(set(BASE_PACKAGES) | set(extra_packages)))

    def base_path(self, extra_packages: Iterable[str] = ()) -> Path:
        packages = self.base_packages(extra_packages)
        key = json.dumps({"suite": SUITE, "mirror": self.mirror, "packages": packages, "layout": BASE_LAYOUT})
        return self.cache_dir / f"base-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def ensure_base(self, extra_packages: Iterable[str] = ()) -> Path:
        """The base tree for this package set, built by debootstrap the first time."""
        extra = tuple(extra_packages)
        target = self.base_path(extra)
        if (target / ".hk3s-lab-base.json").exists():
            return target
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with _flock(self.cache_dir / ".build.lock"):
            if (target / ".hk3s-lab-base.json").exists():
                return target
            packages = self.base_packages(extra)
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            _safe_rmtree(tmp)
            for stale in self.cache_dir.glob(f".{target.name}.tmp-*"):
                _safe_rmtree(stale)
            debs = self.cache_dir / "debs"
            debs.mkdir(exist_ok=True)
            log.info("building base %s (debootstrap %s, %d packages)", target.name, SUITE, len(packages))
            started = time.monotonic()
            try:
                _run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--include={','.join(packages)}",
                        f"--cache-dir={debs}",
                        SUITE,
                        tmp,
                        self.mirror,
                    ],
                    timeout=1800,
                )
                _umount_all(tmp)
                self._finish_base(tmp, packages)
            except BaseException:
                with contextlib.suppress(Exception):
                    _safe_rmtree(tmp)
                raise
            os.rename(tmp, target)
            log.info("base %s ready in %.0fs", target.name, time.monotonic() - started)
        return target

    def _finish_base(self, root: Path, packages: Sequence[str]) -> None:
        mirror_root = self.mirror.rstrip("/")
        security = SECURITY_MIRROR if mirror_root == MIRROR else mirror_root + "-security"
        (root / "etc/apt/sources.list").write_text(
            f"deb {mirror_root} {SUITE} main\n"
            f"deb {mirror_root} {SUITE}-updates main\n"
            f"deb {security} {SUITE}-security main\n"
        )
        # Per-host identity is written at boot: no shared host keys or machine-id.
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        (root / "etc/machine-id").write_text("")
        with contextlib.suppress(FileNotFoundError):
            (root / "var/lib/dbus/machine-id").unlink()
        (root / "etc/hostname").write_text("localhost\n")
        for deb in (root / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        # Timers that would take the apt lock from under tests.
        for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer"):
            mask = root / "etc/systemd/system" / unit
            with contextlib.suppress(FileNotFoundError):
                mask.unlink()
            mask.symlink_to("/dev/null")
        conf_dir = root / "etc/ssh/sshd_config.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-hk3s-lab.conf").write_text(
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
        )
        (root / ".hk3s-lab-base.json").write_text(
            json.dumps(
                {
                    "suite": SUITE,
                    "mirror": self.mirror,
                    "packages": list(packages),
                    "layout": BASE_LAYOUT,
                    "built": time.time(),
                }
            )
        )

    # ---- network

    def setup_network(self) -> AddressPlan:
        """Pick the address ranges and create the bridges, the gateway namespace and the NAT rules."""
        with self._lock:
            if self.plan is not None:
                return self.plan
            with _flock(GLOBAL_LOCK):
                reserved = reserved_networks(self.registry_hosts)
                avoid = reserved + [Reserved(n, "k3s default network") for n in K3S_DEFAULT_NETS]
                public = pick_network(PUBLIC_CANDIDATES, avoid)
                avoid.append(Reserved(public, "lab public network"))
                if self.requested_private_cidr is not None:
                    private = IPv4Network(self.requested_private_cidr, strict=False)
                    clash = [r.reason for r in avoid if private.overlaps(r.network)]
                    if clash:
                        raise LabError(f"private network {private} clashes with: {'; '.join(clash)}")
                else:
                    private = pick_network(PRIVATE_CANDIDATES, avoid)
                avoid.append(Reserved(private, "lab private network"))
                nat = pick_network(NAT_CANDIDATES, avoid)
                self.plan = AddressPlan(
                    public, private, nat, tuple(sorted({f"{r.network} ({r.reason})" for r in reserved}))
                )
                log.info(
                    "lab %s: public %s (gateway %s), private %s (gateway %s), behind-NAT LANs in %s; avoided %s",
                    self.lab_id,
                    public,
                    self.plan.public_gateway,
                    private,
                    self.plan.private_gateway,
                    nat,
                    ", ".join(sorted({str(r.network) for r in reserved})),
                )
                self._save_state()
                self._create_core_network()
            self._save_state()
            return self.plan

    def _create_core_network(self) -> None:
        plan = self.plan
        assert plan is not None
        prefix = plan.public_net.prefixlen
        # Public bridge: root namespace is the gateway, masquerading to the uplink.
        _ip("link", "add", self.public_bridge, "type", "bridge")
        _ip("addr", "add", f"{plan.public_gateway}/{prefix}", "dev", self.public_bridge)
        _ip("link", "set", self.public_bridge, "up")
        _ip("link", "add", self.private_bridge, "type", "bridge")
        _ip("link", "set", self.private_bridge, "up")
        self._enable_root_forwarding()
        # Lab traffic leaves only for public addresses, the resolvers and the
        # registries: never for another private or special-purpose address
        # (another lab, the machine's networks, or a host's NAT'd LAN).
        exempt = sorted(
            {IPv4Network(f"{s}/32") for s in machine_nameservers()}
            | {
                IPv4Network(f"{a}/24", strict=False)
                for addrs in _resolve_ipv4(self.registry_hosts).values()
                for a in addrs
            },
            key=lambda n: (int(n.network_address), n.prefixlen),
        )
        exempt = [n for n in exempt if not any(n != o and n.subnet_of(o) for o in exempt)]
        leaving = f'iifname "{self.public_bridge}" oifname != "{self.public_bridge}"'
        exempt_rule = f"    {leaving} ip daddr {{ {', '.join(map(str, exempt))} }} accept\n" if exempt else ""
        special = ", ".join(str(n) for n in SPECIAL_NETS)
        _nft(
            f"""table ip {self.nft_table} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {plan.public_net} ip daddr != {plan.public_net} oifname != "{self.public_bridge}" masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "{self.public_bridge}" oifname "hk*" oifname != "{self.public_bridge}" drop
{exempt_rule}    iifname "{self.public_bridge}" oifname != "{self.public_bridge}" ip daddr {{ {special} }} drop
  }}
}}
"""
        )
        # Gateway namespace: the private network's gateway (.1), NAT to the public bridge.
        gw = self.gateway_netns
        _ip("netns", "add", gw)
        _ip("link", "set", "lo", "up", netns=gw)
        outer_pub = f"{self.lab_id}-gp"
        _ip("link", "add", outer_pub, "type", "veth", "peer", "name", "pub0", "netns", gw)
        _ip("link", "set", outer_pub, "master", self.public_bridge, "up")
        _ip("addr", "add", f"{plan.gateway_public_ip}/{prefix}", "dev", "pub0", netns=gw)
        _ip("link", "set", "pub0", "up", netns=gw)
        _ip("route", "add", "default", "via", plan.public_gateway, netns=gw)
        outer_prv = f"{self.lab_id}-gv"
        _ip(
            "link",
            "add",
            outer_prv,
            "mtu",
            str(PRIVATE_MTU),
            "type",
            "veth",
            "peer",
            "name",
            "prv0",
            "mtu",
            str(PRIVATE_MTU),
            "netns",
            gw,
        )
        _ip("link", "set", outer_prv, "master", self.private_bridge, "up")
        _ip("addr", "add", f"{plan.private_gateway}/{plan.private_net.prefixlen}", "dev", "prv0", netns=gw)
        _ip("link", "set", "prv0", "up", netns=gw)
        self._gateway_networks = [plan.private_net]
        _sysctl("net.ipv4.ip_forward", "1", netns=gw)
        _nft(
            """table ip lab_gateway {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "pub0" masquerade
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    iifname "prv0" accept
    ct state established,related accept
  }
}
""",
            netns=gw,
        )

    def _enable_root_forwarding(self) -> None:
        """The root namespace routes for the public bridge.  Left on at teardown:
        other labs, or anything else on the machine, may rely on it by then."""
        if Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() != "1":
            log.info("setting net.ipv4.ip_forward=1 (stays on after teardown)")
            _sysctl("net.ipv4.ip_forward", "1")

    def _add_gateway_network(self, network: IPv4Network) -> None:
        """Give the gateway namespace an address (.1) in a host's own private network."""
        gateway = network.network_address + 1
        for existing in self._gateway_networks:
            if gateway in existing:
                return
        _ip("addr", "add", f"{gateway}/{network.prefixlen}", "dev", "prv0", netns=self.gateway_netns)
        self._gateway_networks.append(network)

    def kernel_has_netem(self) -> bool:
        """Whether ``tc qdisc ... netem`` works on this kernel (tried in the gateway namespace)."""
        if self._netem_available is None:
            self._require_plan()
            probe = _run(
                ["tc", "-n", self.gateway_netns, "qdisc", "replace", "dev", "pub0", "root", "netem", "delay", "0ms"],
                check=False,
            )
            self._netem_available = probe.returncode == 0
            if self._netem_available:
                _run(["tc", "-n", self.gateway_netns, "qdisc", "del", "dev", "pub0", "root"], check=False)
            else:
                log.info("kernel has no sch_netem: netem() uses NFQUEUE + a delay daemon")
        return self._netem_available

    # ---- hosts

    def add_host(self, spec: HostSpec, *, start: bool = True) -> Host:
        """Create a host (network, disk, identity) and boot it (``start=True``); see :meth:`wait_ssh_ready`."""
        spec.validate()
        with self._lock:
            if self._torn_down:
                raise LabError("lab is torn down")
            if spec.name in self.hosts:
                raise LabError(f"host {spec.name} exists")
            plan = self._require_plan()
            used = {h.index for h in self.hosts.values()}
            if spec.index is not None:
                if spec.index in used:
                    raise LabError(f"host index {spec.index} is taken")
                index = spec.index
            else:
                index = next(i for i in range(1, MAX_HOSTS + 2) if i not in used)
                if index > MAX_HOSTS:
                    raise LabError(f"at most {MAX_HOSTS} hosts per lab")
            base = self.ensure_base(spec.extra_packages)
            host = self._plan_host(spec, index, plan)
            self.hosts[spec.name] = host
            try:
                self._create_host_network(host)
                self._prepare_root(host, base)
                if spec.pods:
                    self._prepare_pods(host)
                if spec.disk_sync_delay_ms is not None:
                    (host.root / slow_disk.DISK_PATH_IN_HOST.lstrip("/")).mkdir(parents=True, exist_ok=True)
                    slow_disk.of_host_dir(host.dir).start(self.cache_dir, spec.disk_sync_delay_ms)
                self._save_state()
            except BaseException:
                self._save_state()
                raise
        if start:
            self._start_container(host)
        return host

    def _plan_host(self, spec: HostSpec, index: int, plan: AddressPlan) -> Host:
        host_dir = self.run_dir / "hosts" / spec.name
        public_ip: str | None = str(plan.public_net.network_address + 10 + index)
        egress_ip = public_ip
        ssh_ip = public_ip
        router_netns = None
        nat_inner_ip = None
        if spec.behind_nat:
            router_public = str(plan.public_net.network_address + 100 + index)
            subnets = list(plan.nat_net.subnets(new_prefix=max(plan.nat_net.prefixlen, 24)))
            if index >= len(subnets):
                raise LabError(f"behind-NAT range {plan.nat_net} has no subnet for host index {index}")
            lan = subnets[index]
            nat_inner_ip = str(lan.network_address + 2)
            public_ip = None
            egress_ip = router_public
            ssh_ip = nat_inner_ip
            router_netns = self._router_netns(spec.name)
        private_ip = None
        private_network = None
        private_gateway = None
        if spec.private_nic:
            network = IPv4Network(spec.private_cidr, strict=False) if spec.private_cidr else plan.private_net
            address = network.network_address + 1 + index
            if address not in network or address == network.broadcast_address:
                raise LabError(f"host {spec.name}: {network} has no address for index {index}")
            private_ip = str(address)
            private_network = str(network)
            private_gateway = str(network.network_address + 1)
            for other in self.hosts.values():
                if other.private_ip == private_ip:
                    raise LabError(f"host {spec.name}: private address {private_ip} is {other.name}'s")
            if spec.private_cidr:
                for server in machine_nameservers():
                    if IPv4Address(server) in network:
                        log.warning("host %s: private network %s covers the resolver %s", spec.name, network, server)
        assert egress_ip is not None and ssh_ip is not None
        return Host(
            spec=spec,
            index=index,
            netns=self._host_netns(spec.name),
            public_ip=public_ip,
            private_ip=private_ip,
            egress_ip=egress_ip,
            ssh_ip=ssh_ip,
            ssh_private_key_path=self.ssh_private_key_path,
            known_hosts_path=self.known_hosts_path,
            dir=host_dir,
            machine_id=uuid.uuid5(uuid.NAMESPACE_URL, f"hk3s-lab:{self.lab_id}:{spec.name}").hex,
            router_netns=router_netns,
            nat_inner_ip=nat_inner_ip,
            private_network=private_network,
            private_gateway=private_gateway,
            lab=self,
        )

    def _create_host_network(self, host: Host) -> None:
        plan = self._require_plan()
        spec = host.spec
        ns = host.netns
        prefix = plan.public_net.prefixlen
        _ip("netns", "add", ns)
        _ip("link", "set", "lo", "up", netns=ns)
        if spec.behind_nat:
            router = host.router_netns
            assert router is not None and host.nat_inner_ip is not None
            lan_gateway = str(IPv4Address(host.nat_inner_ip) - 1)
            _ip("netns", "add", router)
            _ip("link", "set", "lo", "up", netns=router)
            outer = self._veth(host.index, "r")
            _ip("link", "add", outer, "type", "veth", "peer", "name", "wan0", "netns", router)
            _ip("link", "set", outer, "master", self.public_bridge, "up")
            _ip("addr", "add", f"{host.egress_ip}/{prefix}", "dev", "wan0", netns=router)
            _ip("link", "set", "wan0", "up", netns=router)
            _ip("route", "add", "default", "via", plan.public_gateway, netns=router)
            _ip("link", "add", "lan0", "type", "veth", "peer", "name", PUBLIC_IFNAME, "netns", ns, netns=router)
            _ip("addr", "add", f"{lan_gateway}/24", "dev", "lan0", netns=router)
            _ip("link", "set", "lan0", "up", netns=router)
            _sysctl("net.ipv4.ip_forward", "1", netns=router)
            inbound = (
                f"""  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "wan0" dnat to {host.nat_inner_ip}
  }}
"""
                if spec.nat_inbound
                else ""
            )
            _nft(
                f"""table ip lab_nat_router {{
{inbound}  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan0" masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    iifname "lan0" accept
    ct state established,related accept
    ct status dnat accept
  }}
}}
""",
                netns=router,
            )
            _ip("addr", "add", f"{host.nat_inner_ip}/24", "dev", PUBLIC_IFNAME, netns=ns)
            _ip("link", "set", PUBLIC_IFNAME, "up", netns=ns)
            if not spec.private_default_route:
                _ip("route", "add", "default", "via", lan_gateway, "dev", PUBLIC_IFNAME, netns=ns)
        else:
            outer = self._veth(host.index, "p")
            _ip("link", "add", outer, "type", "veth", "peer", "name", PUBLIC_IFNAME, "netns", ns)
            _ip("link", "set", outer, "master", self.public_bridge, "up")
            _ip("addr", "add", f"{host.public_ip}/{prefix}", "dev", PUBLIC_IFNAME, netns=ns)
            _ip("link", "set", PUBLIC_IFNAME, "up", netns=ns)
            if not spec.private_default_route:
                _ip("route", "add", "default", "via", plan.public_gateway, "dev", PUBLIC_IFNAME, netns=ns)
        if spec.private_nic:
            assert host.private_network is not None and host.private_gateway is not None
            network = IPv4Network(host.private_network)
            self._add_gateway_network(network)
            outer = self._veth(host.index, "v")
            mtu = str(spec.private_mtu)
            _ip(
                "link",
                "add",
                outer,
                "mtu",
                mtu,
                "type",
                "veth",
                "peer",
                "name",
                PRIVATE_IFNAME,
                "mtu",
                mtu,
                "netns",
                ns,
            )
            _ip("link", "set", outer, "master", self.private_bridge, "up")
            _ip("addr", "add", f"{host.private_ip}/{network.prefixlen}", "dev", PRIVATE_IFNAME, netns=ns)
            _ip("link", "set", PRIVATE_IFNAME, "up", netns=ns)
            if spec.private_default_route:
                _ip("route", "add", "default", "via", host.private_gateway, "dev", PRIVATE_IFNAME, netns=ns)

    def _prepare_root(self, host: Host, base: Path) -> None:
        for sub in ("upper", "work", "root"):
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
        self._mount_root(host, base)
        root = host.root
        (root / "etc/hostname").write_text(f"{host.name}\n")
        (root / "etc/hosts").write_text(
            "127.0.0.1\tlocalhost\n"
            f"127.0.1.1\t{host.name}\n"
            "::1\tlocalhost ip6-localhost ip6-loopback\n"
            "ff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
        )
        (root / "etc/machine-id").write_text(host.machine_id + "\n")
        resolv = root / "etc/resolv.conf"
        if resolv.is_symlink() or resolv.exists():
            resolv.unlink()
        servers = machine_nameservers()
        if not servers:
            log.warning("no usable nameserver on this machine: hosts will not resolve names")
        resolv.write_text("".join(f"nameserver {s}\n" for s in servers))
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(ssh_dir, 0o700)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(self.ssh_public_key + "\n")
        os.chmod(keys, 0o600)
        for _src, dst in list(host.spec.extra_binds) + list(host.spec.extra_binds_rw):
            (root / dst.lstrip("/")).mkdir(parents=True, exist_ok=True)
        self._generate_host_keys(host)

    def _mount_root(self, host: Host, base: Path | None = None) -> None:
        if _mounts_under(host.root):
            return
        lower = base if base is not None else self.base_path(host.spec.extra_packages)
        if not (lower / ".hk3s-lab-base.json").exists():
            raise LabError(f"base tree {lower} is missing (call ensure_base())")
        options = f"lowerdir={lower},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}"
        _run(["mount", "-t", "overlay", "overlay", "-o", options, host.root])

    def _generate_host_keys(self, host: Host) -> None:
        _run(["ssh-keygen", "-A", "-f", host.root])
        ed25519 = (host.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().strip()
        host.ssh_host_public_key = ed25519
        host.ssh_host_key_fingerprint = _key_fingerprint(ed25519)
        self._write_known_hosts()
        self._save_state()

    def _write_known_hosts(self) -> None:
        lines: list[str] = []
        for host in self.hosts.values():
            names = [host.ssh_ip] + [ip for ip in (host.public_ip, host.private_ip) if ip and ip != host.ssh_ip]
            for pub in sorted((host.root / "etc/ssh").glob("ssh_host_*_key.pub")):
                parts = pub.read_text().split()
                if len(parts) >= 2:
                    lines.append(f"{','.join(names)} {parts[0]} {parts[1]}")
        tmp = self.known_hosts_path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, self.known_hosts_path)

    def _nspawn_argv(self, host: Host) -> list[str]:
        argv = [
            "systemd-nspawn",
            "--quiet",
            "--keep-unit",
            "--register=no",
            "--boot",
            f"--directory={host.root}",
            f"--machine={self.lab_id}-{host.name}",
            f"--hostname={host.name}",
            f"--uuid={host.machine_id}",
            f"--network-namespace-path=/run/netns/{host.netns}",
            "--capability=all",
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
            "--console=read-only",
        ]
        for src, dst in host.spec.extra_binds:
            argv.append(f"--bind-ro={Path(src).resolve()}:{dst}")
        for src, dst in host.spec.extra_binds_rw:
            argv.append(f"--bind={Path(src).resolve()}:{dst}")
        if host.spec.pods:
            argv += pod_hosts.nspawn_args(host.dir, host.dir / "cgroup", self.run_dir / "pod-runtime")
        if host.spec.disk_sync_delay_ms is not None:
            argv.append(slow_disk.of_host_dir(host.dir).nspawn_bind())
        argv += list(host.spec.extra_nspawn_args)
        return argv

    def _prepare_pods(self, host: Host) -> None:
        """A pod-capable host's cgroup subtree, plain directories and runtime (see :mod:`lab.pod_hosts`)."""
        pod_hosts.assemble_runtime(self.cache_dir, self.run_dir / "pod-runtime")
        for sub in ("containerd", "kubelet"):
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
        pod_hosts.install_kernel_files(host.root)
        pod_hosts.install_killall(host.root)
        host.cgroup_dirs = pod_hosts.create_cgroups(f"{self.lab_id}-{host.name}")
        self._save_state()

    def _start_container(self, host: Host) -> None:
        if host.is_running:
            return
        self._mount_root(host)
        log_path = host.dir / "console.log"
        for stale in ("supervisor.pid", "nspawn.pid"):
            (host.dir / stale).unlink(missing_ok=True)
        argv = [sys.executable, "-I", str(SUPERVISOR), str(host.dir), "30", "--", *self._nspawn_argv(host)]
        if host.spec.pods:
            # The view must be there before nspawn binds it; the supervisor enters the cgroups
            # listed in HOST_DIR/cgroups before it starts nspawn, so nspawn and the container
            # inherit the host's subtree (lab.pod_hosts).
            pod_hosts.mount_cgroup_view(host.dir / "cgroup", host.cgroup_dirs)
            (host.dir / "cgroups").write_text("".join(d + "\n" for d in host.cgroup_dirs.values()))
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + 10
        while _read_pid(host.dir / "supervisor.pid") != proc.pid:
            if proc.poll() is not None:
                raise LabError(f"host {host.name}: supervisor exited ({proc.returncode}); see {log_path}")
            if time.monotonic() > deadline:
                raise LabError(f"host {host.name}: supervisor did not start; see {log_path}")
            time.sleep(0.02)
        # Reap the supervisor in the background when it ends while we live (it is our child).
        threading.Thread(target=proc.wait, daemon=True).start()

    def wait_ssh_ready(self, hosts: Iterable[Host] | None = None, timeout: float = 120) -> dict[str, float]:
        """Wait, in parallel, until each host answers a command over real SSH.  Returns seconds waited per host."""
        targets = list(hosts) if hosts is not None else list(self.hosts.values())
        if not targets:
            return {}
        started = time.monotonic()

        def wait_one(host: Host) -> float:
            deadline = started + timeout
            last = ""
            while time.monotonic() < deadline:
                if not host.is_running:
                    raise HostNotRunningError(
                        f"host {host.name} is not running; console log: {self.console_tail(host)}"
                    )
                proc = _run(host.ssh_argv("true", connect_timeout=2), check=False, timeout=15)
                if proc.returncode == 0:
                    return time.monotonic() - started
                last = proc.stderr.strip()
                time.sleep(0.2)
            raise LabError(
                f"host {host.name}: no SSH within {timeout}s (last error: {last}); console: {self.console_tail(host)}"
            )

        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            results = list(pool.map(wait_one, targets))
        return {host.name: seconds for host, seconds in zip(targets, results, strict=False)}

    def console_tail(self, host: Host, lines: int = 20) -> str:
        try:
            text = (host.dir / "console.log").read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])

    # ---- state

    def _save_state(self) -> None:
        state = {
            "lab_id": self.lab_id,
            "run_dir": str(self.run_dir),
            "cache_dir": str(self.cache_dir),
            "mirror": self.mirror,
            "plan": self.plan.to_json() if self.plan else None,
            "created_by_cli": self.created_by_cli,
            "owner_pid": self.owner_pid,
            "hosts": [host.to_json() for host in self.hosts.values()],
        }
        tmp = self.run_dir / ".state.json.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.write_text(json.dumps(state, indent=2))
            os.replace(tmp, self.run_dir / "state.json")

    @classmethod
    def attach(cls, run_dir: Path) -> Lab:
        """The lab recorded in ``run_dir`` (e.g. one made by ``python -m lab.hosts up``)."""
        state = json.loads((Path(run_dir) / "state.json").read_text())
        lab = cls(Path(state["cache_dir"]), Path(state["run_dir"]), lab_id=state["lab_id"], mirror=state["mirror"])
        lab.created_by_cli = bool(state.get("created_by_cli"))
        lab.owner_pid = int(state.get("owner_pid") or lab.owner_pid)
        if state.get("plan"):
            lab.plan = AddressPlan.from_json(state["plan"])
        for data in state.get("hosts", []):
            spec = _spec_from_json(data["spec"])
            host = Host(
                spec=spec,
                index=data["index"],
                netns=data["netns"],
                public_ip=data["public_ip"],
                private_ip=data["private_ip"],
                egress_ip=data["egress_ip"],
                ssh_ip=data["ssh_ip"],
                ssh_private_key_path=Path(data["ssh_private_key_path"]),
                known_hosts_path=Path(data["known_hosts_path"]),
                dir=Path(data["dir"]),
                ssh_host_key_fingerprint=data["ssh_host_key_fingerprint"],
                ssh_host_public_key=data["ssh_host_public_key"],
                machine_id=data["machine_id"],
                router_netns=data["router_netns"],
                nat_inner_ip=data["nat_inner_ip"],
                private_network=data["private_network"],
                private_gateway=data["private_gateway"],
                cgroup_dirs=dict(data.get("cgroup_dirs") or {}),
                lab=lab,
            )
            lab.hosts[spec.name] = host
        if lab.plan is not None:
            lab._gateway_networks = [lab.plan.private_net] + [
                IPv4Network(h.private_network) for h in lab.hosts.values() if h.private_network
            ]
        lab._save_state()
        return lab

    # ---- teardown

    def _lab_processes(self) -> list[int]:
        """Supervisors, nspawn and delay daemons of this lab (found by their command lines)."""
        run_dir = os.fspath(self.run_dir)
        tag = f"{self.lab_id}/"
        found = []
        me = os.getpid()
        for pid in _all_pids():
            if pid == me:
                continue
            argv = _cmdline(pid)
            if not argv:
                continue
            joined = "\0".join(argv)
            if (
                (run_dir + "/") in joined
                or any(a == run_dir for a in argv)
                or (NETDELAY.name in joined and any(a.startswith(tag) for a in argv))
                or any(a.startswith(f"--network-namespace-path=/run/netns/{self.lab_id}-") for a in argv)
            ):
                found.append(pid)
        return found

    def leftovers(self) -> Leftovers:
        """Everything of this lab still on the machine (listed from the system, not from memory)."""
        prefix = self.lab_id + "-"
        netns = [n for n in _run(["ip", "netns", "list"], check=False).stdout.split() if n.startswith(prefix)]
        links = [
            str(link["ifname"]) for link in _ip_json("link", "show") if str(link.get("ifname", "")).startswith(prefix)
        ]
        mounts = [str(m) for m in _mounts_under(self.run_dir)]
        mounts += [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if line.split()[4].startswith(f"/run/netns/{prefix}")
        ]
        processes = [f"{pid} {' '.join(_cmdline(pid))}" for pid in self._lab_processes()]
        tables = [
            line.strip()
            for line in _run(["nft", "list", "tables"], check=False).stdout.splitlines()
            if self.nft_table in line.split()
        ]
        cgroups = [d for host in self.hosts.values() for d in host.cgroup_dirs.values() if Path(d).exists()]
        return Leftovers(netns, links, sorted(set(mounts)), processes, tables, cgroups)

    def teardown(self) -> None:
        """Remove every namespace, bridge, veth, container process, mount and nft table of this lab, and its run_dir."""
        with self._lock:
            self._torn_down = True
            errors: list[str] = []
            # 1. Containers: hard stop through the supervisors, then anything left.
            for host in list(self.hosts.values()):
                pid = _read_pid(host.dir / "supervisor.pid")
                if pid is not None and _pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
            for host_dir in (self.run_dir / "hosts").glob("*"):
                pid = _read_pid(host_dir / "supervisor.pid")
                if pid is not None and _pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
            deadline = time.monotonic() + 15
            while self._lab_processes() and time.monotonic() < deadline:
                for pid in self._lab_processes():
                    argv = _cmdline(pid)
                    if argv and argv[0].endswith("systemd-nspawn"):
                        leader = _container_leader(pid)
                        if leader is not None:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(leader, signal.SIGKILL)
                    if NETDELAY.name in " ".join(argv) or (argv and Path(argv[0]).name == slow_disk.BINARY_NAME):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            for pid in self._lab_processes():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while any(_pid_alive(p) for p in self._lab_processes()) and time.monotonic() < deadline:
                time.sleep(0.05)
            # 2. Mounts (overlays, pod-capable hosts' cgroup views), then those hosts' cgroups.
            try:
                _umount_all(self.run_dir)
            except LabError as err:
                errors.append(str(err))
            for host in list(self.hosts.values()):
                left_cgroups = pod_hosts.remove_cgroups(host.cgroup_dirs)
                if left_cgroups:
                    errors.append(f"host {host.name}: cgroups still in use: {', '.join(left_cgroups)}")
            # 3. Namespaces, then links left in the root namespace.
            prefix = self.lab_id + "-"
            for ns in _run(["ip", "netns", "list"], check=False).stdout.split():
                if ns.startswith(prefix):
                    result = _ip("netns", "del", ns, check=False)
                    if result.returncode != 0:
                        errors.append(result.stderr.strip())
            for _ in range(20):
                links = [
                    str(link["ifname"])
                    for link in _ip_json("link", "show")
                    if str(link.get("ifname", "")).startswith(prefix)
                ]
                if not links:
                    break
                for link in links:
                    _ip("link", "del", link, check=False)
                time.sleep(0.05)
            # 4. nft table in the root namespace.
            if self.nft_table in _run(["nft", "list", "tables"], check=False).stdout.split():
                result = _run(["nft", "delete", "table", "ip", self.nft_table], check=False)
                if result.returncode != 0:
                    errors.append(result.stderr.strip())
            # 5. State and disks.
            try:
                _safe_rmtree(self.run_dir)
            except (OSError, LabError) as err:
                errors.append(f"removing {self.run_dir}: {err}")
            left = self.leftovers()
            if not left.empty():
                errors.append(f"left behind: {left}")
            if errors:
                raise LabError(f"teardown of lab {self.lab_id} incomplete: " + "; ".join(errors))
            log.info("lab %s torn down", self.lab_id)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def describe(self) -> str:
        """A table of the hosts, their addresses and the command that reaches each."""
        plan = self._require_plan()
        lines = [
            f"lab {self.lab_id}: public {plan.public_net} (gateway {plan.public_gateway}), "
            f"private {plan.private_net} (gateway {plan.private_gateway}), behind-NAT LANs in {plan.nat_net}",
            f"run dir {self.run_dir}",
        ]
        for host in self.hosts.values():
            where = (
                f"public {host.public_ip}"
                if host.public_ip
                else f"behind NAT as {host.egress_ip} (LAN {host.nat_inner_ip})"
            )
            private = f"private {host.private_ip} ({host.private_network})" if host.private_ip else "no private NIC"
            default = "default via private" if host.spec.private_default_route else "default via public"
            state = "running" if host.is_running else "off"
            lines.append(f"  {host.name:<12} {where}; {private}; {default}; {state}")
            lines.append(f"    {shlex.join(host.ssh_argv())}")
        return "\n".join(lines)


def missing_prerequisites() -> list[str]:
    """Why a lab cannot run on this machine (empty when it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("not root")
    for tool, package in (
        ("systemd-nspawn", "systemd-container"),
        ("debootstrap", "debootstrap"),
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
        ("nsenter", "util-linux"),
        ("sysctl", "procps"),
    ):
        if shutil.which(tool) is None:
            missing.append(f"no {tool} (apt-get install {package})")
    if not Path("/proc/filesystems").exists() or "overlay" not in Path("/proc/filesystems").read_text():
        missing.append("no overlayfs in the kernel")
    return missing


def all_lab_dirs(run_root: Path = DEFAULT_RUN_ROOT) -> list[Path]:
    if not run_root.exists():
        return []
    return sorted(p for p in run_root.iterdir() if _LAB_ID_RE.match(p.name) and (p / "state.json").exists())


def reap_stale_labs(run_root: Path = DEFAULT_RUN_ROOT) -> list[str]:
    """Tear down labs whose owner process is gone (a killed test run), leaving
    labs made by ``python -m lab.hosts up`` alone.  Returns their ids."""
    reaped: list[str] = []
    for directory in all_lab_dirs(run_root):
        try:
            state = json.loads((directory / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if state.get("created_by_cli"):
            continue
        owner = state.get("owner_pid")
        if isinstance(owner, int) and _pid_alive(owner):
            continue
        try:
            Lab.attach(directory).teardown()
            reaped.append(directory.name)
        except (LabError, OSError, KeyError, ValueError) as err:
            log.warning("could not tear down stale lab %s: %s", directory.name, err)
    return reaped


# --------------------------------------------------------------------------- CLI


def _cli_up(args: argparse.Namespace) -> int:
    lab = Lab(cache_dir=args.cache_dir)
    lab.created_by_cli = True
    try:
        lab.ensure_base()
        hosts = []
        for i in range(args.hosts):
            name = f"{args.name_prefix}{i + 1}"
            if i == 0:
                spec = HostSpec(name=name)
            elif args.variety and i == 1:
                spec = HostSpec(name=name, private_default_route=True)
            elif args.variety and i == 2:
                spec = HostSpec(name=name, private_nic=False)
            elif args.variety and i == 3:
                spec = HostSpec(name=name, behind_nat=True)
            else:
                spec = HostSpec(name=name)
            hosts.append(lab.add_host(spec))
        times = lab.wait_ssh_ready(hosts, timeout=args.timeout)
    except BaseException:
        lab.teardown()
        raise
    print(lab.describe())
    print("SSH-ready after: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in times.items()))
    print(f"tear down with: {shlex.join([sys.executable, '-m', 'lab.hosts', 'down', '--lab', lab.lab_id])}")
    return 0


def _cli_down(args: argparse.Namespace) -> int:
    dirs = all_lab_dirs(args.run_root)
    chosen: list[Path] = []
    for directory in dirs:
        state = json.loads((directory / "state.json").read_text())
        if args.lab:
            if directory.name in args.lab:
                chosen.append(directory)
        elif args.all or state.get("created_by_cli"):
            chosen.append(directory)
    if args.lab:
        for lab_id in args.lab:
            if lab_id not in {d.name for d in chosen}:
                # No state: tear down by name alone.
                chosen.append(args.run_root / lab_id)
    if not chosen:
        print("no lab to tear down (labs made by tests need --lab ID or --all)")
        return 0
    status = 0
    for directory in chosen:
        try:
            if (directory / "state.json").exists():
                lab = Lab.attach(directory)
            else:
                lab = Lab(args.cache_dir, directory, lab_id=directory.name)
            lab.teardown()
            print(f"lab {directory.name} torn down")
        except LabError as err:
            print(f"lab {directory.name}: {err}", file=sys.stderr)
            status = 1
    return status


def _cli_list(args: argparse.Namespace) -> int:
    for directory in all_lab_dirs(args.run_root):
        lab = Lab.attach(directory)
        print(lab.describe())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.hosts", description="Boot real Debian hosts for the lab.")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--run-root", type=Path, default=DEFAULT_RUN_ROOT)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot hosts and print how to reach them")
    up.add_argument("--hosts", type=int, default=3)
    up.add_argument("--name-prefix", default="node")
    up.add_argument(
        "--variety", action="store_true", help="host 2 routes via private, 3 has no private NIC, 4 is behind NAT"
    )
    up.add_argument("--timeout", type=float, default=180)
    down = sub.add_parser("down", help="tear down labs made by 'up' (or --lab ID, or --all)")
    down.add_argument("--lab", action="append", default=[])
    down.add_argument("--all", action="store_true")
    sub.add_parser("list", help="show the labs on this machine")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    missing = missing_prerequisites()
    if missing:
        print("cannot run the lab here: " + "; ".join(missing), file=sys.stderr)
        return 2
    if args.command == "up":
        return _cli_up(args)
    if args.command == "down":
        return _cli_down(args)
    return _cli_list(args)


if __name__ == "__main__":
    sys.exit(main())
