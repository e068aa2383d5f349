"""Host firewalls on real lab hosts: UFW, firewalld and plain nftables.

A cluster of four nodes (a server with plain nftables, workers with UFW,
firewalld and plain nftables) gets its firewall plan; then real packets
decide: TCP connects and UDP datagrams (a listener inside each node records
what arrives) from a peer, from a host that is not a peer and from the
outside bridge (the root namespace). Before any firewall is applied every
listener is shown to answer, so a closed port is the firewall's doing.

firewalld needs nothing special at run time in a lab host: systemd-nspawn runs
it with `--capability=all` (lab/hosts/lab.py passes it), D-Bus is in the base, and
its nftables backend works inside the host's network namespace. Building its
base tree needs `libpam-systemd` next to it (FIREWALLD_PACKAGES).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from lab.hosts import Host, HostSpec, Lab
from node_operations.firewall_plan import PortRule, inbound_rules
from node_operations.host_firewall.apply import apply_node_firewall, read_node_firewall
from node_operations.host_firewall.fleet import NodeFirewallJob, apply_firewalls
from node_operations.host_firewall.inspection import FirewallBackend, inspect_firewall
from node_operations.host_firewall.operator_firewall import OperatorFirewallReport, evaluate_operator_firewall
from node_operations.host_firewall.plan import FirewallError, NodeFirewallPlan
from providers.host_firewall import HostFirewallProvider
from remote_access.ssh import SshTarget, open_session
from tests.vxlan_forgery import UDP_LOG, VXLAN_SEND

pytestmark = pytest.mark.lab

TCP_PORTS = (22, 6443, 8888, 9100, 10250, 30080)
UDP_PORTS = (8472, 30080, 51820)
LISTENER_LOG = "/run/hk3s-test-listener.log"
LISTENER_UNIT = "hk3s-test-listener"
PROBE_TIMEOUT = 2.0
# k3s's default pod and Service networks (hk3s:cluster.pod_cidr and service_cidr).
CLUSTER_NETWORKS = ("10.42.0.0/16", "10.43.0.0/16")
UFW_PACKAGES = ("ufw",)
# debootstrap does not resolve virtual packages: polkitd (firewalld needs it)
# wants "logind", which libpam-systemd provides.
FIREWALLD_PACKAGES = ("firewalld", "libpam-systemd")

LISTENER = """
import socket, sys, threading
tcp = [int(p) for p in sys.argv[1].split(",") if p]
udp = [int(p) for p in sys.argv[2].split(",") if p]
log = open(sys.argv[3], "a", buffering=1)
def serve_tcp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(128)
    while True:
        conn, _ = s.accept()
        conn.close()
def serve_udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        data, addr = s.recvfrom(4096)
        log.write(f"{port} {addr[0]} {data.decode(errors='replace').strip()}\\n")
threads = [threading.Thread(target=serve_tcp, args=(p,)) for p in tcp]
threads += [threading.Thread(target=serve_udp, args=(p,)) for p in udp]
for t in threads:
    t.start()
"""

UDP_SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(2):
    s.sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))
"""


# --------------------------------------------------------------------------- helpers


