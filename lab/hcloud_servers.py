"""Servers created through the Hetzner API stand-in (lab/hcloud_standin.py) as lab hosts. LAB ONLY.

`LabServers(lab)` is the stand-in's `boot`: each server created through the API boots a lab host
(lab.hosts) of the image's OS, and real cloud-init (Debian's `cloud-init` package, in the base
tree) runs on the user data the caller gave, as on a Hetzner server:

- The image: the lab boots Debian 12 (bookworm) only; another image's create action ends in
  `error` naming it.
- Addresses: the host's public address on the lab's public bridge is the server's
  `public_net.ipv4`; its private NIC (`enp7s0`, MTU 1450 like Hetzner's) has no address until
  the server is attached to a network, then the address the stand-in assigned from the subnet
  (with the network's prefix: the servers of one network reach each other on the lab's private
  bridge), and none again once detached.
- cloud-init, NoCloud datasource (cloud-init's docs, "NoCloud": a seed directory
  /var/lib/cloud/seed/nocloud/ with `meta-data` and `user-data`): meta-data holds the
  `instance-id` (the server id, as Hetzner's metadata service gives it), `local-hostname` (the
  server name) and `public-keys` (the server's `ssh_keys`), user-data the server's user_data as
  given. The base tree's /etc/cloud/cloud-init.disabled is removed in the host's own layer, and
  a drop-in sets what a Hetzner image's cloud-init configuration does: root logs in with the
  project's keys (`disable_root: false`), no default user, the network is left alone (the
  lab wires it from outside; Hetzner's images configure it from their datasource), and the
  locale is C.UTF-8 (the base tree generates no other; cloud-init's default en_US.UTF-8 would
  fail its `locale` module there, where a Hetzner image has it). So the SSH
  host keys a `#cloud-config` `ssh_keys` names are the ones the host serves, written by
  cloud-init before sshd starts (cloud-init.service runs before ssh.service), the keys the lab
  made for the host deleted (`ssh_deletekeys`).
- Power: off stops the host (the container's init killed), on boots it again; cloud-init then
  sees the same instance-id and does not run its per-instance modules again, as on Hetzner.
- Delete: the host is removed (Lab.remove_host): no process, mount, namespace or disk is left.

The lab itself logs in with its own key too (it is added to root's authorized_keys before the
boot; cloud-init appends the server's keys): the lab's tests observe the host that way. Once
cloud-init is done the lab's known_hosts holds the keys cloud-init wrote (`wait_cloud_init`).
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.hcloud_standin import ServerRequest
from lab.hosts import Host, HostSpec, Lab, LabError
from lab.hosts.host import _key_fingerprint

SEED_DIR = "var/lib/cloud/seed/nocloud"
DISABLED = "etc/cloud/cloud-init.disabled"
# What a Hetzner image's cloud-init configuration sets, for the lab (see the module's docstring).
HETZNER_IMAGE_CONFIG = """\
# Written by the lab's Hetzner stand-in (lab/hcloud_servers.py).
datasource_list: [NoCloud, None]
disable_root: false
users: []
locale: C.UTF-8
network:
  config: disabled
