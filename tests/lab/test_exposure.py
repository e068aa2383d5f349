"""No port open wider than the port plan, DNAT'd traffic included, on UFW,
firewalld and nftables hosts, probed for real from outside the cluster.

The lab runs no pods (the k3s stand-in starts no containers), so this test puts
in place what ServiceLB and kube-proxy would: a "pod" (a network namespace
inside the host behind a veth, listening on 8080) and, in the nat table's
prerouting hook, the DNATs they write for traffic to the node's own addresses
(`fib daddr type local`, iptables' `-m addrtype --dst-type LOCAL`):

- ServiceLB publishes a LoadBalancer Service's ports as hostPorts, which the
  CNI portmap plugin DNATs (CNI-HOSTPORT-DNAT): here 80 and 443;
- kube-proxy DNATs a NodePort (KUBE-NODEPORTS): here 30080.

On the UFW hosts flannel's forward rules (FLANNEL-FWD: accept to and from the
pod network) are added too, as k3s adds them; firewalld accepts DNAT'd flows in
its own forward chain. The DNATs are installed on every node, the worst case
(with ingress on, the program's k3s config keeps ServiceLB to the server).

Before the guard is in place every DNAT'd port answers from outside, so a
closed port is the guard's doing; with it, a worker answers on SSH alone and
the server (ingress asked for) on SSH, 80 and 443.

The same forward chain keeps pods away from Hetzner's metadata service on a
Hetzner node (`block_metadata`). The lab has no metadata service: a plain host
(ex-meta) stands for it, 169.254.169.254 on its loopback and a listener on port
80, each node routing that address to it as a Hetzner server routes it to its
gateway, and masquerading its pod's traffic there as flannel masquerades pod
traffic that leaves the pod network.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from lab.hosts import Host, HostSpec, Lab
from node_operations.firewall_plan import METADATA_ADDRESS, Role, inbound_rules
from node_operations.host_firewall.fleet import NodeFirewallJob, apply_firewalls
from node_operations.host_firewall.plan import NodeFirewallPlan
from tests.lab.test_host_firewall import (
    FIREWALLD_PACKAGES,
    UFW_PACKAGES,
    power_off,
    ssh_target,
    tcp_open_from,
)

pytestmark = pytest.mark.lab

POD_NET = "10.244.7"
POD_LISTENER = """
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(64)
while True:
    conn, _ = s.accept()
    conn.close()
"""
# What ServiceLB's hostPorts and kube-proxy's NodePort leave in the nat table.
DNAT_RULES = f"""
table ip hk3s_test_dnat {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    fib daddr type local tcp dport {{ 80, 443 }} dnat to {POD_NET}.2:8080 comment "CNI-HOSTPORT-DNAT (ServiceLB)"
    fib daddr type local tcp dport 30080 dnat to {POD_NET}.2:8080 comment "KUBE-NODEPORTS (kube-proxy)"
  }}
}}
"""
DNAT_PORTS = (80, 443, 30080)
PROBED_PORTS = (22, 80, 443, 6443, 8888, 10250, 30080)


# flannel's masquerade of pod traffic that leaves the pod network (only the pod here starts any).
POD_MASQUERADE = f"""
table ip hk3s_test_masq {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {POD_NET}.0/24 ip daddr != {POD_NET}.0/24 masquerade
  }}
}}
"""
METADATA_LISTENER = POD_LISTENER.replace("8080", "80")


@dataclass
class ExposedCluster:
    lab: Lab
    server: Host
    workers: dict[str, Host]  # backend -> worker
    metadata: Host  # stands for Hetzner's metadata service; no member of the cluster
    block_metadata: bool = False

    @property
    def members(self) -> list[Host]:
        return [self.server, *self.workers.values()]

    def plan(self, host: Host) -> NodeFirewallPlan:
        role: Role = "server" if host is self.server else "worker"
        rules = inbound_rules(
            role=role,
            node=host.name,
            peers={member.name: str(member.private_ip) for member in self.members},
            server=self.server.name,
            pod_network="wireguard",
            ingress=True,
        )
        return NodeFirewallPlan(host.name, role, tuple(rules), block_metadata=self.block_metadata)

    def apply(self) -> dict[str, bool]:
        jobs = [NodeFirewallJob(ssh_target(self.lab, host), self.plan(host)) for host in self.members]
        result = asyncio.run(apply_firewalls(jobs))
        assert not result.failed, result.failed
        return {name: outcome.changed for name, outcome in result.applied.items()}


def add_pod_and_dnat(host: Host, *, flannel_forward: bool) -> None:
    """A pod behind a veth, listening on 8080, and the DNATs ServiceLB and kube-proxy write."""
    (host.root / "root/pod_listener.py").write_text(POD_LISTENER)
    host.run(
        "set -e; ip netns add pod; ip link add veth-pod type veth peer name eth0 netns pod;"
        f" ip addr add {POD_NET}.1/24 dev veth-pod; ip link set veth-pod up;"
        f" ip -n pod addr add {POD_NET}.2/24 dev eth0; ip -n pod link set eth0 up; ip -n pod link set lo up;"
        f" ip -n pod route add default via {POD_NET}.1;"
        " systemd-run --unit=hk3s-test-pod --collect ip netns exec pod python3 /root/pod_listener.py"
    )
    host.run(f"nft -f - <<'EOF'\n{DNAT_RULES}\nEOF")
    if flannel_forward:
        # flannel's FLANNEL-FWD rules, in the FORWARD chain UFW's policy would otherwise close.
        host.run(
            f"iptables -I FORWARD 1 -d {POD_NET}.0/24 -j ACCEPT; iptables -I FORWARD 1 -s {POD_NET}.0/24 -j ACCEPT"
        )
    # /proc/sys is read-only inside the container: forward from the machine's side of its namespace.
    host.netns_run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    for _ in range(100):
        if ":8080 " in host.run(["ip", "netns", "exec", "pod", "ss", "-Htln"]).stdout:
            return
        time.sleep(0.1)
    pytest.fail(f"{host.name}: the pod's listener did not come up")


def open_from_outside(host: Host, ports: tuple[int, ...] = PROBED_PORTS) -> set[int]:
    """TCP ports of `host`'s public address that accept a connection from the root namespace."""
    address = str(host.public_ip)
    with ThreadPoolExecutor(max_workers=len(ports)) as pool:
        answers = pool.map(lambda port: tcp_open_from(None, address, port), ports)
    return {port for port, answered in zip(ports, answers, strict=True) if answered}