def start_listener(host: Host) -> None:
    """TCP listeners on every probed port but 22 (sshd has it), UDP listeners logging each datagram."""
    (host.root / "root/listener.py").write_text(LISTENER)
    # A new unit name each time: a stopped transient unit can stay loaded (its name taken) a while.
    host.run(f"systemctl stop '{LISTENER_UNIT}*' 2>/dev/null; rm -f {LISTENER_LOG}", check=False)
    tcp = ",".join(str(port) for port in TCP_PORTS if port != 22)
    udp = ",".join(str(port) for port in UDP_PORTS)
    host.run(
        [
            "systemd-run",
            f"--unit={LISTENER_UNIT}-{uuid.uuid4().hex[:8]}",
            "--collect",
            "python3",
            "/root/listener.py",
            tcp,
            udp,
            LISTENER_LOG,
        ]
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listening = host.run(["ss", "-Htln"]).stdout
        if all(f":{port} " in listening for port in TCP_PORTS):
            return
        time.sleep(0.1)
    pytest.fail(f"{host.name}: the test listener did not come up")


def tcp_open_from(source: Host | None, address: str, port: int) -> bool:
    """A TCP connect from `source` (None: the root namespace, i.e. outside the lab)."""
    if source is None:
        try:
            with socket.create_connection((address, port), timeout=PROBE_TIMEOUT):
                return True
        except OSError:
            return False
    argv = ["nc", "-z", "-w", str(int(PROBE_TIMEOUT)), address, str(port)]
    return source.run(argv, check=False, timeout=30).returncode == 0


def send_udp_from(source: Host | None, address: str, port: int, token: str) -> None:
    if source is None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(2):
                sock.sendto(token.encode(), (address, port))
        return
    source.run(["python3", "-c", UDP_SEND, address, str(port), token], timeout=30)


@dataclass(frozen=True)
class Probe:
    source_name: str
    target_name: str
    address: str
    protocol: Literal["tcp", "udp"]
    port: int
    source: Host | None = field(compare=False, hash=False)
    target: Host = field(compare=False, hash=False)


def make_probe(source: Host | None, target: Host, address: str, protocol: Literal["tcp", "udp"], port: int) -> Probe:
    name = source.name if source else "outside"
    return Probe(name, target.name, address, protocol, port, source, target)


def run_probes(probes: Sequence[Probe]) -> dict[Probe, bool]:
    """Which probes got through: TCP by connecting, UDP by the datagram showing in the target's listener log."""
    results: dict[Probe, bool] = {}
    tokens = {probe: uuid.uuid4().hex for probe in probes if probe.protocol == "udp"}
    with ThreadPoolExecutor(max_workers=32) as pool:
        tcp = [probe for probe in probes if probe.protocol == "tcp"]
        for item, is_open in zip(tcp, pool.map(lambda p: tcp_open_from(p.source, p.address, p.port), tcp), strict=True):
            results[item] = is_open
        list(
            pool.map(lambda item: send_udp_from(item[0].source, item[0].address, item[0].port, item[1]), tokens.items())
        )
    time.sleep(1.0)
    logs: dict[str, str] = {}
    for item, token in tokens.items():
        if item.target_name not in logs:
            logs[item.target_name] = item.target.run(["cat", LISTENER_LOG], check=False).stdout
        results[item] = any(
            line.split()[:1] == [str(item.port)] and token in line for line in logs[item.target_name].splitlines()
        )
    return results


def open_ports(results: dict[Probe, bool], source_name: str, target: Host, address: str) -> set[str]:
    return {
        f"{probe.port}/{probe.protocol}"
        for probe, is_open in results.items()
        if is_open
        and probe.source_name == source_name
        and probe.target_name == target.name
        and probe.address == address
    }


def probes_for(source: Host | None, target: Host, address: str) -> list[Probe]:
    return [make_probe(source, target, address, "tcp", port) for port in TCP_PORTS] + [
        make_probe(source, target, address, "udp", port) for port in UDP_PORTS
    ]


def outs(result: Any) -> dict[str, Any]:
    """A provider result's outputs (never None for these calls)."""
    assert result.outs is not None
    return dict(result.outs)


def ssh_target(lab: Lab, host: Host) -> SshTarget:
    return SshTarget(
        node=host.name,
        address=host.ssh_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=host.ssh_host_public_key,
    )


# --------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    lab: Lab
    server: Host
    ufw: Host
    firewalld: Host
    nft: Host
    outsider: Host  # on the same networks, never a peer
    newcomer: Host  # joins the cluster later, then leaves
    members: list[Host]

    backends: dict[str, FirewallBackend]

    def peers(self) -> dict[str, str]:
        return {host.name: str(host.private_ip) for host in self.members}

    def plan(self, host: Host, pod_network: Literal["wireguard", "vxlan"] = "wireguard") -> NodeFirewallPlan:
        role: Literal["server", "worker"] = "server" if host is self.server else "worker"
        rules = inbound_rules(
            role=role,
            node=host.name,
            peers=self.peers(),
            server=self.server.name,
            pod_network=pod_network,
            # The root namespace plays the operator's laptop.
            operator_access=[f"{self.lab.public_gateway}/32"],
        )
        return NodeFirewallPlan(
            host.name,
            role,
            tuple(rules),
            cluster_networks=CLUSTER_NETWORKS,
            node_addresses=tuple(sorted(self.peers().values())),
        )

    def jobs(self, pod_network: Literal["wireguard", "vxlan"] = "wireguard") -> list[NodeFirewallJob]:
        return [NodeFirewallJob(ssh_target(self.lab, host), self.plan(host, pod_network)) for host in self.members]

    def props(self, host: Host) -> dict[str, Any]:
        """A HostFirewall resource's inputs, as FirewallRules builds them."""
        plan = self.plan(host)
        return {
            "node": host.name,
            "address": host.ssh_ip,
            "ssh_port": 22,
            "ssh_user": "root",
            "private_key": self.lab.ssh_private_key_path.read_text(),
            "recorded_host_key": host.ssh_host_public_key,
            "role": plan.role,
            "rules": [
                {"port": r.port, "protocol": r.protocol, "sources": list(r.sources), "purpose": r.purpose}
                for r in plan.rules
            ],
            "nodeports_open": False,
            "cluster_networks": list(plan.cluster_networks),
            "node_addresses": list(plan.node_addresses),
        }


def apply_all(cluster: Cluster, pod_network: Literal["wireguard", "vxlan"] = "wireguard") -> dict[str, Any]:
    result = asyncio.run(apply_firewalls(cluster.jobs(pod_network)))
    assert not result.failed, result.failed
    return dict(result.applied)


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[Cluster]:
    server = lab.add_host(HostSpec("fw-srv"))
    ufw = lab.add_host(HostSpec("fw-ufw", extra_packages=UFW_PACKAGES))
    firewalld = lab.add_host(HostSpec("fw-fwd", extra_packages=FIREWALLD_PACKAGES))
    nft = lab.add_host(HostSpec("fw-nft"))
    outsider = lab.add_host(HostSpec("fw-out"))
    newcomer = lab.add_host(HostSpec("fw-new"))
    hosts = [server, ufw, firewalld, nft, outsider, newcomer]
    lab.wait_ssh_ready(hosts, timeout=180)
    # firewalld starts at boot (its package enables it); wait until it runs.
    firewalld.run("for i in $(seq 100); do firewall-cmd --state && exit 0; sleep 0.2; done; exit 1", timeout=60)
    for host in hosts:
        start_listener(host)
    made = Cluster(
        lab=lab,
        server=server,
        ufw=ufw,
        firewalld=firewalld,
        nft=nft,
        outsider=outsider,
        newcomer=newcomer,
        members=[server, ufw, firewalld, nft],
        backends={},
    )
    # Baseline: with no firewall of the program's, every listener answers from
    # outside (firewalld's stock zone already filters: its listeners answer on loopback).
    members = [server, ufw, nft]
    baseline = run_probes([probe for host in members for probe in probes_for(None, host, str(host.public_ip))])
    for host in members:
        expected = {f"{port}/tcp" for port in TCP_PORTS} | {f"{port}/udp" for port in UDP_PORTS}
        assert open_ports(baseline, "outside", host, str(host.public_ip)) == expected, host.name
    loopback = run_probes(probes_for(firewalld, firewalld, "127.0.0.1"))
    assert len(open_ports(loopback, firewalld.name, firewalld, "127.0.0.1")) == len(TCP_PORTS) + len(UDP_PORTS)

    applied = apply_all(made)
    made.backends = {name: outcome.backend for name, outcome in applied.items()}
    yield made
    power_off(hosts)


def power_off(hosts: Sequence[Host]) -> None:
    """Stop the module's hosts for the rest of the session: each booted host's
    systemd holds inotify instances, and the machine's per-user limit
    (fs.inotify.max_user_instances, 128 by default) is shared by every lab."""
    for host in hosts:
        host.power_off()


# --------------------------------------------------------------------------- tests


def test_each_node_gets_the_firewall_it_has(cluster: Cluster) -> None:
    assert cluster.backends == {
        "fw-srv": "nftables",
        "fw-ufw": "ufw",
        "fw-fwd": "firewalld",
        "fw-nft": "nftables",
    }
    assert "Status: active" in cluster.ufw.run(["ufw", "status"]).stdout
    assert cluster.firewalld.run(["firewall-cmd", "--get-default-zone"]).stdout.strip() == "hk3s"
    assert cluster.nft.run(["systemctl", "is-enabled", "hk3s-host-firewall.service"]).stdout.strip() == "enabled"


WORKER_FROM_SERVER = {"22/tcp", "9100/tcp", "10250/tcp", "51820/udp"}
WORKER_FROM_WORKER = {"22/tcp", "10250/tcp", "51820/udp"}
SERVER_FROM_WORKER = {"22/tcp", "6443/tcp", "10250/tcp", "51820/udp"}
ONLY_SSH = {"22/tcp"}
SERVER_FROM_OPERATOR = {"22/tcp", "6443/tcp"}


def test_real_probes_find_exactly_the_planned_ports_open(cluster: Cluster) -> None:
    """From a peer, a non-peer and the outside: exactly the plan's ports, to the
    plan's sources. SSH is open to all on workers; 8888, NodePorts (30080) and
    VXLAN (not this cluster's pod network) are closed to everyone."""
    workers = [cluster.ufw, cluster.firewalld, cluster.nft]
    expectations: list[tuple[Host | None, Host, str, set[str]]] = []
    for worker in workers:
        other_worker = next(w for w in workers if w is not worker)
        private, public = str(worker.private_ip), str(worker.public_ip)
        expectations += [
            (cluster.server, worker, private, WORKER_FROM_SERVER),
            (other_worker, worker, private, WORKER_FROM_WORKER),
            (cluster.outsider, worker, private, ONLY_SSH),
            (cluster.outsider, worker, public, ONLY_SSH),
            # A peer's public address is not one of the cluster's (private mode) addresses.
            (cluster.server, worker, public, ONLY_SSH),
            (None, worker, public, ONLY_SSH),
        ]
    server_private, server_public = str(cluster.server.private_ip), str(cluster.server.public_ip)
    expectations += [
        (cluster.ufw, cluster.server, server_private, SERVER_FROM_WORKER),
        (cluster.firewalld, cluster.server, server_private, SERVER_FROM_WORKER),
        (cluster.outsider, cluster.server, server_private, ONLY_SSH),
        (None, cluster.server, server_public, SERVER_FROM_OPERATOR),
    ]
    probes = [item for source, target, address, _ in expectations for item in probes_for(source, target, address)]
    results = run_probes(probes)
    wrong = []
    for source, target, address, expected in expectations:
        source_name = source.name if source else "outside"
        found = open_ports(results, source_name, target, address)
        if found != expected:
            wrong.append(f"{source_name} -> {target.name} {address}: open {sorted(found)}, expected {sorted(expected)}")
    assert not wrong, "\n".join(wrong)
    # ICMP stays open (path-MTU discovery): the outsider's ping gets answers from every node.
    for host in cluster.members:
        ping = cluster.outsider.run(["ping", "-c", "1", "-W", "2", str(host.private_ip)], check=False)
        assert ping.returncode == 0, f"{host.name} does not answer ping"


def _table_state(cluster: Cluster) -> dict[str, str]:
    return {
        "fw-srv": cluster.server.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout,
        "fw-nft": cluster.nft.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout,
        "fw-ufw": cluster.ufw.run("cat /etc/ufw/user.rules /etc/ufw/user6.rules").stdout,
        "fw-fwd": cluster.firewalld.run("firewall-cmd --list-all; firewall-cmd --info-ipset=hk3s-peers-v4-1").stdout,
    }


def test_reapplying_changes_nothing(cluster: Cluster) -> None:
    before = _table_state(cluster)
    counts_before = {
        name: asyncio.run(read_node_firewall(ssh_target(cluster.lab, host))).rule_count
        for name, host in ((h.name, h) for h in cluster.members)
    }
    applied = apply_all(cluster)
    assert {name: outcome.changed for name, outcome in applied.items()} == dict.fromkeys(counts_before, False)
    assert {name: outcome.rule_count for name, outcome in applied.items()} == counts_before
    assert _table_state(cluster) == before


def test_ufw_that_filters_no_ipv6_is_refused_naming_the_setting_and_left_as_it_was(cluster: Cluster) -> None:
    """UFW with IPV6=no loads no IPv6 rules (ufw(8), /etc/default/ufw): with IPv6 on in the
    kernel every port stays open over IPv6. The firewall step refuses such a host, changing
    nothing, and a refresh reports it as drift; with IPV6=yes back the same run passes."""
    host, default = cluster.ufw, cluster.ufw.root / "etc/default/ufw"
    assert host.run(["cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"]).stdout.strip() == "0"
    kept = default.read_text()
    before = _table_state(cluster)["fw-ufw"]
    default.write_text(re.sub(r"(?m)^IPV6=.*$", "IPV6=no", kept))
    try:
        job = [job for job in cluster.jobs() if job.target.node == host.name]
        result = asyncio.run(apply_firewalls(job))
        assert list(result.failed) == [host.name], result
        reason = result.failed[host.name]
        assert "IPV6=no in /etc/default/ufw" in reason and "set IPV6=yes there" in reason, reason
        assert _table_state(cluster)["fw-ufw"] == before
        observed = asyncio.run(read_node_firewall(ssh_target(cluster.lab, host), cluster.plan(host)))
        assert any("UFW filters no IPv6" in note for note in observed.notes), observed
    finally:
        default.write_text(kept)
    assert not asyncio.run(apply_firewalls(job)).failed


def test_ufw_rules_that_are_not_the_programs_are_named_and_kept(cluster: Cluster) -> None:
    """An allow rule someone added to a UFW the program runs (or one from before it) opens a
    port beside the plan: each apply names it, and never deletes it."""
    host = cluster.ufw
    host.run(["ufw", "allow", "proto", "tcp", "from", "any", "to", "any", "port", "8080"])
    try:
        lines: list[tuple[str, str]] = []
        job = [job for job in cluster.jobs() if job.target.node == host.name]
        result = asyncio.run(apply_firewalls(job, progress=lambda node, line: lines.append((node, line))))
        assert not result.failed, result.failed
        named = [line for node, line in lines if node == host.name and "not of the program's" in line]
        assert len(named) == 1 and "allow tcp 8080 from 0.0.0.0/0" in named[0], lines
        assert "allow tcp 8080 0.0.0.0/0 any 0.0.0.0/0 in" in host.run("cat /etc/ufw/user.rules").stdout
        others = [line for node, line in lines if node != host.name and "not of the program's" in line]
        assert others == []
    finally:
        host.run(["ufw", "delete", "allow", "proto", "tcp", "from", "any", "to", "any", "port", "8080"])


def test_an_unreachable_node_fails_alone(cluster: Cluster) -> None:
    """Every node is tried; the failure names its node and the others are applied."""
    gone = SshTarget(
        node="fw-gone",
        address=str(ipaddress.ip_network(cluster.lab.public_net)[250]),  # nothing answers there
        private_key=cluster.lab.ssh_private_key_path.read_text(),
        connect_timeout=3,
    )
    jobs = [*cluster.jobs(), NodeFirewallJob(gone, cluster.plan(cluster.nft))]
    result = asyncio.run(apply_firewalls(jobs))
    assert set(result.applied) == {host.name for host in cluster.members}
    assert list(result.failed) == ["fw-gone"] and result.failed["fw-gone"].startswith("fw-gone: ")
    with pytest.raises(FirewallError, match=r"fw-gone: .*1 host firewall"):
        result.raise_for_failures()


def _address_everywhere(cluster: Cluster, address: str) -> dict[str, bool]:
    """Whether each member's firewall (the newcomer's aside) admits `address`, read from the host."""
    alone = re.compile(rf"(?<![0-9.]){re.escape(address)}(?![0-9.])")
    found: dict[str, bool] = {}
    for host in cluster.members:
        if host is cluster.newcomer:
            continue
        if host is cluster.ufw:
            found[host.name] = f" {address} in comment=" in host.run(["cat", "/etc/ufw/user.rules"]).stdout
        elif host is cluster.firewalld:
            entries = host.run(["firewall-cmd", "--info-ipset=hk3s-peers-v4-1"]).stdout
            found[host.name] = bool(alone.search(entries))
        else:
            sets = host.run(["nft", "list", "set", "inet", "hk3s_node", "peers_v4_1"]).stdout
            found[host.name] = bool(alone.search(sets))
    return found


def test_adding_a_node_updates_every_other_and_removing_it_takes_it_away(cluster: Cluster) -> None:
    newcomer = cluster.newcomer
    address = str(newcomer.private_ip)
    kubelet = [make_probe(newcomer, host, str(host.private_ip), "tcp", 10250) for host in cluster.members]
    pod = [make_probe(newcomer, host, str(host.private_ip), "udp", 51820) for host in cluster.members]
    before = run_probes(kubelet + pod)
    assert not any(before.values()), "the newcomer reaches a member before it is one"
    assert not any(_address_everywhere(cluster, address).values())
    counts = {name: outcome.rule_count for name, outcome in apply_all(cluster).items()}

    cluster.members.append(newcomer)
    try:
        applied = apply_all(cluster)
        assert _address_everywhere(cluster, address) == dict.fromkeys((h.name for h in cluster.members[:-1]), True)
        # Named sets: nftables and firewalld keep their rule count; UFW adds one rule per port.
        grown = {name: applied[name].rule_count - counts[name] for name in counts}
        assert grown == {"fw-srv": 0, "fw-nft": 0, "fw-fwd": 0, "fw-ufw": 2}  # a worker: 51820, 10250 from fw-new
        during = run_probes(kubelet + pod)
        assert all(during.values()), [f"{p.target.name} {p.port}/{p.protocol}" for p, ok in during.items() if not ok]
    finally:
        cluster.members.remove(newcomer)
        applied = apply_all(cluster)
    assert {name: outcome.rule_count for name, outcome in applied.items()} == counts
    assert not any(_address_everywhere(cluster, address).values())
    after = run_probes(kubelet + pod)
    assert not any(after.values()), [f"{p.target.name} {p.port}/{p.protocol}" for p, ok in after.items() if ok]


def test_refresh_shows_drift_and_update_repairs_it(cluster: Cluster) -> None:
    provider = HostFirewallProvider()
    nft_props = cluster.props(cluster.nft)
    clean = provider.read("fw-nft-firewall", nft_props)
    assert outs(clean)["rules"] == nft_props["rules"]
    count = outs(clean)["rule_count"]

    # Someone opens 8888 by hand in the program's table, and lets everything in on eth0.
    cluster.nft.run(["nft", "add", "rule", "inet", "hk3s_node", "input", "tcp", "dport", "8888", "accept"])
    cluster.nft.run(["nft", "add", "rule", "inet", "hk3s_node", "input", "iifname", "eth0", "accept"])
    assert tcp_open_from(cluster.outsider, str(cluster.nft.private_ip), 8888)
    assert tcp_open_from(None, str(cluster.nft.public_ip), 10250)
    drifted = provider.read("fw-nft-firewall", nft_props)
    assert outs(drifted)["rule_count"] == count + 2
    extra = [rule for rule in outs(drifted)["rules"] if rule not in nft_props["rules"]]
    assert extra == [
        {"port": "8888", "protocol": "tcp", "sources": ["0.0.0.0/0"], "purpose": "found on the host"},
        {
            "port": "",
            "protocol": "",
            "sources": [],
            "purpose": f"the program's nftables rules number {count + 2}, the plan's {count}",
        },
    ]
    assert provider.diff("fw-nft-firewall", outs(drifted), nft_props).changes

    updated = provider.update("fw-nft-firewall", outs(drifted), nft_props)
    assert outs(updated)["rule_count"] == count
    assert not tcp_open_from(cluster.outsider, str(cluster.nft.private_ip), 8888)
    assert not tcp_open_from(None, str(cluster.nft.public_ip), 10250)
    assert outs(provider.read("fw-nft-firewall", nft_props))["rules"] == nft_props["rules"]

    # UFW: a rule of the program's deleted by hand shows as missing, and comes back.
    ufw_props = cluster.props(cluster.ufw)
    server_ip = str(cluster.server.private_ip)
    cluster.ufw.run(["ufw", "delete", "allow", "proto", "tcp", "from", server_ip, "to", "any", "port", "9100"])
    assert not tcp_open_from(cluster.server, str(cluster.ufw.private_ip), 9100)
    drifted = provider.read("fw-ufw-firewall", ufw_props)
    assert not any(rule["port"] == "9100" for rule in outs(drifted)["rules"])
    provider.update("fw-ufw-firewall", outs(drifted), ufw_props)
    assert tcp_open_from(cluster.server, str(cluster.ufw.private_ip), 9100)
    assert outs(provider.read("fw-ufw-firewall", ufw_props))["rules"] == ufw_props["rules"]


def test_the_table_comes_back_after_a_reboot(cluster: Cluster) -> None:
    cluster.nft.reboot(wait=True, timeout=180)
    cluster.lab.wait_ssh_ready([cluster.nft], timeout=120)
    start_listener(cluster.nft)
    results = run_probes(probes_for(cluster.outsider, cluster.nft, str(cluster.nft.private_ip)))
    assert open_ports(results, cluster.outsider.name, cluster.nft, str(cluster.nft.private_ip)) == ONLY_SSH
    results = run_probes(probes_for(cluster.server, cluster.nft, str(cluster.nft.private_ip)))
    assert open_ports(results, cluster.server.name, cluster.nft, str(cluster.nft.private_ip)) == WORKER_FROM_SERVER


def test_nodeports_stay_closed_when_kube_proxy_would_forward_them(cluster: Cluster) -> None:
    """kube-proxy DNATs a NodePort to a pod before the input chain sees it. A
    pod (a network namespace inside the node) behind such a DNAT is reachable
    without the program's table, and not with it."""
    host = cluster.nft
    host.run(
        "set -e; ip netns add pod; ip link add veth-pod type veth peer name eth0 netns pod;"
        " ip addr add 10.244.7.1/24 dev veth-pod; ip link set veth-pod up;"
        " ip -n pod addr add 10.244.7.2/24 dev eth0; ip -n pod link set eth0 up; ip -n pod link set lo up;"
        " ip -n pod route add default via 10.244.7.1;"
        " nft add table ip kubeproxy;"
        " nft add chain ip kubeproxy prerouting '{ type nat hook prerouting priority dstnat; }';"
        " nft add rule ip kubeproxy prerouting tcp dport 30080 dnat to 10.244.7.2:8080;"
        " systemd-run --unit=hk3s-test-pod --collect ip netns exec pod python3 /root/listener.py 8080 '' /dev/null"
    )
    # /proc/sys is read-only inside the container: forward from the machine's side of its namespace.
    host.netns_run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    try:
        for _ in range(50):
            if host.run(["ip", "netns", "exec", "pod", "ss", "-Htln"]).stdout.count(":8080 "):
                break
            time.sleep(0.1)
        address = str(host.public_ip)
        assert not tcp_open_from(None, address, 30080)
        host.run(["nft", "delete", "table", "inet", "hk3s_node"])
        assert tcp_open_from(None, address, 30080), "the stand-in for kube-proxy's DNAT does not work"
    finally:
        host.run(
            "systemctl stop hk3s-test-pod; nft delete table ip kubeproxy; ip netns del pod",
            check=False,
        )
        asyncio.run(apply_node_firewall(ssh_target(cluster.lab, host), cluster.plan(host)))
    assert not tcp_open_from(None, str(host.public_ip), 30080)


# kube-proxy in iptables mode, as k3s runs it (kubernetes pkg/proxy/iptables/proxier.go): its jump
# to KUBE-NODEPORTS is put first in the filter table's INPUT chain (iptablesJumpChains, ensured with
# utiliptables.Prepend), ahead of UFW's chains, and that chain accepts every Service's
# healthCheckNodePort ("Capture healthCheckNodePorts": "no matter if node has local endpoints,
# healthCheckNodePorts need to add a rule to accept the incoming connection").
HEALTH_CHECK_JUMP = "-m comment --comment 'kubernetes health check service ports' -j KUBE-NODEPORTS"
KUBE_PROXY_HEALTH_CHECK = (
    "set -e; iptables -w 5 -N KUBE-NODEPORTS;"
    f" iptables -w 5 -I INPUT {HEALTH_CHECK_JUMP};"
    " iptables -w 5 -A KUBE-NODEPORTS -m comment --comment 'default/lb:http health check node port'"
    " -m tcp -p tcp --dport 30080 -j ACCEPT"
)
KUBE_PROXY_HEALTH_CHECK_UNDO = (
    f"iptables -w 5 -D INPUT {HEALTH_CHECK_JUMP}; iptables -w 5 -F KUBE-NODEPORTS; iptables -w 5 -X KUBE-NODEPORTS"
)


def test_a_health_check_nodeport_kube_proxy_accepts_stays_closed_on_every_backend(cluster: Cluster) -> None:
    """A LoadBalancer Service with externalTrafficPolicy Local gets a healthCheckNodePort, a port
    of the NodePort range kube-proxy itself serves on every node, and kube-proxy's iptables rules
    accept it first thing in INPUT. With NodePorts closed (hk3s:firewall.nodeports_open false) it
    stays closed on every backend: UFW (whose rules come after kube-proxy's jump), firewalld and
    plain nftables (tables of their own, where kube-proxy's accept is not final). Real packets to
    the module's listener on 30080/tcp (kube-proxy's health server stands there); kube-proxy's
    rules as its proxier writes them (above)."""
    hosts = [cluster.ufw, cluster.firewalld, cluster.nft]
    for host in hosts:
        host.run(KUBE_PROXY_HEALTH_CHECK)
    try:
        probes = [
            make_probe(source, host, address, "tcp", 30080)
            for host in hosts
            for source, address in (
                (None, str(host.public_ip)),
                (cluster.outsider, str(host.private_ip)),
                (cluster.server, str(host.private_ip)),
            )
        ]
        opened = [
            f"{p.source_name} -> {p.target_name} {p.address}" for p, is_open in run_probes(probes).items() if is_open
        ]
        assert not opened, f"a health-check NodePort answers: {opened}"
        # Without the program's guard UFW lets kube-proxy's accept through: its rules are real.
        cluster.ufw.run(["nft", "delete", "table", "inet", "hk3s_dnat_guard"])
        assert tcp_open_from(None, str(cluster.ufw.public_ip), 30080), "kube-proxy's accept did not show"
    finally:
        for host in hosts:
            host.run(KUBE_PROXY_HEALTH_CHECK_UNDO, check=False)
        asyncio.run(apply_node_firewall(ssh_target(cluster.lab, cluster.ufw), cluster.plan(cluster.ufw)))
    assert not tcp_open_from(None, str(cluster.ufw.public_ip), 30080)


KUBE_PROXY_TABLE = "hk3s_test_kubeproxy"


def kube_proxy_standin(host: Host, rules: Sequence[str]) -> None:
    """kube-proxy's DNAT, as its nftables mode writes it (kubernetes pkg/proxy/nftables/proxier.go:
    a nat chain on the prerouting hook at priority dstnat whose Service rules end in `dnat to`):
    `rules` are that chain's rules."""
    script = [
        f"nft add table ip {KUBE_PROXY_TABLE}",
        f"nft add chain ip {KUBE_PROXY_TABLE} prerouting '{{ type nat hook prerouting priority dstnat; }}'",
        *(f"nft add rule ip {KUBE_PROXY_TABLE} prerouting {rule}" for rule in rules),
    ]
    host.run("set -e; " + "; ".join(script))


def routes_via(sources: Sequence[Host], networks: Sequence[str], gateway: Host) -> None:
    """Each source routes `networks` through `gateway`'s private address: a host on the nodes'
    segment (a shared L2 network, a vSwitch) needs nothing more to send to pods and Services."""
    for source in sources:
        for network in networks:
            source.run(["ip", "route", "replace", network, "via", str(gateway.private_ip)])


def drop_routes(sources: Sequence[Host], networks: Sequence[str]) -> None:
    for source in sources:
        for network in networks:
            source.run(["ip", "route", "del", network], check=False)


def test_firewalld_holds_dnat_to_the_node_itself_to_the_plan(cluster: Cluster) -> None:
    """firewalld accepts every DNAT'd packet on its input path (firewalld's
    src/firewall/core/nftables.py, build_default_rules: "Generic accept of all DNAT'd packets",
    unless StrictForwardPorts=yes), past its zone. A Service whose endpoint is the node itself (a
    hostNetwork pod) is DNAT'd to the node's own address, so without a guard on the input path
    it answers whoever reaches the node: a NodePort with NodePorts closed, or the Service's
    ClusterIP routed through the node by a host on the nodes' segment. Real packets through a
    kube-proxy stand-in: a NodePort to node-exporter's 9100/tcp (open to the server alone) and a
    ClusterIP to the kubelet's 10250/tcp (open to the peers)."""
    host = cluster.firewalld
    private, public = str(host.private_ip), str(host.public_ip)
    cluster_ip = "10.43.0.10"
    kube_proxy_standin(
        host,
        [
            f"tcp dport 30091 dnat to {private}:9100",
            f"ip daddr {cluster_ip} tcp dport 443 dnat to {private}:10250",
        ],
    )
    callers = [cluster.outsider, cluster.server, cluster.nft]
    routes_via(callers, [f"{cluster_ip}/32"], host)
    try:
        # The sources the plan names still get through: the server to 9100, a peer to 10250.
        assert tcp_open_from(cluster.server, private, 30091)
        assert tcp_open_from(cluster.nft, cluster_ip, 443)
        # Nobody else: not the outsider on the segment, not the outside, not a worker to 9100.
        assert not tcp_open_from(cluster.outsider, private, 30091)
        assert not tcp_open_from(None, public, 30091)
        assert not tcp_open_from(cluster.nft, private, 30091)
        assert not tcp_open_from(cluster.outsider, cluster_ip, 443)
        # Without the guard firewalld lets them in: the stand-in's DNAT and firewalld's accept are real.
        host.run(["nft", "delete", "table", "inet", "hk3s_dnat_guard"])
        assert tcp_open_from(cluster.outsider, private, 30091), "firewalld's DNAT accept did not show"
        assert tcp_open_from(cluster.outsider, cluster_ip, 443), "firewalld's DNAT accept did not show"
    finally:
        drop_routes(callers, [f"{cluster_ip}/32"])
        host.run(f"nft delete table ip {KUBE_PROXY_TABLE}", check=False)
        asyncio.run(apply_node_firewall(ssh_target(cluster.lab, host), cluster.plan(host)))
    assert not tcp_open_from(None, public, 30091)


def start_pod(host: Host, address: str) -> None:
    """A pod: a network namespace behind a veth, its listener on 8080/tcp, the node forwarding."""
    gateway = address.rsplit(".", 1)[0] + ".1"
    host.run(
        "set -e; ip netns add pod; ip link add veth-pod type veth peer name eth0 netns pod;"
        f" ip addr add {gateway}/24 dev veth-pod; ip link set veth-pod up;"
        f" ip -n pod addr add {address}/24 dev eth0; ip -n pod link set eth0 up; ip -n pod link set lo up;"
        f" ip -n pod route add default via {gateway};"
        " systemd-run --unit=hk3s-test-pod --collect ip netns exec pod python3 /root/listener.py 8080 '' /dev/null"
    )
    # /proc/sys is read-only inside the container: forward from the machine's side of its namespace.
    host.netns_run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    for _ in range(50):
        if host.run(["ip", "netns", "exec", "pod", "ss", "-Htln"]).stdout.count(":8080 "):
            return
        time.sleep(0.1)
    pytest.fail(f"{host.name}: the test pod's listener did not come up")


def stop_pod(host: Host) -> None:
    host.run("systemctl stop hk3s-test-pod; ip netns del pod", check=False)


# flannel's forward rules (flannel-io/flannel pkg/trafficmngr/iptables, forwardRules): the FORWARD
# chain accepts everything from and to the pod network, whatever the host firewall's policy.
FLANNEL_FORWARD = (
    "iptables -w 5 -N FLANNEL-FWD; iptables -w 5 -A FORWARD -j FLANNEL-FWD;"
    " iptables -w 5 -A FLANNEL-FWD -s 10.42.0.0/16 -j ACCEPT; iptables -w 5 -A FLANNEL-FWD -d 10.42.0.0/16 -j ACCEPT"
)
FLANNEL_FORWARD_UNDO = (
    "iptables -w 5 -D FORWARD -j FLANNEL-FWD; iptables -w 5 -F FLANNEL-FWD; iptables -w 5 -X FLANNEL-FWD"
)


def test_pod_and_service_networks_take_nothing_from_a_non_node_on_the_segment(cluster: Cluster) -> None:
    """A host on the nodes' segment that routes the pod and Service networks through a node
    reaches pods past every port rule (flannel accepts all forwarded pod traffic, and a Service
    port the plan opens, such as 22/tcp, lets its DNAT through) unless traffic to those networks
    from a non-node, arriving outside the cluster fabric, is dropped. A node sending the same
    packets still gets through. UFW and plain nftables, real packets."""
    for host, pod in ((cluster.ufw, "10.42.7.2"), (cluster.nft, "10.42.8.2")):
        cluster_ip = "10.43.0.22"
        start_pod(host, pod)
        kube_proxy_standin(host, [f"ip daddr {cluster_ip} tcp dport 22 dnat to {pod}:8080"])
        host.run(FLANNEL_FORWARD)
        networks = [f"{pod}/32", f"{cluster_ip}/32"]
        callers = [cluster.outsider, cluster.server]
        routes_via(callers, networks, host)
        guard = "hk3s_dnat_guard" if host is cluster.ufw else "hk3s_node"
        try:
            assert tcp_open_from(cluster.server, pod, 8080), host.name
            assert tcp_open_from(cluster.server, cluster_ip, 22), host.name
            assert not tcp_open_from(cluster.outsider, pod, 8080), host.name
            assert not tcp_open_from(cluster.outsider, cluster_ip, 22), host.name
            # Without the program's guard the outsider gets in: the routes and stand-ins are real.
            host.run(["nft", "delete", "table", "inet", guard])
            assert tcp_open_from(cluster.outsider, pod, 8080), f"{host.name}: the pod is not routed"
            assert tcp_open_from(cluster.outsider, cluster_ip, 22), f"{host.name}: the Service is not routed"
        finally:
            drop_routes(callers, networks)
            host.run(FLANNEL_FORWARD_UNDO, check=False)
            host.run(f"nft delete table ip {KUBE_PROXY_TABLE}", check=False)
            stop_pod(host)
            asyncio.run(apply_node_firewall(ssh_target(cluster.lab, host), cluster.plan(host)))


def test_delete_takes_away_only_the_programs_rules(cluster: Cluster) -> None:
    provider = HostFirewallProvider()
    # Rules and tables the program does not own.
    cluster.ufw.run(["ufw", "allow", "proto", "tcp", "from", "any", "to", "any", "port", "8080"])
    cluster.nft.run(["nft", "add", "table", "inet", "operator_table"])
    try:
        for host in cluster.members:
            provider.delete(f"{host.name}-firewall", cluster.props(host))
        ufw_rules = cluster.ufw.run("cat /etc/ufw/user.rules").stdout
        assert "comment=" + b"hk3s".hex() not in ufw_rules
        assert "allow tcp 8080 0.0.0.0/0 any 0.0.0.0/0 in" in ufw_rules
        # The program enabled UFW, so it disables it again.
        assert "Status: inactive" in cluster.ufw.run(["ufw", "status"]).stdout
        assert cluster.firewalld.run(["firewall-cmd", "--get-default-zone"]).stdout.strip() == "public"
        assert "hk3s" not in cluster.firewalld.run(["firewall-cmd", "--get-zones"]).stdout
        assert cluster.firewalld.run(["firewall-cmd", "--get-ipsets"]).stdout.strip() == ""
        tables = cluster.nft.run(["nft", "list", "tables"]).stdout
        assert "hk3s_node" not in tables and "operator_table" in tables
        assert cluster.nft.run(["systemctl", "is-enabled", "hk3s-host-firewall.service"], check=False).returncode != 0
        for host in (cluster.nft, cluster.server, cluster.ufw):
            results = run_probes(probes_for(None, host, str(host.public_ip)))
            assert len(open_ports(results, "outside", host, str(host.public_ip))) == len(TCP_PORTS) + len(UDP_PORTS)
        # Deleting again (a retried delete) finds nothing and succeeds.
        provider.delete("fw-nft-firewall", cluster.props(cluster.nft))
    finally:
        cluster.nft.run(["nft", "delete", "table", "inet", "operator_table"], check=False)
        cluster.ufw.run(["ufw", "delete", "allow", "proto", "tcp", "from", "any", "to", "any", "port", "8080"])


def test_create_adopts_and_outputs_backend_and_rule_count(cluster: Cluster) -> None:
    provider = HostFirewallProvider()
    outcomes = {host.name: provider.create(cluster.props(host)) for host in cluster.members}
    assert {name: result.id for name, result in outcomes.items()} == {name: f"{name}-firewall" for name in outcomes}
    assert {name: outs(result)["backend"] for name, result in outcomes.items()} == cluster.backends
    # A create retried after a crash adopts what is there: same count, nothing doubled.
    again = provider.create(cluster.props(cluster.ufw))
    assert outs(again)["rule_count"] == outs(outcomes["fw-ufw"])["rule_count"]


VXLAN_LOG = "/run/hk3s-test-vxlan.log"
VXLAN_PORT = 9999


def flannel_like_device(host: Host, subnet: int, peer_subnet: int) -> str:
    """flannel.1 as flannel's vxlan backend makes it (VNI 1, port 8472, the node's private address
    as local, the node's pod subnet's .0 on it, a peer's pod subnet routed onlink through it);
    returns its MAC. The kernel's reverse-path filter is off on it, so the firewall alone decides."""
    host.run(f"systemctl stop '{LISTENER_UNIT}*'", check=False)  # it holds 8472/udp, which the device needs
    host.run(
        f"ip link add flannel.1 type vxlan id 1 local {host.private_ip} dstport 8472 nolearning && "
        f"ip addr add 10.42.{subnet}.0/32 dev flannel.1 && ip link set flannel.1 up && "
        f"ip route add 10.42.{peer_subnet}.0/24 via 10.42.{peer_subnet}.0 dev flannel.1 onlink"
    )
    # The host's /proc/sys is read-only inside it; its network namespace's settings are set from outside.
    host.netns_run(["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.flannel/1.rp_filter=0"])
    (host.root / "root/vxlan_log.py").write_text(UDP_LOG)
    log_unit = ["systemd-run", "--unit=hk3s-test-vxlan-log", "--collect", "python3", "/root/vxlan_log.py"]
    host.run([*log_unit, str(VXLAN_PORT), VXLAN_LOG])
    deadline = time.monotonic() + 10
    while f":{VXLAN_PORT} " not in host.run(["ss", "-Huln"]).stdout:
        assert time.monotonic() < deadline, f"{host.name}: the VXLAN log listener did not come up"
        time.sleep(0.1)
    return str(json.loads(host.run(["ip", "-j", "link", "show", "flannel.1"]).stdout)[0]["address"])


def test_a_forged_vxlan_packet_from_the_segment_reaches_no_node_on_any_backend(cluster: Cluster) -> None:
    """With `pod_network: vxlan`, 8472/udp is open to the peers' addresses only, but VXLAN has no
    authentication and an outer source is easy to forge on the nodes' segment: fw-out (on the
    private network, never a peer) sends VXLAN packets whose outer source is the server's address,
    so each node's firewall lets them in on 8472 and the kernel decapsulates them on flannel.1. Inner
    packets from fw-out's own address (answered straight back to it, were they let in) and from the
    node's own pod subnet (which never arrives over flannel.1) reach no listener on the UFW, the
    firewalld and the nftables node; a packet from a peer's pod subnet, routed back out of
    flannel.1, still does (so the forged packets are well made and the path works). The rule is on
    the source and interface, whatever the protocol: a SYN to sshd from the same forged packet
    meets the same drop. Real lab hosts, real kernel VXLAN devices made as flannel makes them, the
    program's real firewall on each backend (applied through SSH as the join applies it)."""
    targets = [cluster.ufw, cluster.firewalld, cluster.nft]
    rp_filter = {t.name: t.netns_run(["sysctl", "-n", "net.ipv4.conf.all.rp_filter"]).stdout.strip() for t in targets}
    apply_all(cluster, "vxlan")
    try:
        macs = {
            target.name: flannel_like_device(target, subnet=10 + index, peer_subnet=1)
            for index, target in enumerate(targets)
        }

        def forge(target: Host, inner_src: str, token: str) -> None:
            index = targets.index(target)
            argv = ["python3", "-c", VXLAN_SEND, str(cluster.server.private_ip), str(target.private_ip)]
            argv += [macs[target.name], inner_src, f"10.42.{10 + index}.0", str(VXLAN_PORT), token]
            cluster.outsider.run(argv, timeout=30)

        for index, target in enumerate(targets):
            forge(target, "10.42.1.5", f"from-a-pod-{target.name}")  # what flannel carries: passes
            forge(target, str(cluster.outsider.private_ip), f"from-the-outsider-{target.name}")
            forge(target, f"10.42.{10 + index}.7", f"own-subnet-{target.name}")

        def received(target: Host) -> str:
            return target.run(["cat", VXLAN_LOG], check=False).stdout

        for target in targets:
            deadline = time.monotonic() + 10
            while f"from-a-pod-{target.name}" not in received(target):
                assert time.monotonic() < deadline, (
                    f"{target.name}: a pod-network packet over VXLAN did not arrive (the set-up is wrong): "
                    + target.run(["nft", "list", "ruleset"], check=False).stdout[-3000:]
                )
                time.sleep(0.2)
        time.sleep(0.5)
        for target in targets:
            log = received(target)
            assert f"from-the-outsider-{target.name}" not in log, (target.name, log)
            assert f"own-subnet-{target.name}" not in log, (target.name, log)
    finally:
        for target in targets:
            target.run("systemctl stop hk3s-test-vxlan-log; ip link del flannel.1; rm -f " + VXLAN_LOG, check=False)
            target.netns_run(["sysctl", "-qw", f"net.ipv4.conf.all.rp_filter={rp_filter[target.name]}"], check=False)
            start_listener(target)
        apply_all(cluster)


# --------------------------------------------------------------------------- operator-run firewalls


@pytest.fixture(scope="module")
def operator_hosts(lab: Lab, cluster: Cluster) -> Iterator[dict[str, Host]]:
    hosts = {
        "ufw": lab.add_host(HostSpec("fw-op-ufw", extra_packages=UFW_PACKAGES)),
        "firewalld": lab.add_host(HostSpec("fw-op-fwd", extra_packages=FIREWALLD_PACKAGES)),
        "nft": lab.add_host(HostSpec("fw-op-nft")),
    }
    lab.wait_ssh_ready(list(hosts.values()), timeout=180)
    hosts["firewalld"].run("for i in $(seq 100); do firewall-cmd --state && exit 0; sleep 0.2; done; exit 1")
    for host in hosts.values():
        start_listener(host)
    yield hosts
    power_off(list(hosts.values()))


def _operator_rules(cluster: Cluster, host: Host) -> list[PortRule]:
    peers = {**cluster.peers(), host.name: str(host.private_ip)}
    return inbound_rules(
        role="worker", node=host.name, peers=peers, server=cluster.server.name, pod_network="wireguard"
    )


async def check_operator_firewall(
    target: SshTarget, required: Sequence[PortRule], *, none_acknowledged: bool = False
) -> OperatorFirewallReport:
    """Read the node's firewall as the join does (changing nothing) and judge it against `required`."""
    async with open_session(target) as session:
        inspection = await inspect_firewall(session, operator=True)
    return evaluate_operator_firewall(inspection, required, none_acknowledged=none_acknowledged)


def _missing(report: Any) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(rule.port, rule.protocol, tuple(rule.sources)) for rule in report.missing}