"""
BOOTABLE = {("debian", "12")}


@dataclass
class LabServer:
    """A created server's lab host: what the stand-in powers, attaches and removes."""

    lab: Lab
    host: Host
    private_ips: dict[str, str] = field(default_factory=dict)  # ip -> network range
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def is_running(self) -> bool:
        return self.host.lab is not None and self.host.is_running

    @property
    def public_ip(self) -> str | None:
        return self.host.public_ip

    def power_off(self) -> None:
        self.host.power_off()

    def power_on(self) -> None:
        self.host.power_on()

    def remove(self) -> None:
        self.lab.remove_host(self.host)

    def attach_network(self, ip: str, ip_range: str) -> None:
        prefix = ipaddress.IPv4Network(ip_range).prefixlen
        with self._lock:
            self.host.netns_run(["ip", "addr", "add", f"{ip}/{prefix}", "dev", "enp7s0"])
            self.private_ips[ip] = ip_range

    def detach_network(self, ip: str) -> None:
        with self._lock:
            ip_range = self.private_ips.pop(ip, None)
            if ip_range is not None:
                prefix = ipaddress.IPv4Network(ip_range).prefixlen
                self.host.netns_run(["ip", "addr", "del", f"{ip}/{prefix}", "dev", "enp7s0"], check=False)

    def wait_cloud_init(self, timeout: float = 180) -> str:
        """Wait until cloud-init has finished on the host (`cloud-init status --wait`); the lab's
        known_hosts then holds the host keys it wrote. Returns cloud-init's status line."""
        result = self.host.run(["cloud-init", "status", "--wait"], check=False, timeout=timeout)
        keys = sorted((self.host.root / "etc/ssh").glob("ssh_host_*_key.pub"))
        if keys:
            ed25519 = self.host.root / "etc/ssh/ssh_host_ed25519_key.pub"
            line = (ed25519 if ed25519.exists() else keys[0]).read_text().strip()
            self.host.ssh_host_public_key = line
            self.host.ssh_host_key_fingerprint = _key_fingerprint(line)
            with self.lab._lock:
                self.lab._write_known_hosts()
                self.lab._save_state()
        return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()


class LabServers:
    """The stand-in's `boot`: a lab host per created server (see the module's docstring).

    `extra_binds` and `extra_packages` are the booted hosts' (HostSpec's fields: the lab's k3s
    stand-in needs its control-plane binaries bound in, as `stack_harness.server_spec` gives
    them); `host_name(request)` names a server's lab host (default `hz-<id>`; the lab's Longhorn
    manager stand-in finds a node's disk by the lab host of the Kubernetes node's name);
    `on_boot(request, server)` is called once a server's host runs (a test starts the lab's
    stand-ins of what a cluster on that server would run)."""

    def __init__(
        self,
        lab: Lab,
        *,
        extra_binds: Sequence[tuple[Path, str]] = (),
        extra_packages: Sequence[str] = (),
        host_name: Callable[[ServerRequest], str] = lambda request: f"hz-{request.id}",
        on_boot: Callable[[ServerRequest, LabServer], None] | None = None,
    ) -> None:
        self.lab = lab
        self.booted: dict[int, LabServer] = {}
        self.extra_binds = tuple(extra_binds)
        self.extra_packages = tuple(extra_packages)
        self.host_name = host_name
        self.on_boot = on_boot

    def __call__(self, request: ServerRequest) -> LabServer:
        image = request.image
        if (image["os_flavor"], image["os_version"]) not in BOOTABLE:
            raise LabError(f"the lab boots Debian 12 hosts only, not image {image['name']}")
        if not request.ipv4:
            raise LabError(f"server {request.name}: the lab boots hosts with a public IPv4 address only")
        spec = HostSpec(
            self.host_name(request),
            private_nic=True,
            extra_binds=self.extra_binds,
            extra_packages=self.extra_packages,
        )
        host = self.lab.add_host(spec, start=False)
        root = host.root
        # Not attached to a network yet: the private NIC has no address until the API attaches it.
        host.netns_run(["ip", "addr", "flush", "dev", "enp7s0"])
        seed = root / SEED_DIR
        seed.mkdir(parents=True, exist_ok=True)
        meta = {
            "instance-id": str(request.id),
            "local-hostname": request.name,
            "public-keys": list(request.public_keys),
        }
        # meta-data is YAML; JSON is YAML.
        (seed / "meta-data").write_text(json.dumps(meta) + "\n")
        (seed / "user-data").write_text(request.user_data or "")
        (seed / "user-data").chmod(0o600)
        (root / DISABLED).unlink(missing_ok=True)
        (root / "etc/cloud/cloud.cfg.d/90-hk3s-lab-hetzner.cfg").write_text(HETZNER_IMAGE_CONFIG)
        self.lab._start_container(host)
        server = LabServer(self.lab, host)
        self.booted[request.id] = server
        if self.on_boot is not None:
            self.on_boot(request, server)
        return server


def seed_of(host: Host) -> Path:
    return host.root / SEED_DIR
