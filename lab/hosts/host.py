"""A lab host: what it looks like (:class:`HostSpec`) and the booted (or powered-off) host
itself (:class:`Host`): commands on it, its links, network emulation, power and SSH host keys.
A host is made by :meth:`lab.hosts.Lab.add_host`, which owns its network and its boot."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lab.hosts.errors import HostNotRunningError, LabError
from lab.hosts.processes import _container_leader, _ip, _ip_json, _pid_alive, _read_pid, _run, _terminate

if TYPE_CHECKING:
    from lab.hosts.lab import Lab

IPv4Network = ipaddress.IPv4Network

NETDELAY = Path(__file__).resolve().parent / "files" / "netdelay.py"
PUBLIC_IFNAME = "eth0"
PRIVATE_IFNAME = "enp7s0"
PRIVATE_MTU = 1450
NETEM_QUEUES = {"public": 4101, "private": 4102}
NETEM_COMMENT = "hk3s-lab-netem"
SSH_USER = "root"
MAX_HOSTS = 80
#: The environment of a command entered with nsenter (`Host.run`, and what runs beside it such as
#: lab.node_watch): a root login's, so kubectl keeps its discovery cache under /root.
NSENTER_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")

Link = Literal["public", "private"]


def _key_fingerprint(public_key_line: str) -> str:
    blob = base64.b64decode(public_key_line.split()[1])
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


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
        return _run(self.nsenter_argv(command), check=check, timeout=timeout, env=dict(NSENTER_ENV))

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
        (``lab/hosts/files/netdelay.py``), and a ``statistic`` rule drops
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

    def _set_links(self, *, up: bool) -> None:
        """Power going off takes every NIC's carrier with it (`link_down`); power coming back
        lights them all again (a cable a test pulled before is plugged back by the power cycle)."""
        for link in ("public", "private") if self.spec.private_nic else ("public",):
            (self.link_up if up else self.link_down)(link)

    def power_off(self, *, graceful: bool = False, timeout: float = 60) -> None:
        """Stop the container.  ``graceful=False`` is a hard power off (the
        container's init is killed, like Hetzner's poweroff); ``graceful=True``
        is an orderly shutdown.  The disk (overlay upper dir) is kept.

        Its NICs go dark too (`_set_links`): the network
        namespace outlives the container, and its kernel would otherwise answer a
        connection with a TCP reset as if the machine were on. A machine that is
        off answers nothing: not ARP, not a reset, not an ICMP error."""
        pid = self.supervisor_pid
        if pid is None:
            self._set_links(up=False)
            return
        os.kill(pid, signal.SIGTERM if graceful else signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                raise LabError(f"host {self.name} did not power off within {timeout}s")
            time.sleep(0.1)
        self._set_links(up=False)

    def shutdown(self, timeout: float = 60) -> None:
        """Orderly shutdown (``systemctl poweroff`` semantics)."""
        self.power_off(graceful=True, timeout=timeout)

    def power_on(self, *, wait: bool = False, timeout: float = 120) -> None:
        """Start the container again (same disk).  ``wait=True`` waits until SSH answers."""
        if self.is_running:
            return
        self._set_links(up=True)
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