def test_operator_ufw_stops_the_join_and_lists_the_missing_rules(
    cluster: Cluster, operator_hosts: dict[str, Host]
) -> None:
    host = operator_hosts["ufw"]
    target = ssh_target(cluster.lab, host)
    required = _operator_rules(cluster, host)
    server = f"{cluster.server.private_ip}/32"
    workers = sorted(f"{h.private_ip}/32" for h in cluster.members if h is not cluster.server)

    # No active firewall at all: every port the host listens on is open to whoever reaches it
    # (real packets say so), which stops the join unless the stack acknowledges it.
    assert tcp_open_from(cluster.outsider, str(host.private_ip), 10250)
    assert tcp_open_from(None, str(host.public_ip), 8888)
    inactive = asyncio.run(check_operator_firewall(target, required))
    assert not inactive.active and inactive.stops_join
    assert host.name in inactive.message() and "hk3s:firewall.none_acknowledged" in inactive.message()
    acknowledged = asyncio.run(check_operator_firewall(target, required, none_acknowledged=True))
    assert not acknowledged.active and not acknowledged.stops_join

    host.run("ufw allow 22/tcp && ufw allow proto tcp from " + str(cluster.server.private_ip) + " to any port 10250")
    host.run(["ufw", "--force", "enable"])
    report = asyncio.run(check_operator_firewall(target, required))
    assert report.active and report.determined and report.stops_join
    assert _missing(report) == {
        ("51820", "udp", tuple(sorted([server, *workers]))),
        ("10250", "tcp", tuple(workers)),
        ("9100", "tcp", (server,)),
    }
    assert host.name in report.message() and "ufw allow proto udp from" in report.message()
    # The report agrees with real packets: the server's kubelet probe passes, a worker's does not.
    assert tcp_open_from(cluster.server, str(host.private_ip), 10250)
    assert not tcp_open_from(cluster.nft, str(host.private_ip), 10250)

    for command in report.suggested_commands():
        host.run(command)
    fixed = asyncio.run(check_operator_firewall(target, required))
    assert fixed.active and fixed.determined and not fixed.stops_join and fixed.missing == ()
    results = run_probes([make_probe(cluster.nft, host, str(host.private_ip), "udp", 51820)])
    assert all(results.values())


