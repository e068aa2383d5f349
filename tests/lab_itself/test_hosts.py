"""The lab's hosts are real: booted Debian systems reached by real SSH.

Boots hosts of each kind (default route via the private NIC, no private NIC,
a normal one, one behind NAT) and checks them from the outside, with the
``ssh`` client (StrictHostKeyChecking against the recorded host keys),
``ip`` and ``ping``.  Needs root, systemd-nspawn and debootstrap: the
``lab`` fixture skips otherwise.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.hosts import Host, HostNotRunningError, HostSpec, Lab, reserved_networks

pytestmark = pytest.mark.lab

REGISTRY = "deb.debian.org"


@dataclass
class Hosts:
    normal: Host
    privroute: Host
    nopriv: Host
    natted: Host
    podnet: Host

    def all(self) -> list[Host]:
        return [self.normal, self.privroute, self.nopriv, self.natted, self.podnet]


@pytest.fixture(scope="module")
def hosts(lab: Lab) -> Iterator[Hosts]:
    made = Hosts(
        normal=lab.add_host(HostSpec("hs-normal")),
        privroute=lab.add_host(HostSpec("hs-privroute", private_default_route=True)),
        nopriv=lab.add_host(HostSpec("hs-nopriv", private_nic=False)),
        natted=lab.add_host(HostSpec("hs-natted", behind_nat=True, private_nic=False)),
        # A private network of its own choosing: k3s's default pod network.
        podnet=lab.add_host(HostSpec("hs-podnet", private_cidr="10.42.0.0/16", private_default_route=True)),
    )
    lab.wait_ssh_ready(made.all(), timeout=180)
    yield made


# --------------------------------------------------------------------------- helpers


def ping_rtt_ms(src: Host, dst: str, count: int = 5) -> float | None:
    """Average RTT from ``src`` to ``dst``, or None when nothing came back."""
    proc = src.run(["ping", "-n", "-q", "-c", str(count), "-i", "0.2", "-W", "1", dst], check=False, timeout=30)
    match = re.search(r"= [\d.]+/([\d.]+)/", proc.stdout)
    return float(match.group(1)) if match else None


def ssh_ok(host: Host, timeout: int = 3) -> bool:
    return host.ssh("true", check=False, connect_timeout=timeout, timeout=30).returncode == 0


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def ssh_with_known_hosts(host: Host, known_hosts: Path) -> subprocess.CompletedProcess[str]:
    argv = host.ssh_argv("true", connect_timeout=3)
    argv = [f"UserKnownHostsFile={known_hosts}" if a.startswith("UserKnownHostsFile=") else a for a in argv]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)


def routes_inside(host: Host) -> list[dict[str, Any]]:
    """The host's routing table as the host itself reports it (over SSH)."""
    return list(json.loads(host.ssh("ip -j -4 route show").stdout))


def defaults(routes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(str(r.get("gateway")), str(r.get("dev"))) for r in routes if r.get("dst") == "default"]


def connected(routes: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(str(r["dst"]), str(r["dev"])) for r in routes if r.get("dst") != "default" and "gateway" not in r}


def tcp_open(src: Host, ip: str, port: int = 22) -> bool:
    return src.run(["nc", "-z", "-w", "3", ip, str(port)], check=False, timeout=30).returncode == 0