def remove_guard(cluster: ExposedCluster, host: Host) -> None:
    if cluster.workers.get("nftables") is host:
        host.run(["nft", "delete", "chain", "inet", "hk3s_node", "dnat_guard"])
    else:
        host.run(["nft", "delete", "table", "inet", "hk3s_dnat_guard"])


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[ExposedCluster]:
    server = lab.add_host(HostSpec("ex-srv", extra_packages=UFW_PACKAGES))
    workers = {
        "ufw": lab.add_host(HostSpec("ex-ufw", extra_packages=UFW_PACKAGES)),
        "firewalld": lab.add_host(HostSpec("ex-fwd", extra_packages=FIREWALLD_PACKAGES)),
        "nftables": lab.add_host(HostSpec("ex-nft")),
    }
    metadata = lab.add_host(HostSpec("ex-meta"))
    hosts = [server, *workers.values(), metadata]
    lab.wait_ssh_ready(hosts, timeout=180)
    workers["firewalld"].run("for i in $(seq 100); do firewall-cmd --state && exit 0; sleep 0.2; done; exit 1")
    made = ExposedCluster(lab, server, workers, metadata)
    try:
        changed = made.apply()
        assert all(changed.values()), changed
        for host in made.members:
            add_pod_and_dnat(host, flannel_forward=host in (server, workers["ufw"]))
        yield made
    finally:
        power_off(hosts)


def test_each_backend_is_the_one_it_should_be(cluster: ExposedCluster) -> None:
    assert "Status: active" in cluster.server.run(["ufw", "status"]).stdout
    assert "Status: active" in cluster.workers["ufw"].run(["ufw", "status"]).stdout
    assert cluster.workers["firewalld"].run(["firewall-cmd", "--get-default-zone"]).stdout.strip() == "hk3s"
    for host in (cluster.server, cluster.workers["ufw"], cluster.workers["firewalld"]):
        assert "table inet hk3s_dnat_guard" in host.run(["nft", "list", "tables"]).stdout, host.name
        assert host.run(["systemctl", "is-enabled", "hk3s-dnat-guard.service"]).stdout.strip() == "enabled"
    nft = cluster.workers["nftables"]
    assert "chain dnat_guard" in nft.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout


def test_without_the_guard_every_dnat_answers_from_outside(cluster: ExposedCluster) -> None:
    """The exposure the issue describes, on every backend: UFW, firewalld and
    nftables input chains alone let the DNAT'd hostPorts and the NodePort through."""
    try:
        for host in cluster.members:
            remove_guard(cluster, host)
        found = {host.name: open_from_outside(host, DNAT_PORTS) for host in cluster.members}
        assert found == {host.name: set(DNAT_PORTS) for host in cluster.members}
    finally:
        changed = cluster.apply()
    assert all(changed.values()), changed  # the guard came back everywhere