def test_operator_firewalld_and_nftables_are_checked_too(cluster: Cluster, operator_hosts: dict[str, Host]) -> None:
    server = str(cluster.server.private_ip)
    for kind in ("firewalld", "nft"):
        host = operator_hosts[kind]
        target = ssh_target(cluster.lab, host)
        required = _operator_rules(cluster, host)
        if kind == "firewalld":
            # Stock public zone (ssh, dhcpv6-client) plus one rich rule of the operator's.
            rich = f'rule family="ipv4" source address="{server}" port port="9100" protocol="tcp" accept'
            host.run(["firewall-cmd", f"--add-rich-rule={rich}"])
        else:
            host.run(
                "nft -f - <<'EOF'\n"
                "table inet operator {\n"
                "  chain input {\n"
                "    type filter hook input priority 0; policy drop;\n"
                "    ct state established,related accept\n"
                '    iif "lo" accept\n'
                "    tcp dport 22 accept\n"
                f"    ip saddr {server} tcp dport 9100 accept\n"
                "  }\n"
                "}\n"
                "EOF"
            )
        report = asyncio.run(check_operator_firewall(target, required))
        assert report.active and report.stops_join and report.determined, report.message()
        missing_ports = {(rule.port, rule.protocol) for rule in report.missing}
        assert missing_ports == {("51820", "udp"), ("10250", "tcp")}, report.message()
        assert tcp_open_from(cluster.server, str(host.private_ip), 9100)
        assert not tcp_open_from(cluster.server, str(host.private_ip), 10250)