def list_system(lab_id: str, run_dir: Path) -> dict[str, list[str]]:
    """What the system (not the lab object) shows of a lab."""
    netns = [
        n
        for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout.split()
        if n.startswith(lab_id)
    ]
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        if line.split(":")[1].strip().startswith(lab_id)
    ]
    bridges = [
        line.split(":")[1].strip()
        for line in subprocess.run(
            ["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        if lab_id in line
    ]
    veths = [
        line.split(":")[1].strip()
        for line in subprocess.run(
            ["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        if lab_id in line
    ]
    mounts = [
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(run_dir) in line or f"/run/netns/{lab_id}" in line
    ]
    processes = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if lab_id in cmdline or str(run_dir) in cmdline:
            processes.append(f"{entry}: {cmdline}")
    tables = [
        line
        for line in subprocess.run(
            ["nft", "list", "tables"], capture_output=True, text=True, check=False
        ).stdout.splitlines()
        if lab_id in line
    ]
    return {
        "netns": netns,
        "links": links,
        "bridges": bridges,
        "veths": veths,
        "mounts": mounts,
        "processes": processes,
        "nft_tables": tables,
    }


# --------------------------------------------------------------------------- tests


def test_ssh_into_each_host_checks_the_recorded_host_key(hosts: Hosts, tmp_path: Path) -> None:
    for host in hosts.all():
        out = host.ssh("hostname; cat /etc/machine-id; systemctl is-system-running --wait", timeout=90).stdout.split()
        assert out == [host.name, host.machine_id, "running"], host.name
        fingerprint = host.ssh("ssh-keygen -E sha256 -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout
        assert host.ssh_host_key_fingerprint in fingerprint, host.name

        # StrictHostKeyChecking is real: an unknown or a wrong key refuses the connection.
        empty = tmp_path / f"{host.name}.empty"
        empty.write_text("")
        refused = ssh_with_known_hosts(host, empty)
        assert refused.returncode == 255 and "verification failed" in refused.stderr, refused.stderr
        other_key = tmp_path / f"{host.name}.other"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
        wrong = tmp_path / f"{host.name}.wrong"
        wrong.write_text(f"{host.ssh_ip} {' '.join(Path(f'{other_key}.pub').read_text().split()[:2])}\n")
        refused = ssh_with_known_hosts(host, wrong)
        assert refused.returncode == 255 and "IDENTIFICATION HAS CHANGED" in refused.stderr, refused.stderr

    machine_ids = {h.machine_id for h in hosts.all()}
    assert len(machine_ids) == len(hosts.all())


def test_addresses_follow_the_spec_and_avoid_the_machines_networks(lab: Lab, hosts: Hosts) -> None:
    plan = lab.plan
    assert plan is not None
    for host in (hosts.normal, hosts.privroute, hosts.nopriv):
        assert host.public_ip == str(plan.public_net.network_address + 10 + host.index)
    assert hosts.normal.private_ip == str(plan.private_net.network_address + 1 + hosts.normal.index)
    assert hosts.nopriv.private_ip is None
    assert hosts.natted.public_ip is None
    assert ipaddress.ip_address(hosts.natted.egress_ip) in plan.public_net
    for reserved in reserved_networks():
        if lab.lab_id in reserved.reason:  # the lab's own bridge
            continue
        assert not plan.public_net.overlaps(reserved.network), reserved
        assert not plan.private_net.overlaps(reserved.network), reserved
        assert not plan.nat_net.overlaps(reserved.network), reserved


def test_routing_tables_match_the_specs(lab: Lab, hosts: Hosts) -> None:
    public_net = lab.public_net
    private_net = lab.private_net

    normal = routes_inside(hosts.normal)
    assert defaults(normal) == [(lab.public_gateway, "eth0")]
    assert {(public_net, "eth0"), (private_net, "enp7s0")} <= connected(normal)

    privroute = routes_inside(hosts.privroute)
    assert defaults(privroute) == [(lab.private_gateway, "enp7s0")]
    assert {(public_net, "eth0"), (private_net, "enp7s0")} <= connected(privroute)

    nopriv = routes_inside(hosts.nopriv)
    assert defaults(nopriv) == [(lab.public_gateway, "eth0")]
    assert connected(nopriv) == {(public_net, "eth0")}
    assert hosts.nopriv.ssh("ip link show enp7s0", check=False).returncode != 0

    natted = routes_inside(hosts.natted)
    assert hosts.natted.nat_inner_ip is not None
    lan_gateway = hosts.natted.nat_inner_ip.rsplit(".", 1)[0] + ".1"
    assert defaults(natted) == [(lan_gateway, "eth0")]
    assert all(dst != public_net for dst, _dev in connected(natted))

    podnet = routes_inside(hosts.podnet)
    assert defaults(podnet) == [("10.42.0.1", "enp7s0")]
    assert ("10.42.0.0/16", "enp7s0") in connected(podnet)
    assert hosts.podnet.private_ip == str(ipaddress.ip_address("10.42.0.1") + hosts.podnet.index)

    addresses = json.loads(hosts.normal.ssh("ip -j -4 addr show").stdout)
    by_dev = {a["ifname"]: {i["local"] for i in a["addr_info"]} for a in addresses}
    assert by_dev["eth0"] == {hosts.normal.public_ip}
    assert by_dev["enp7s0"] == {hosts.normal.private_ip}


def test_every_kind_of_host_reaches_the_package_mirror(hosts: Hosts) -> None:
    url = f"http://{REGISTRY}/debian/dists/bookworm/Release"
    for host in hosts.all():
        code = host.ssh(f"curl -sS -m 30 -o /dev/null -w '%{{http_code}}' {url}", check=False, timeout=60)
        assert code.stdout == "200", (host.name, code.stdout, code.stderr)
    # The host without a default route on its public NIC goes out through the private network.
    registry_ip = socket.gethostbyname(REGISTRY)
    assert "dev enp7s0" in hosts.privroute.ssh(f"ip route get {registry_ip}").stdout


def test_link_down_cuts_the_path_and_link_up_restores_it(hosts: Hosts) -> None:
    target, peer = hosts.normal, hosts.privroute
    assert target.public_ip and target.private_ip
    assert ssh_ok(target)
    try:
        target.link_down("public")
        assert not target.link_is_up("public")
        assert not ssh_ok(target, timeout=2)
        assert ping_rtt_ms(hosts.nopriv, target.public_ip) is None
        assert ping_rtt_ms(peer, target.private_ip) is not None  # the other link still works
        target.link_up("public")
        wait_until(lambda: ssh_ok(target), 20, "SSH after link up")

        target.link_down("private")
        assert ping_rtt_ms(peer, target.private_ip) is None
        assert ssh_ok(target)
        target.link_up("private")
        wait_until(lambda: ping_rtt_ms(peer, target.private_ip, count=1) is not None, 20, "private path after link up")
    finally:
        target.link_up("public")
        target.link_up("private")


def test_netem_delay_shows_in_ping_rtt(hosts: Hosts) -> None:
    target, source = hosts.normal, hosts.nopriv
    assert target.public_ip
    baseline = ping_rtt_ms(source, target.public_ip)
    assert baseline is not None and baseline < 10
    try:
        target.netem(delay_ms=50)
        delayed = ping_rtt_ms(source, target.public_ip)
        assert delayed is not None and 45 <= delayed < 150, delayed
        assert ssh_ok(target)
        # Bulk transfers still flow through the emulated link.
        started = time.monotonic()
        size = len(target.ssh("head -c 5000000 /dev/zero | base64 -w0", timeout=60).stdout)
        assert size > 6_000_000 and time.monotonic() - started < 30
        target.netem(loss_pct=100)
        assert ping_rtt_ms(source, target.public_ip) is None
    finally:
        target.clear_netem()
    after = ping_rtt_ms(source, target.public_ip)
    assert after is not None and after < 10


def test_power_off_and_on_keeps_the_disk(hosts: Hosts) -> None:
    host = hosts.nopriv
    token = secrets.token_hex(8)
    host.ssh(f"echo {token} > /root/lab-token && sync")
    boots = host.boots
    host.power_off()
    assert not host.is_running and host.leader_pid is None
    assert not ssh_ok(host, timeout=2)
    with pytest.raises(HostNotRunningError):
        host.run("true")
    host.power_on(wait=True)
    assert host.boots == boots + 1
    assert host.ssh("cat /root/lab-token").stdout.strip() == token
    assert host.ssh("cat /etc/machine-id").stdout.strip() == host.machine_id


def test_reboot_comes_back(hosts: Hosts) -> None:
    host = hosts.privroute
    host.ssh("touch /run/lab-before-reboot /root/lab-disk-marker")
    leader = host.leader_pid
    host.reboot()
    assert host.leader_pid != leader
    # /run is a fresh tmpfs after a real boot; the disk is kept.
    assert host.ssh("test -e /run/lab-before-reboot", check=False).returncode == 1
    assert host.ssh("test -e /root/lab-disk-marker", check=False).returncode == 0
    assert host.ssh("systemctl is-system-running --wait", timeout=90).stdout.strip() == "running"


def test_regenerated_host_key_differs(hosts: Hosts, tmp_path: Path) -> None:
    host = hosts.normal
    old_known_hosts = tmp_path / "known_hosts.old"
    old_known_hosts.write_text(host.known_hosts_path.read_text())
    old = host.ssh_host_key_fingerprint
    new = host.regenerate_host_key()
    assert new != old and new == host.ssh_host_key_fingerprint
    assert new in host.ssh("ssh-keygen -E sha256 -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout
    refused = ssh_with_known_hosts(host, old_known_hosts)
    assert refused.returncode == 255 and "IDENTIFICATION HAS CHANGED" in refused.stderr, refused.stderr


def test_host_behind_nat_connects_out_but_nothing_connects_in(hosts: Hosts) -> None:
    natted, normal = hosts.natted, hosts.normal
    assert normal.public_ip and natted.nat_inner_ip
    # sshd is up on it (over its LAN), so what fails below is reachability.
    assert ssh_ok(natted)
    assert tcp_open(natted, "127.0.0.1")
    # Out: it reaches the public bridge's hosts, seen as its NAT router's address.
    assert tcp_open(natted, normal.public_ip)
    seen: list[str] = []
    listener = threading.Thread(
        target=lambda: seen.append(
            normal.run(
                [
                    "timeout",
                    "15",
                    "python3",
                    "-c",
                    "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                    "s.bind(('0.0.0.0', 9099)); s.listen(1); c, a = s.accept(); print(a[0])",
                ],
                check=False,
                timeout=30,
            ).stdout.strip()
        )
    )
    listener.start()
    wait_until(lambda: tcp_open(natted, normal.public_ip, 9099), 10, "the listener")
    listener.join(20)
    assert seen == [natted.egress_ip]
    # In: nothing on the public bridge reaches its port 22, by either address.
    for other in (hosts.normal, hosts.nopriv, hosts.privroute):
        assert not tcp_open(other, natted.egress_ip), other.name
        assert not tcp_open(other, natted.nat_inner_ip), other.name
    with pytest.raises(OSError):
        socket.create_connection((natted.egress_ip, 22), timeout=3).close()


def test_teardown_leaves_nothing_behind(lab: Lab, fresh_lab: Lab) -> None:
    # A second lab alongside the session's one: distinct names and ranges.
    assert fresh_lab.lab_id != lab.lab_id
    one = fresh_lab.add_host(HostSpec("td-one"))
    two = fresh_lab.add_host(HostSpec("td-two", behind_nat=True))
    fresh_lab.wait_ssh_ready([one, two], timeout=120)
    assert fresh_lab.public_net != lab.public_net
    one.netem(delay_ms=10)  # a delay daemon too (when the kernel lacks netem)
    run_dir = fresh_lab.run_dir

    before = list_system(fresh_lab.lab_id, run_dir)
    for kind in ("netns", "links", "bridges", "veths", "mounts", "processes", "nft_tables"):
        assert before[kind], f"expected {kind} of the lab before teardown"
    assert any("systemd-nspawn" in p for p in before["processes"])

    fresh_lab.teardown()

    after = list_system(fresh_lab.lab_id, run_dir)
    assert after == {k: [] for k in after}, after
    assert not run_dir.exists()
    assert fresh_lab.leftovers().empty()
    # The session lab is untouched.
    assert (
        lab.plan is not None
        and lab.hosts
        and all(h.is_running for h in lab.hosts.values() if h.spec.name.startswith("hs-"))
    )