def test_with_the_guard_a_worker_answers_on_ssh_alone_and_the_server_on_ssh_and_ingress(
    cluster: ExposedCluster,
) -> None:
    found = {host.name: open_from_outside(host) for host in cluster.members}
    assert found == {
        "ex-srv": {22, 80, 443},
        "ex-ufw": {22},
        "ex-fwd": {22},
        "ex-nft": {22},
    }
    # From a peer on the private network it is the same: ingress on the server, no NodePort anywhere.
    peer = cluster.workers["nftables"]
    assert tcp_open_from(peer, str(cluster.server.private_ip), 443)
    assert not tcp_open_from(peer, str(cluster.server.private_ip), 30080)
    assert not tcp_open_from(peer, str(cluster.workers["ufw"].private_ip), 80)


def test_reapplying_changes_nothing_and_refresh_sees_a_missing_guard(cluster: ExposedCluster) -> None:
    from node_operations.host_firewall.apply import read_node_firewall  # noqa: PLC0415

    assert cluster.apply() == dict.fromkeys((host.name for host in cluster.members), False)
    host = cluster.workers["firewalld"]
    host.run(["nft", "delete", "table", "inet", "hk3s_dnat_guard"])
    try:
        observed = asyncio.run(read_node_firewall(ssh_target(cluster.lab, host), cluster.plan(host)))
        assert any("DNAT guard" in note for note in observed.notes), observed.notes
        assert 30080 in open_from_outside(host, (30080,))
    finally:
        assert cluster.apply()[host.name] is True
    assert open_from_outside(host) == {22}


def pod_reaches(host: Host, address: str, port: int = 80) -> bool:
    """A TCP connect from `host`'s pod (its network namespace behind the veth)."""
    argv = ["ip", "netns", "exec", "pod", "nc", "-z", "-w", "3", address, str(port)]
    return host.run(argv, check=False, timeout=30).returncode == 0


def test_on_a_hetzner_node_pods_reach_no_metadata_service_and_the_node_itself_still_does(
    cluster: ExposedCluster,
) -> None:
    """Every backend: before the block each node's pod reaches the metadata stand-in (so a closed
    port is the block's doing); with the plan's `block_metadata` the pod's connection is refused
    in the forward path, while the node itself (as a hostNetwork pod would) and the pod's traffic
    to any other address (the stand-in host's own) still get through."""
    meta = cluster.metadata
    meta.run(["ip", "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo"])
    (meta.root / "root/metadata_listener.py").write_text(METADATA_LISTENER)
    meta.run(["systemd-run", "--unit=hk3s-test-metadata", "--collect", "python3", "/root/metadata_listener.py"])
    for host in cluster.members:
        host.run(["ip", "route", "replace", f"{METADATA_ADDRESS}/32", "via", str(meta.public_ip)])
        host.run(f"nft -f - <<'EOF'\n{POD_MASQUERADE}\nEOF")

    # A real pod's traffic arrives on cni0, which the program puts in its fabric zone; the pod's
    # veth stands for it there (at runtime, so the program's zone files stay as it wrote them; an
    # apply reloads firewalld, so again after each).
    def veth_in_fabric_zone() -> None:
        cluster.workers["firewalld"].run(["firewall-cmd", "--zone=hk3s-fabric", "--change-interface=veth-pod"])

    veth_in_fabric_zone()
    wait_listening = "for i in $(seq 100); do ss -Htln | grep -q ':80 ' && exit 0; sleep 0.1; done; exit 1"
    meta.run(wait_listening)
    before = {host.name: pod_reaches(host, METADATA_ADDRESS) for host in cluster.members}
    assert before == dict.fromkeys(before, True), before

    cluster.block_metadata = True
    changed = cluster.apply()
    assert all(changed.values()), changed
    veth_in_fabric_zone()
    after = {host.name: pod_reaches(host, METADATA_ADDRESS) for host in cluster.members}
    assert after == dict.fromkeys(after, False), after
    for host in cluster.members:
        assert tcp_open_from(host, METADATA_ADDRESS, 80), f"{host.name} itself no longer reaches it"
        assert pod_reaches(host, str(meta.public_ip)), f"{host.name}'s pod reaches nothing outside any more"
    # Kept across a reapply: the plan with the block is what the host holds (the veth's runtime
    # zone, the test's own, undone first: the program would put its zones back as it wrote them).
    cluster.workers["firewalld"].run(["firewall-cmd", "--zone=hk3s-fabric", "--remove-interface=veth-pod"])
    assert cluster.apply() == dict.fromkeys((host.name for host in cluster.members), False)
    veth_in_fabric_zone()
    assert not any(pod_reaches(host, METADATA_ADDRESS) for host in cluster.members)