def _segment_of(host: Host) -> str:
    """The private segment `host` shares with every lab host, the non-nodes included."""
    for addresses in host.addresses().values():
        for address in addresses:
            interface = ipaddress.ip_interface(address)
            if str(interface.ip) == str(host.private_ip):
                return str(interface.network)
    pytest.fail(f"{host.name}: no interface holds its private address {host.private_ip}")


def test_an_operator_firewall_open_wider_than_the_plan_is_refused_on_workers_and_the_server(
    cluster: Cluster, operator_hosts: dict[str, Host]
) -> None:
    """Every port of the plan against each source class, not only 8888/tcp and the NodePorts: a
    worker's UFW that opens the kubelet to every source, or to the whole private segment, lets a
    host that is no node in (real packets from fw-out say so) and stops the join; the server's
    path (K3sServer's first install) refuses a firewall that opens the API to every source, not
    only one that is not there."""
    from node_operations.firewall_plan import listening_ports  # noqa: PLC0415
    from node_operations.host_firewall.operator_firewall import require_host_firewall  # noqa: PLC0415

    host = operator_hosts["ufw"]
    target = ssh_target(cluster.lab, host)
    required = _operator_rules(cluster, host)
    listening = listening_ports("worker", "wireguard")
    address = str(host.private_ip)
    host.run("ufw --force reset && ufw default deny incoming && ufw allow 22/tcp")
    for rule in required:
        for source in rule.sources:
            if rule.port != "22":
                host.run(["ufw", "allow", "proto", rule.protocol, "from", source, "to", "any", "port", rule.port])
    host.run(["ufw", "--force", "enable"])
    try:
        report = asyncio.run(check_operator_firewall(target, required))
        assert not report.stops_join, report.message()
        assert not tcp_open_from(cluster.outsider, address, 10250)

        for source in ("any", _segment_of(host)):
            host.run(["ufw", "allow", "proto", "tcp", "from", source, "to", "any", "port", "10250"])
            assert tcp_open_from(cluster.outsider, address, 10250), "the outsider does not reach the kubelet"

            async def read() -> OperatorFirewallReport:
                async with open_session(target) as session:
                    inspection = await inspect_firewall(session, operator=True)
                return evaluate_operator_firewall(inspection, required, listening=listening)

            report = asyncio.run(read())
            assert report.stops_join and report.missing == (), report.message()
            expected = "0.0.0.0/0" if source == "any" else source
            assert [(rule.port, rule.sources) for rule in report.exposed] == [("10250", (expected,))], report.message()
            assert host.name in report.message() and "10250/tcp" in report.message()
            host.run(["ufw", "delete", "allow", "proto", "tcp", "from", source, "to", "any", "port", "10250"])
    finally:
        host.run(["ufw", "--force", "disable"])

    # The server: an operator nftables table that drops by default but lets every source reach 6443.
    server = operator_hosts["nft"]
    server_rules = inbound_rules(
        role="server",
        node=server.name,
        peers={server.name: str(server.private_ip), cluster.ufw.name: str(cluster.ufw.private_ip)},
        server=server.name,
        pod_network="wireguard",
    )
    server.run("nft delete table inet operator", check=False)
    ruleset = ["ct state established,related accept", 'iif "lo" accept', "tcp dport 22 accept"]
    ruleset += [f"ip saddr {cluster.ufw.private_ip} tcp dport {{ 6443, 10250 }} accept"]
    ruleset += [f"ip saddr {cluster.ufw.private_ip} udp dport 51820 accept"]
    body = "\n".join(f"    {line}" for line in ruleset)
    server.run(
        "nft -f - <<'EOF'\ntable inet operator {\n  chain input {\n"
        f"    type filter hook input priority 0; policy drop;\n{body}\n  }}\n}}\nEOF"
    )
    try:
        listening_server = listening_ports("server", "wireguard")
        server_target = ssh_target(cluster.lab, server)
        asyncio.run(
            require_host_firewall(server_target, server_rules, listening=listening_server, none_acknowledged=False)
        )
        assert not tcp_open_from(None, str(server.public_ip), 6443)
        server.run("nft add rule inet operator input tcp dport 6443 accept")
        assert tcp_open_from(None, str(server.public_ip), 6443), "the outside does not reach the API"
        with pytest.raises(FirewallError) as refused:
            asyncio.run(
                require_host_firewall(server_target, server_rules, listening=listening_server, none_acknowledged=False)
            )
        assert server.name in str(refused.value) and "6443/tcp to every source" in str(refused.value)
    finally:
        server.run("nft delete table inet operator", check=False)
