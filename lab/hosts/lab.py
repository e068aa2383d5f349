"""The lab: a set of hosts and their networks on this machine, its state on disk (so another
process can attach to it or tear it down), and its teardown."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lab import k3s_bundle, pod_hosts, slow_disk
from lab.hosts import base_tree, network
from lab.hosts.addressing import (
    REGISTRY_HOSTS,
    AddressPlan,
    IPv4Address,
    IPv4Network,
    machine_nameservers,
    plan_addresses,
)
from lab.hosts.base_tree import MIRROR
from lab.hosts.errors import HostNotRunningError, LabError
from lab.hosts.host import MAX_HOSTS, NETDELAY, Host, HostSpec, _key_fingerprint, _spec_from_json
from lab.hosts.processes import (
    _all_pids,
    _cmdline,
    _container_leader,
    _flock,
    _ip,
    _ip_json,
    _mounts_under,
    _pid_alive,
    _read_pid,
    _run,
    _safe_rmtree,
    _umount_all,
)

log = logging.getLogger("lab.hosts")

SUPERVISOR = Path(__file__).resolve().parent / "files" / "supervisor.py"
DEFAULT_CACHE_DIR = Path(os.environ.get("HK3S_LAB_CACHE", "/var/cache/hk3s-lab"))
DEFAULT_RUN_ROOT = Path(os.environ.get("HK3S_LAB_RUN", "/var/tmp/hk3s-lab"))
GLOBAL_LOCK = Path("/run/hk3s-lab.lock")
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

_LAB_ID_RE = re.compile(r"^hk[0-9a-f]{4}$")


#: The Longhorn manager stand-in (lab/longhorn_standin/manager.py) a lab stack runs beside the lab:
#: its command line names the lab's run directory, and the teardown stops it with the hosts.
LONGHORN_MANAGER_MODULE = "lab.longhorn_standin.manager"


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

    def base_path(self, extra_packages: Iterable[str] = ()) -> Path:
        return base_tree.base_path(self.cache_dir, self.mirror, extra_packages)

    def ensure_base(self, extra_packages: Iterable[str] = ()) -> Path:
        """The base tree for this package set, built by debootstrap the first time (see :mod:`lab.hosts.base_tree`)."""
        return base_tree.ensure_base(self.cache_dir, self.mirror, extra_packages)

    # ---- network

    def setup_network(self) -> AddressPlan:
        """Pick the address ranges and create the bridges, the gateway namespace and the NAT rules."""
        with self._lock:
            if self.plan is not None:
                return self.plan
            with _flock(GLOBAL_LOCK):
                self.plan = plan_addresses(self.registry_hosts, self.requested_private_cidr)
                log.info(
                    "lab %s: public %s (gateway %s), private %s (gateway %s), behind-NAT LANs in %s; avoided %s",
                    self.lab_id,
                    self.plan.public_net,
                    self.plan.public_gateway,
                    self.plan.private_net,
                    self.plan.private_gateway,
                    self.plan.nat_net,
                    ", ".join(sorted({excluded.split(" ", 1)[0] for excluded in self.plan.excluded})),
                )
                self._save_state()
                network.create_core_network(self, self.plan)
            self._save_state()
            return self.plan

    def kernel_has_netem(self) -> bool:
        """Whether ``tc qdisc ... netem`` works on this kernel (tried in the gateway namespace)."""
        if self._netem_available is None:
            self._require_plan()
            self._netem_available = network.netem_works(self.gateway_netns)
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
                network.create_host_network(self, host, plan)
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
        """An ed25519 and an ECDSA host key, as a Debian host's first boot makes them.

        Debian's first boot also makes a 3072-bit RSA key (`ssh-keygen -A`); the lab leaves it
        out. Nothing in the program reads or offers it: SSH pins an ed25519 key (remote_access.ssh),
        and the servers the program creates get cloud-init's `ssh_genkeytypes: []` with a key of
        the program's own. Making that RSA key was the costliest step of a host's creation (1.2 to
        2.5 CPU seconds of a 2-core machine, ~400 hosts in a CI run). Hosts still offer two key
        types, so a client that sees several keys still meets them."""
        ssh_dir = host.root / "etc/ssh"
        for key_type in ("ecdsa", "ed25519"):
            key = ssh_dir / f"ssh_host_{key_type}_key"
            if not key.exists():
                _run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", f"root@{host.name}", "-f", key])
        ed25519 = (ssh_dir / "ssh_host_ed25519_key.pub").read_text().strip()
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
        argv += k3s_bundle.nspawn_args(self.base_path(host.spec.extra_packages))
        for src, dst in host.spec.extra_binds:
            argv.append(f"--bind-ro={Path(src).resolve()}:{dst}")
        for src, dst in host.spec.extra_binds_rw:
            argv.append(f"--bind={Path(src).resolve()}:{dst}")
        if host.spec.pods:
            argv += pod_hosts.nspawn_args(
                host.dir, host.dir / "cgroup", self.run_dir / "pod-runtime", self.run_dir / "longhorn-csi"
            )
        if host.spec.disk_sync_delay_ms is not None:
            argv.append(slow_disk.of_host_dir(host.dir).nspawn_bind())
        argv += list(host.spec.extra_nspawn_args)
        return argv

    def _prepare_pods(self, host: Host) -> None:
        """A pod-capable host's cgroup subtree, plain directories and runtime (see :mod:`lab.pod_hosts`)."""
        pod_hosts.assemble_runtime(self.cache_dir, self.run_dir / "pod-runtime")
        pod_hosts.assemble_csi_plugin(self.cache_dir, self.run_dir / "longhorn-csi")
        for sub in ("containerd", "kubelet"):
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
        pod_hosts.install_kernel_files(host.root)
        pod_hosts.install_csi_plugin_unit(host.root)
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

    def remove_host(self, host: Host) -> None:
        """Remove one host as if it never was (a deleted cloud server): its container hard
        stopped, its mounts, cgroups, namespaces, links and disk gone, its keys out of the
        lab's known_hosts. Its index is free for the next host."""
        with self._lock:
            if self.hosts.get(host.name) is not host:
                raise LabError(f"host {host.name} is not a host of lab {self.lab_id}")
            if host.spec.disk_sync_delay_ms is not None:
                # Its FUSE daemon is the lab's to end (teardown): a slow disk's host stays to the end.
                raise LabError(f"host {host.name} has a slow disk: it goes with the lab's teardown only")
            pid = host.supervisor_pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
                deadline = time.monotonic() + 30
                while _pid_alive(pid):
                    if time.monotonic() > deadline:
                        raise LabError(f"host {host.name}: its supervisor {pid} did not end within 30s")
                    time.sleep(0.05)
            _umount_all(host.dir)
            left_cgroups = pod_hosts.remove_cgroups(host.cgroup_dirs)
            if left_cgroups:
                raise LabError(f"host {host.name}: cgroups still in use: {', '.join(left_cgroups)}")
            for ns in (host.netns, host.router_netns):
                if ns is not None:
                    _ip("netns", "del", ns, check=False)
            for kind in ("p", "r", "v"):
                veth = self._veth(host.index, kind)
                if any(link.get("ifname") == veth for link in _ip_json("link", "show")):
                    _ip("link", "del", veth, check=False)
            _safe_rmtree(host.dir)
            del self.hosts[host.name]
            host.lab = None
            self._write_known_hosts()
            self._save_state()

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
                    if (
                        NETDELAY.name in " ".join(argv)
                        or (argv and Path(argv[0]).name == slow_disk.BINARY_NAME)
                        or LONGHORN_MANAGER_MODULE in argv
                    ):
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
