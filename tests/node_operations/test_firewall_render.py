"""The host firewall renderers and checkers, without lab hosts.

The nftables file is checked by the kernel itself (`nft -c -f`), and loaded
and read back, inside a throwaway network namespace (the `netns` fixture), so
nothing on this machine changes; the namespace is deleted afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from node_operations.firewall_plan import PortRule, inbound_rules, listening_ports
from node_operations.host_firewall.backends import BACKENDS
from node_operations.host_firewall.dnat_guard import render_dnat_guard
from node_operations.host_firewall.drift import align_rules
from node_operations.host_firewall.firewalld import FIREWALLD
from node_operations.host_firewall.inspection import parse_inspection
from node_operations.host_firewall.nftables import NFTABLES
from node_operations.host_firewall.operator_firewall import evaluate_operator_firewall
from node_operations.host_firewall.plan import SESSION_SSH_PURPOSE, FirewallError, NodeFirewallPlan
from node_operations.host_firewall.ufw import UFW, UfwRule, existing_ufw_rules, ufw_changes
from tests.vxlan_forgery import UDP_LOG, VXLAN_SEND

SERVER = "srv"


def cluster_peers(workers: int) -> dict[str, str]:
    peers = {SERVER: "10.0.0.2"}
    peers.update({f"w{index}": f"10.0.{1 + index // 200}.{10 + index % 200}" for index in range(workers)})
    return peers


def plan_for(node: str, peers: dict[str, str], **options: object) -> NodeFirewallPlan:
    role = "server" if node == SERVER else "worker"
    nodeports_open = bool(options.pop("nodeports_open", False))
    rules = inbound_rules(
        role=role,  # type: ignore[arg-type]
        node=node,
        peers=peers,
        server=SERVER,
        pod_network="wireguard",
        nodeports_open=nodeports_open,
        **options,  # type: ignore[arg-type]
    )
    return NodeFirewallPlan(node, role, tuple(rules), nodeports_open)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- nftables in a namespace


# The `netns` fixture (tests/conftest.py): a throwaway network namespace.


def nft(netns: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", *args], input=stdin, capture_output=True, text=True, check=False
    )


def ruleset_json(netns: str) -> list[dict[str, object]]:
    listed = nft(netns, "-j", "list", "ruleset")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout)["nftables"])


def inspection_of(ruleset: list[dict[str, object]], **facts: str) -> object:
    lines = [f"fact {name} {value}" for name, value in facts.items()]
    lines.append("data nft_json " + json.dumps({"nftables": ruleset}))
    lines += ["fact nft installed", "fact complete yes"]
    return parse_inspection("node", "\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("node", "options"),
    [
        ("w1", {}),
        ("w1", {"nodeports_open": True}),
        (SERVER, {"operator_access": ["203.0.113.0/24", "2001:db8::/48"]}),
        (SERVER, {"ingress": True}),
    ],
    ids=["worker", "worker-nodeports-open", "server-with-ipv6-operators", "server-with-ingress"],
)
def test_the_kernel_accepts_the_rendered_table(netns: str, node: str, options: dict[str, object]) -> None:
    plan = plan_for(node, cluster_peers(5), **options)
    for ruleset in (NFTABLES.render(plan), render_dnat_guard(plan)):
        checked = nft(netns, "-c", "-f", "-", stdin=ruleset.text)
        assert checked.returncode == 0, checked.stderr
    # Check mode changed nothing.
    assert nft(netns, "list", "ruleset").stdout.strip() == ""


def test_loading_twice_is_idempotent_and_a_removed_peer_is_really_gone(netns: str) -> None:
    big = plan_for("w1", cluster_peers(5))
    small = plan_for("w1", {name: address for name, address in cluster_peers(5).items() if name != "w3"})
    for _ in range(2):
        assert nft(netns, "-f", "-", stdin=NFTABLES.render(big).text).returncode == 0
    observed = NFTABLES.observe(inspection_of(ruleset_json(netns)))  # type: ignore[arg-type]
    assert observed.present and observed.rule_count == NFTABLES.render(big).rule_count
    assert align_rules(observed.rules, big.rules) == list(big.rules)

    assert nft(netns, "-f", "-", stdin=NFTABLES.render(small).text).returncode == 0
    listed = nft(netns, "list", "table", "inet", "hk3s_node").stdout
    # `flush table` alone would have kept w3's address in the set.
    assert cluster_peers(5)["w3"] not in listed
    observed = NFTABLES.observe(inspection_of(ruleset_json(netns)))  # type: ignore[arg-type]
    assert align_rules(observed.rules, small.rules) == list(small.rules)


def test_another_table_survives_and_a_hand_made_rule_shows_as_drift(netns: str) -> None:
    assert nft(netns, "add", "table", "inet", "operator").returncode == 0
    plan = plan_for("w1", cluster_peers(3))
    assert nft(netns, "-f", "-", stdin=NFTABLES.render(plan).text).returncode == 0
    assert "table inet operator" in nft(netns, "list", "tables").stdout
    assert nft(netns, "add", "rule", "inet", "hk3s_node", "input", "tcp", "dport", "8888", "accept").returncode == 0
    observed = NFTABLES.observe(inspection_of(ruleset_json(netns)))  # type: ignore[arg-type]
    aligned = align_rules(observed.rules, plan.rules)
    assert aligned[: len(plan.rules)] == list(plan.rules)
    assert aligned[len(plan.rules) :] == [PortRule("8888", "tcp", ("0.0.0.0/0",), "found on the host")]


# --------------------------------------------------------------------------- nftables shape


def test_the_table_has_the_recipes_shape() -> None:
    text = NFTABLES.render(plan_for("w1", cluster_peers(3))).text
    lines = [line.strip() for line in text.splitlines()]
    assert lines[lines.index("table inet hk3s_node {}") + 1] == "delete table inet hk3s_node"
    body = lines[lines.index("type filter hook input priority filter; policy drop;") + 1 :]
    assert body[:3] == ["ct state established,related accept", "ct state invalid drop", 'iif "lo" accept']
    fabric = next(line for line in body if line.startswith("iifname"))
    for interface in ("flannel.1", "flannel-wg", "cni0", "lxc*", "cilium_*"):
        assert f'"{interface}"' in fabric
    assert any("packet-too-big" in line for line in body) and any(line.startswith("icmp type") for line in body)
    assert 'tcp dport 22 accept comment "SSH"' in lines
    assert not any("8888" in line for line in lines)
    guard = lines[lines.index("type filter hook forward priority filter - 5; policy accept;") + 1 :]
    assert guard[0] == "ct state established,related accept" and guard[1].startswith("iifname {")
    assert 'ct status dnat meta l4proto tcp ct original proto-dst 22 accept comment "SSH"' in guard
    assert guard[guard.index("}") - 1].startswith("ct status dnat drop")
    assert not any("30000" in line for line in guard)


def test_rule_count_does_not_grow_with_the_peers() -> None:
    few = NFTABLES.render(plan_for("w1", cluster_peers(3)))
    many = NFTABLES.render(plan_for("w1", cluster_peers(100)))
    assert few.rule_count == many.rule_count
    assert many.text.count("set peers_v4_") == 2  # the other nodes; the server (node metrics)
    assert many.text.count("10.0.") > 100


def test_nodeports_open_opens_them_to_everyone_also_through_the_dnat_guard() -> None:
    text = NFTABLES.render(plan_for("w1", cluster_peers(3), nodeports_open=True)).text
    assert "tcp dport 30000-32767 accept" in text and "udp dport 30000-32767 accept" in text
    assert "ct status dnat meta l4proto tcp ct original proto-dst 30000-32767 accept" in text


def test_the_dnat_guard_follows_the_plan_on_every_backend() -> None:
    """DNAT'd traffic passes the guard to exactly the plan's ports and sources: the
    worker's guard lets SSH and the peers' ports through, the server's with ingress
    also 80/443 to everyone; the separate table (UFW, firewalld) holds the same chain."""
    worker = plan_for("w1", cluster_peers(3))
    guard = render_dnat_guard(worker)
    assert "table inet hk3s_dnat_guard {" in guard.text and "chain input" not in guard.text
    # Two chains (forward, and input beside UFW or firewalld), each with two rules that are not
    # about DNAT (established flows, the fabric); the input chain also closes the NodePort range.
    assert guard.text.count("ct status dnat") == guard.rule_count - 5
    assert "ip saddr @peers_v4_1 meta l4proto udp th dport 51820 accept" in guard.text
    assert "ip saddr @peers_v4_1 meta l4proto udp ct original proto-dst 51820 accept" in guard.text
    assert "proto-dst 80 " not in guard.text and "proto-dst 443 " not in guard.text
    server = plan_for(SERVER, cluster_peers(3), ingress=True)
    text = NFTABLES.render(server).text
    assert 'tcp dport 80 accept comment "ingress (Traefik through ServiceLB)"' in text
    assert "ct status dnat meta l4proto tcp ct original proto-dst 443 accept" in text
    # The worker's plan never opens 80/443, even with ingress on.
    assert plan_for("w1", cluster_peers(3), ingress=True) == worker
    with_ingress = NodeFirewallPlan("w1", "worker", (*worker.rules, PortRule("80", "tcp", ("0.0.0.0/0",), "web")))
    assert any("only SSH may be open to every source" in problem for problem in with_ingress.problems())


def test_a_hetzner_node_rejects_forwarded_traffic_to_the_metadata_service_first(netns: str) -> None:
    """The forward chain every backend has (in the program's table with nftables, in the guard's
    own table beside UFW or firewalld) rejects forwarded traffic to 169.254.169.254 before it
    accepts anything, established flows and the fabric included; without the flag it does not."""
    plain = plan_for("w1", cluster_peers(3))
    hetzner = dataclasses.replace(plain, block_metadata=True)
    reject = 'ip daddr 169.254.169.254 reject comment "pods to the cloud metadata service (it serves the host keys)"'
    for render in (NFTABLES.render, render_dnat_guard):
        text, count = render(hetzner).text, render(hetzner).rule_count
        chain = text[text.index("chain dnat_guard {") :]
        first_rule = chain.splitlines()[2].strip()
        assert first_rule == reject, chain
        assert reject not in render(plain).text and count == render(plain).rule_count + 1
        checked = nft(netns, "-c", "-f", "-", stdin=text)
        assert checked.returncode == 0, checked.stderr


def test_the_cluster_networks_are_closed_to_non_nodes_outside_the_fabric(netns: str) -> None:
    """Both guard chains beside UFW or firewalld, and the forward chain of the program's own
    table, drop traffic to the pod and Service networks (by the address the client sent to,
    before DNAT) from a non-node outside the fabric, after the fabric's accept; the real nft
    accepts the text. Without the networks there is no such rule; a bad network is refused."""
    plain = plan_for("w1", cluster_peers(3))
    closed = dataclasses.replace(
        plain, cluster_networks=("10.42.0.0/16", "10.43.0.0/16"), node_addresses=("10.0.1.2", "10.0.1.3")
    )
    drop = (
        "ct original ip daddr { 10.42.0.0/16, 10.43.0.0/16 } ip saddr != { 10.0.1.2, 10.0.1.3 } drop comment "
        '"pod and Service networks from a non-node outside the fabric"'
    )
    for render, chains in ((NFTABLES.render, 1), (render_dnat_guard, 2)):
        text = render(closed).text
        assert text.count(drop) == chains, text
        # With the networks also the fabric guard's two rules (test_a_forged_vxlan_packet_...).
        assert render(closed).rule_count == render(plain).rule_count + chains + 2
        assert drop not in render(plain).text
        for chain in ("chain dnat_guard {", "chain dnat_guard_input {")[:chains]:
            rules = [line.strip() for line in text[text.index(chain) :].splitlines()[2:]]
            assert rules.index(drop) == 2 and rules[1].startswith("iifname {"), rules
        checked = nft(netns, "-c", "-f", "-", stdin=text)
        assert checked.returncode == 0, checked.stderr
    bad = dataclasses.replace(plain, cluster_networks=("pods",), node_addresses=("2001:db8::1",))
    assert bad.problems() == [
        "cluster_networks: 'pods' is not an IP network",
        "node_addresses: '2001:db8::1' is not an IPv4 network",
    ]


def test_the_input_guard_holds_dnat_to_the_node_to_the_delivered_port_and_source(netns: str) -> None:
    """Beside UFW or firewalld (firewalld accepts every DNAT'd packet on input), DNAT'd traffic to
    the node itself passes by the port it is delivered to, to the plan's sources, and is dropped
    otherwise; loopback and the fabric pass. The program's own nftables table needs no such chain."""
    worker = plan_for("w1", cluster_peers(3))
    text = render_dnat_guard(worker).text
    chain = text[text.index("chain dnat_guard_input {") :]
    lines = [line.strip() for line in chain.splitlines()]
    lines = lines[: lines.index("}")]
    assert lines[1] == "type filter hook input priority filter - 5; policy accept;"
    assert lines[2] == "ct state established,related accept" and lines[3].startswith('iifname { "lo", "cni0"')
    assert "ip saddr @peers_v4_1 meta l4proto tcp th dport 10250 accept" in chain
    assert lines[-1] == 'ct status dnat drop comment "DNAT to this node on a port the plan keeps closed to the source"'
    assert "dnat_guard_input" not in NFTABLES.render(worker).text
    checked = nft(netns, "-c", "-f", "-", stdin=text)
    assert checked.returncode == 0, checked.stderr


def test_the_input_guard_closes_the_nodeport_range_unless_nodeports_are_open(netns: str) -> None:
    """kube-proxy (iptables mode) accepts every Service's healthCheckNodePort from a jump it puts
    first in INPUT (kubernetes pkg/proxy/iptables/proxier.go), ahead of UFW's chains, so beside
    UFW or firewalld the guard's input chain drops new connections to the NodePort range from
    outside the fabric while NodePorts are closed: a drop in any base chain is final. Loopback
    and the fabric still pass (before it); with nodeports_open there is no such rule. The program's
    own table needs none: kube-proxy's accept in another table does not end its input chain."""
    closed = plan_for("w1", cluster_peers(3))
    opened = plan_for("w1", cluster_peers(3), nodeports_open=True)
    drop = (
        "meta l4proto { tcp, udp } th dport 30000-32767 drop comment "
        '"NodePorts closed (hk3s:firewall.nodeports_open), kube-proxy health-check ports included"'
    )
    text = render_dnat_guard(closed).text
    chain = text[text.index("chain dnat_guard_input {") :]
    rules = [line.strip() for line in chain.splitlines()]
    rules = rules[: rules.index("}")]
    assert rules[-2] == drop, rules
    fabric = next(index for index, rule in enumerate(rules) if rule.startswith('iifname { "lo", "cni0"'))
    assert rules.index(drop) > fabric, rules
    assert drop not in render_dnat_guard(opened).text
    checked = nft(netns, "-c", "-f", "-", stdin=text)
    assert checked.returncode == 0, checked.stderr


# The node's side of a veth to a client namespace, UFW's stand-in (its default: incoming denied,
# SSH allowed) and kube-proxy's health-check accept put first in INPUT, as its iptables proxier
# writes them (kubernetes pkg/proxy/iptables/proxier.go: iptablesJumpChains, ensured with Prepend;
# "Capture healthCheckNodePorts").
HEALTH_CHECK_NODE = """set -e
ip link add hk3s-node type veth peer name hk3s-client netns {client}
ip addr add 192.0.2.1/24 dev hk3s-node
ip link set hk3s-node up
ip link set lo up
ip -n {client} addr add 192.0.2.2/24 dev hk3s-client
ip -n {client} link set hk3s-client up
iptables -w 5 -P INPUT DROP
iptables -w 5 -A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
iptables -w 5 -A INPUT -p tcp --dport 22 -j ACCEPT
iptables -w 5 -N KUBE-NODEPORTS
iptables -w 5 -I INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
iptables -w 5 -A KUBE-NODEPORTS -m comment --comment "default/lb:http health check node port" -m tcp -p tcp --dport 30080 -j ACCEPT
"""
LISTEN = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 30080)); s.listen(8); print('ready', flush=True)\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)
CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection(('192.0.2.1', 30080), timeout=1).close(); print('open')\n"
    "except OSError:\n"
    "    print('closed')\n"
)


def test_the_guard_holds_a_health_check_nodeport_that_kube_proxy_accepts_real_packets(netns: str) -> None:
    """Real packets between two network namespaces: kube-proxy's accept of a healthCheckNodePort,
    first in iptables' INPUT, lets a client past a UFW-like INPUT policy (the attack); with the
    guard's table loaded (what the program writes beside UFW or firewalld, NodePorts closed) the
    client gets no connection, because a drop in any base chain is final. The lab test with real
    UFW: tests/lab/test_host_firewall.py::test_a_health_check_nodeport_kube_proxy_accepts_stays_closed_on_every_backend."""
    if shutil.which("iptables") is None:
        pytest.skip("needs iptables")
    client = f"{netns}-client"
    subprocess.run(["ip", "netns", "add", client], check=True)
    listener = None
    try:
        subprocess.run(["ip", "netns", "exec", netns, "sh", "-c", HEALTH_CHECK_NODE.format(client=client)], check=True)
        listener = subprocess.Popen(
            ["ip", "netns", "exec", netns, "python3", "-c", LISTEN], stdout=subprocess.PIPE, text=True
        )
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"

        def reach() -> str:
            done = subprocess.run(
                ["ip", "netns", "exec", client, "python3", "-c", CONNECT], check=False, capture_output=True, text=True
            )
            return done.stdout.strip()

        assert reach() == "open", "kube-proxy's accept did not let the client in"
        loaded = nft(netns, "-f", "-", stdin=render_dnat_guard(plan_for("w1", cluster_peers(3))).text)
        assert loaded.returncode == 0, loaded.stderr
        assert reach() == "closed"
        # With NodePorts open the plan lets it through, as every NodePort.
        loaded = nft(
            netns, "-f", "-", stdin=render_dnat_guard(plan_for("w1", cluster_peers(3), nodeports_open=True)).text
        )
        assert loaded.returncode == 0, loaded.stderr
        assert reach() == "open"
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "netns", "delete", client], check=False)


# --------------------------------------------------------------------------- plan checks


def test_plan_refuses_what_must_stay_closed() -> None:
    base = plan_for("w1", cluster_peers(3))
    cases = {
        "8888/tcp must stay closed": PortRule("8000-9000", "tcp", ("10.0.0.2/32",), "wide"),
        "opens NodePorts": PortRule("30080", "tcp", ("10.0.0.2/32",), "a NodePort"),
        "only SSH may be open to every source": PortRule("10250", "tcp", ("0.0.0.0/0",), "kubelet"),
        "no sources": PortRule("10250", "tcp", (), "kubelet"),
        "quotes": PortRule("10250", "tcp", ("10.0.0.2/32",), 'say "hi"'),
    }
    for expected, rule in cases.items():
        plan = NodeFirewallPlan(base.node, base.role, (*base.rules, rule))
        problems = plan.problems()
        assert any(expected in problem for problem in problems), (expected, problems)
        with pytest.raises(FirewallError, match="w1: the firewall plan is refused"):
            NFTABLES.render(plan)
    assert base.problems() == []
    server = plan_for(SERVER, cluster_peers(3), operator_access=["0.0.0.0/0"])
    assert server.problems() == []


def test_the_session_port_stays_open() -> None:
    plan = plan_for("w1", cluster_peers(3))
    assert plan.with_session_port(22) == plan
    moved = plan.with_session_port(2222)
    assert moved.rules[0] == PortRule("2222", "tcp", ("0.0.0.0/0",), SESSION_SSH_PURPOSE)
    assert 'tcp dport 2222 accept comment "SSH (the port hk3s logs in on)"' in NFTABLES.render(moved).text


# --------------------------------------------------------------------------- UFW


def test_ufw_rules_and_changes() -> None:
    plan = plan_for("w1", cluster_peers(3))
    wanted = UFW.render(plan)
    assert UfwRule("port", "tcp", "22", "any", "-", "hk3s: SSH") in wanted
    assert UfwRule("port", "udp", "51820", "10.0.0.2", "-", "hk3s: pod network (WireGuard)") in wanted
    assert all(rule.comment.startswith("hk3s") for rule in wanted)

    fresh = ufw_changes([], wanted)
    assert fresh.add[0].port == "22" and not fresh.delete
    assert ufw_changes(wanted, wanted).empty

    # A peer moves: the new address is added before the old one is deleted.
    moved = plan_for("w1", {**cluster_peers(3), "w2": "10.0.9.9"})
    changes = ufw_changes(wanted, UFW.render(moved))
    lines = changes.file_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["add"] * len(changes.add) + ["delete"] * len(changes.delete)
    assert {rule.source for rule in changes.add} == {"10.0.9.9"}
    assert {rule.source for rule in changes.delete} == {cluster_peers(3)["w2"]}

    # Another comment on the same rule (an operator's copy): re-added, so it becomes the program's.
    relabelled = [UfwRule(r.kind, r.protocol, r.port, r.source, r.interface, "") for r in wanted]
    assert len(ufw_changes(relabelled, wanted).add) == len(wanted)


def test_ufw_tuples_read_back() -> None:
    tagged = b"hk3s: kubelet".hex()
    output = "\n".join(
        [
            "fact ufw installed",
            "fact ufw_active yes",
            "fact ufw_default_input DROP",
            f"data ufw_v4 allow tcp 10250 0.0.0.0/0 any 10.0.0.2 in comment={tagged}",
            f"data ufw_v4 allow tcp 10250 0.0.0.0/0 any 10.0.0.3 in comment={tagged}",
            f"data ufw_v4 allow tcp 22 0.0.0.0/0 any 0.0.0.0/0 in comment={b'hk3s: SSH'.hex()}",
            f"data ufw_v6 allow tcp 22 ::/0 any ::/0 in comment={b'hk3s: SSH'.hex()}",
            "data ufw_v4 allow tcp 8080 0.0.0.0/0 any 0.0.0.0/0 in",
            "fact complete yes",
        ]
    )
    inspection = parse_inspection("w1", output + "\n")
    assert inspection.backend() == "ufw"
    observed = UFW.observe(inspection)
    assert observed.rule_count == 4  # the operator's 8080 is not the program's
    assert set(observed.rules) == {
        PortRule("10250", "tcp", ("10.0.0.2/32", "10.0.0.3/32"), "kubelet"),
        PortRule("22", "tcp", ("0.0.0.0/0",), "SSH"),
    }
    assert len(existing_ufw_rules(inspection)) == 3  # the v6 copy of SSH folds into the v4 one


# --------------------------------------------------------------------------- firewalld


def test_firewalld_zone_and_ipsets() -> None:
    files = FIREWALLD.render(plan_for(SERVER, cluster_peers(3), operator_access=["203.0.113.0/24"]))
    zone = ET.fromstring(files["zones/hk3s.xml"])
    assert [(port.get("port"), port.get("protocol")) for port in zone.findall("port")] == [("22", "tcp")]
    used = {rule.find("source").get("ipset") for rule in zone.findall("rule")}  # type: ignore[union-attr]
    assert used == {name[len("ipsets/") : -len(".xml")] for name in files if name.startswith("ipsets/")}
    api_set = ET.fromstring(files["ipsets/hk3s-peers-v4-1.xml"])
    assert "203.0.113.0/24" in [entry.text for entry in api_set.findall("entry")]
    fabric = ET.fromstring(files["zones/hk3s-fabric.xml"])
    assert fabric.get("target") == "ACCEPT"
    assert {item.get("name") for item in fabric.findall("interface")} == {"cni0", "flannel.1", "flannel-wg"}


# --------------------------------------------------------------------------- operator-run firewalls


def required_for_worker() -> list[PortRule]:
    """w1's rules: from the server 10.0.0.2 and the other worker w0, 10.0.1.10."""
    return inbound_rules(role="worker", node="w1", peers=cluster_peers(2), server=SERVER, pod_network="wireguard")


def test_operator_ufw_report() -> None:
    rules = [
        "allow tcp 22 0.0.0.0/0 any 0.0.0.0/0 in",
        "deny tcp 10250 0.0.0.0/0 any 10.0.1.10 in",
        "allow tcp 10250 0.0.0.0/0 any 10.0.0.0/16 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.0.2 in",
    ]
    output = "fact ufw installed\nfact ufw_active yes\nfact ufw_default_input DROP\n"
    output += "".join(f"data ufw_v4 {rule}\n" for rule in rules) + "fact complete yes\n"
    report = evaluate_operator_firewall(parse_inspection("w1", output), required_for_worker())
    assert report.stops_join and report.determined
    assert {(rule.port, rule.protocol, rule.sources) for rule in report.missing} == {
        ("51820", "udp", ("10.0.1.10/32",)),
        ("10250", "tcp", ("10.0.1.10/32",)),  # denied before the allow
        ("9100", "tcp", ("10.0.0.2/32",)),
    }
    assert "ufw allow proto tcp from 10.0.1.10/32 to any port 10250" in report.message()

    allowing = output.replace("ufw_default_input DROP", "ufw_default_input ACCEPT").replace(
        "deny tcp 10250", "allow tcp 10250"
    )
    # Nothing the cluster needs is missing, but an ACCEPT default opens to every source what
    # must stay closed: 8888/tcp and (the stack keeps them closed) the NodePorts.
    open_everywhere = evaluate_operator_firewall(parse_inspection("w1", allowing), required_for_worker())
    assert open_everywhere.missing == () and open_everywhere.stops_join
    # (and every port of the plan: its default lets every source in).
    assert [(rule.port, rule.protocol) for rule in open_everywhere.exposed] == [
        ("51820", "udp"),
        ("10250", "tcp"),
        ("9100", "tcp"),
        ("8888", "tcp"),
        ("30000-32767", "tcp"),
        ("30000-32767", "udp"),
    ]
    assert "opens wider than the cluster's plan: 51820/udp to every source" in open_everywhere.message()
    assert "8888/tcp to every source (must stay closed" in open_everywhere.message()
    # The stack opens the NodePorts: then they are not held against it.
    with_nodeports = inbound_rules(
        role="worker", node="w1", peers=cluster_peers(2), server=SERVER, pod_network="wireguard", nodeports_open=True
    )
    assert [r.port for r in evaluate_operator_firewall(parse_inspection("w1", allowing), with_nodeports).exposed] == [
        "51820",
        "10250",
        "9100",
        "8888",
    ]
    every_rule = [
        "allow tcp 22 0.0.0.0/0 any 0.0.0.0/0 in",
        "allow tcp 10250 0.0.0.0/0 any 10.0.0.0/16 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.0.0/16 in",
        "allow tcp 9100 0.0.0.0/0 any 10.0.0.2 in",
    ]
    tight = "fact ufw installed\nfact ufw_active yes\nfact ufw_default_input DROP\n"
    tight += "".join(f"data ufw_v4 {rule}\n" for rule in every_rule) + "fact complete yes\n"
    assert not evaluate_operator_firewall(parse_inspection("w1", tight), required_for_worker()).stops_join
    inactive = output.replace("ufw_active yes", "ufw_active no")
    assert not evaluate_operator_firewall(parse_inspection("w1", inactive), required_for_worker()).active


def test_operator_firewalld_report() -> None:
    zones = [
        "public (active)",
        "  target: default",
        "  interfaces: eth0",
        "  sources: ",
        "  services: ssh kubelet",
        "  ports: 51820/udp",
        "  rich rules: ",
        '\trule family="ipv4" source address="10.0.0.2" port port="9100" protocol="tcp" accept',
    ]
    output = "fact firewalld installed\nfact firewalld_running yes\nfact firewalld_default_zone public\n"
    output += "".join(f"data firewalld_zones {line}\n" for line in zones)
    output += "data firewalld_service:ssh ssh\ndata firewalld_service:ssh   ports: 22/tcp\n"
    output += "data firewalld_service:kubelet kubelet\ndata firewalld_service:kubelet   ports: 10250/tcp\n"
    output += "fact address eth0 10.0.0.11/16\nfact complete yes\n"
    report = evaluate_operator_firewall(parse_inspection("w1", output), required_for_worker())
    assert report.firewall == "firewalld" and report.determined and report.missing == ()
    # The zone opens the kubelet and the pod network's port to every source: more than the plan.
    assert report.stops_join
    assert [(rule.port, rule.sources) for rule in report.exposed] == [
        ("51820", ("0.0.0.0/0",)),
        ("10250", ("0.0.0.0/0",)),
    ]
    # The same ports from the peers only, as rich rules: nothing missing, nothing wider.
    peers_only = output.replace("services: ssh kubelet", "services: ssh").replace("ports: 51820/udp", "ports: ")
    for peer in ("10.0.0.2", "10.0.1.10"):
        for port, protocol in (("10250", "tcp"), ("51820", "udp")):
            rich = f'rule family="ipv4" source address="{peer}" port port="{port}" protocol="{protocol}" accept'
            peers_only = peers_only.replace("fact address", f"data firewalld_zones \t{rich}\nfact address", 1)
    report = evaluate_operator_firewall(parse_inspection("w1", peers_only), required_for_worker())
    assert report.determined and not report.stops_join, report.message()

    without_kubelet = peers_only.replace('port port="10250"', 'port port="10251"')
    report = evaluate_operator_firewall(parse_inspection("w1", without_kubelet), required_for_worker())
    assert report.stops_join and [(rule.port, rule.protocol) for rule in report.missing] == [("10250", "tcp")]
    assert "firewall-cmd --permanent" in report.message()


def test_operator_nftables_report_from_a_real_ruleset(netns: str) -> None:
    operator = (
        "table inet filter {\n"
        "  set cluster { type ipv4_addr; flags interval; elements = { 10.0.0.0/16 } }\n"
        "  chain input {\n"
        "    type filter hook input priority 0; policy drop;\n"
        "    ct state established,related accept\n"
        '    iifname "lo" accept\n'
        "    tcp dport 22 accept\n"
        "    ip saddr @cluster tcp dport { 10250, 9100 } accept\n"
        "    jump extra\n"
        "  }\n"
        "  chain extra {\n"
        "    meta l4proto udp th dport 51820 ip saddr 10.0.0.2 counter accept\n"
        "  }\n"
        "}\n"
    )
    assert nft(netns, "-f", "-", stdin=operator).returncode == 0
    inspection = inspection_of(ruleset_json(netns))
    report = evaluate_operator_firewall(inspection, required_for_worker())  # type: ignore[arg-type]
    assert report.firewall == "nftables" and report.determined and report.stops_join
    assert [(rule.port, rule.protocol, rule.sources) for rule in report.missing] == [
        ("51820", "udp", ("10.0.1.10/32",))
    ]

    # A match the checker cannot read: it says so and asks for every rule.
    assert nft(netns, "add", "rule", "inet", "filter", "input", "meta", "mark", "0x1", "drop").returncode == 0
    unclear = evaluate_operator_firewall(inspection_of(ruleset_json(netns)), required_for_worker())  # type: ignore[arg-type]
    assert not unclear.determined and unclear.stops_join
    assert {rule.port for rule in unclear.missing} == {"51820", "10250", "9100"}
    assert "could not be checked" in unclear.message() and "meta mark" in unclear.reason


def test_no_firewall_stops_the_join_unless_the_stack_acknowledges_it() -> None:
    inspection = parse_inspection("w1", "fact nft installed\nfact complete yes\n")
    report = evaluate_operator_firewall(inspection, required_for_worker())
    assert not report.active and report.stops_join
    assert report.message().startswith("w1: no active host firewall")
    assert "hk3s:firewall.none_acknowledged true" in report.message()
    acknowledged = evaluate_operator_firewall(inspection, required_for_worker(), none_acknowledged=True)
    assert not acknowledged.active and not acknowledged.stops_join


def test_ufw_rules_not_of_the_programs_are_named() -> None:
    """Untagged allow rules open ports beside the plan: the apply names them (never deletes)."""
    tagged = "comment=" + b"hk3s: kubelet".hex()
    lines = [
        f"allow tcp 10250 0.0.0.0/0 any 10.0.0.2 in {tagged}",
        "allow tcp 8080 0.0.0.0/0 any 0.0.0.0/0 in",
        "deny tcp 25 0.0.0.0/0 any 0.0.0.0/0 in",
    ]
    output = "fact ufw installed\nfact ufw_active yes\nfact ufw_default_input DROP\n"
    output += "".join(f"data ufw_v4 {line}\n" for line in lines)
    output += "data ufw_v6 allow tcp 8080 ::/0 any ::/0 in\nfact complete yes\n"
    assert BACKENDS["ufw"].foreign_allows(parse_inspection("w1", output)) == [
        "allow tcp 8080 from 0.0.0.0/0",
        "allow tcp 8080 from ::/0 (v6)",
    ]


def ufw_inspection(node: str, rules: list[str], *, addresses: tuple[str, ...] = ()) -> object:
    output = "fact ufw installed\nfact ufw_active yes\nfact ufw_default_input DROP\n"
    output += "".join(f"fact address {address}\n" for address in addresses)
    output += "".join(f"data ufw_v4 {rule}\n" for rule in rules) + "fact complete yes\n"
    return parse_inspection(node, output)


def test_an_operator_firewall_that_opens_a_cluster_port_to_every_source_stops_the_join() -> None:
    """Every port of the plan, not only 8888/tcp and the NodePorts: a UFW that opens the kubelet,
    the pod network's port, the node metrics (a worker) or the API (the server) to every source
    lets anyone who reaches the node in, though nothing the cluster needs is missing."""
    needed = [
        "allow tcp 22 0.0.0.0/0 any 0.0.0.0/0 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.0.2 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.1.10 in",
        "allow tcp 9100 0.0.0.0/0 any 10.0.0.2 in",
    ]
    for wide in ("allow tcp 10250 0.0.0.0/0 any 0.0.0.0/0 in", "allow tcp 10250 0.0.0.0/0 any 0.0.0.0/1 in"):
        report = evaluate_operator_firewall(
            ufw_inspection("w1", [*needed, wide]),  # type: ignore[arg-type]
            required_for_worker(),
        )
        if wide.endswith("0.0.0.0/1 in"):
            # Half the addresses, the peers among them, is not every source: not accused.
            assert report.exposed == () and not report.stops_join, report.message()
            continue
        assert report.missing == () and report.stops_join
        assert [(rule.port, rule.protocol, rule.sources) for rule in report.exposed] == [
            ("10250", "tcp", ("0.0.0.0/0",))
        ]
        assert "w1" in report.message() and "10250/tcp" in report.message() and "kubelet" in report.message()

    # The server: the API, the kubelet and the pod network's port, with no rule of the plan for
    # them at all (a server alone has no peers) and with one.
    server_rules = inbound_rules(
        role="server", node=SERVER, peers={SERVER: "10.0.0.2"}, server=SERVER, pod_network="vxlan"
    )
    everything = ["allow any any 0.0.0.0/0 any 0.0.0.0/0 in"]
    report = evaluate_operator_firewall(
        ufw_inspection(SERVER, everything),  # type: ignore[arg-type]
        server_rules,
        listening=listening_ports("server", "vxlan"),
    )
    assert report.stops_join
    assert {(rule.port, rule.protocol) for rule in report.exposed} == {
        ("6443", "tcp"),
        ("10250", "tcp"),
        ("8472", "udp"),
        ("8888", "tcp"),
        ("30000-32767", "tcp"),
        ("30000-32767", "udp"),
    }


def test_an_operator_firewall_that_opens_a_cluster_port_to_the_nodes_segment_stops_the_join() -> None:
    """The other source class: a host on the node's own network that is no node (another server
    of the same private network). A rule for the whole segment lets it reach the kubelet; the
    report names the port, the segment and an address there that is no node."""
    rules = [
        "allow tcp 22 0.0.0.0/0 any 0.0.0.0/0 in",
        "allow tcp 10250 0.0.0.0/0 any 10.0.0.0/16 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.0.0/16 in",
        "allow tcp 9100 0.0.0.0/0 any 10.0.0.2 in",
    ]
    inspection = ufw_inspection("w1", rules, addresses=("eth1 10.0.0.11/16", "eth0 203.0.113.7/32", "lo 127.0.0.1/8"))
    report = evaluate_operator_firewall(inspection, required_for_worker())  # type: ignore[arg-type]
    assert report.missing == () and report.stops_join
    assert [(rule.port, rule.protocol, rule.sources) for rule in report.exposed] == [
        ("51820", "udp", ("10.0.0.0/16",)),
        ("10250", "tcp", ("10.0.0.0/16",)),
    ]
    message = report.message()
    assert "10.0.0.0/16" in message and "not a node" in message
    # The peers' own addresses only: nothing wider than the plan.
    narrow = [
        rules[0],
        "allow tcp 10250 0.0.0.0/0 any 10.0.0.2 in",
        "allow tcp 10250 0.0.0.0/0 any 10.0.1.10 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.0.2 in",
        "allow udp 51820 0.0.0.0/0 any 10.0.1.10 in",
        rules[3],
    ]
    inspection = ufw_inspection("w1", narrow, addresses=("eth1 10.0.0.11/16",))
    assert not evaluate_operator_firewall(inspection, required_for_worker()).stops_join  # type: ignore[arg-type]


# --------------------------------------------------------------------------- forged VXLAN


def _in(netns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True, text=True, check=check)


@pytest.mark.parametrize("backend", ["nftables", "guard"])
def test_a_forged_vxlan_packet_from_the_segment_reaches_nothing(netns: str, tmp_path: Path, backend: str) -> None:
    """A host on the nodes' segment forges a VXLAN packet (VNI 1, the outer source a peer's
    address, so 8472/udp lets it in) whose inner packet comes from its own address: the node
    decapsulates it on flannel.1, and a fabric its firewall accepted whole would deliver it and
    answer the sender directly. The program's rule lets in on flannel.1 only what comes from the
    cluster's networks and would be routed back out of flannel.1 (strict reverse path): the
    forged packet reaches no listener, a pod-network source behind flannel.1 still does. Real
    kernel, real VXLAN device, real nftables (the program's table, or the guard table it loads
    beside UFW and firewalld), two network namespaces joined by a veth pair."""
    attacker = f"{netns}-b"
    subprocess.run(["ip", "netns", "add", attacker], check=True)
    log = tmp_path / "udp.log"
    listener: subprocess.Popen[str] | None = None
    try:
        subprocess.run(
            ["ip", "link", "add", "vn0", "netns", netns, "type", "veth", "peer", "name", "va0", "netns", attacker],
            check=True,
        )
        for ns, dev, address in ((netns, "vn0", "192.168.77.1/24"), (attacker, "va0", "192.168.77.2/24")):
            _in(ns, "ip", "addr", "add", address, "dev", dev)
            _in(ns, "ip", "link", "set", dev, "up")
            _in(ns, "ip", "link", "set", "lo", "up")
        _in(netns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
        _in(netns, "ip", "link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", "192.168.77.1")
        _in(netns, "ip", "link", "set", "flannel.1", "type", "vxlan", "dstport", "8472", check=False)
        _in(netns, "sysctl", "-qw", "net.ipv4.conf.flannel/1.rp_filter=0")
        _in(netns, "ip", "addr", "add", "10.42.8.0/32", "dev", "flannel.1")
        _in(netns, "ip", "link", "set", "flannel.1", "up")
        # A peer's pod subnet, behind flannel.1 as flannel routes it.
        _in(netns, "ip", "route", "add", "10.42.1.0/24", "via", "10.42.1.0", "dev", "flannel.1", "onlink")
        mac = json.loads(_in(netns, "ip", "-j", "link", "show", "flannel.1").stdout)[0]["address"]

        peers = {"node": "192.168.77.1", "peer": "192.168.77.3"}
        rules = inbound_rules(role="worker", node="node", peers=peers, server="peer", pod_network="vxlan")
        plan = NodeFirewallPlan(
            "node",
            "worker",
            tuple(rules),
            cluster_networks=("10.42.0.0/16", "10.43.0.0/16"),
            node_addresses=tuple(sorted(peers.values())),
        )
        ruleset = NFTABLES.render(plan).text if backend == "nftables" else render_dnat_guard(plan).text
        loaded = nft(netns, "-f", "-", stdin=ruleset)
        assert loaded.returncode == 0, loaded.stderr

        listener = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", UDP_LOG, "9999", str(log)], text=True
        )
        deadline = time.monotonic() + 10
        while ":9999 " not in _in(netns, "ss", "-Huln").stdout:
            assert time.monotonic() < deadline, "the listener did not come up"
            time.sleep(0.05)

        def forge(inner_src: str, token: str) -> None:
            # The outer source is forged to the peer's address: 8472/udp is open to it.
            argv = [sys.executable, "-c", VXLAN_SEND, "192.168.77.3", "192.168.77.1", mac, inner_src]
            _in(attacker, *argv, "192.168.77.1", "9999", token)

        forge("10.42.1.5", "from-a-pod")  # what flannel carries: passes
        forge("192.168.77.2", "from-the-attacker")  # the attacker's own address: would be answered
        forge("10.42.8.7", "own-subnet")  # this node's own pod subnet never arrives on flannel.1
        deadline = time.monotonic() + 5
        while "from-a-pod" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "a pod-network packet over VXLAN did not arrive: the set-up is wrong"
            time.sleep(0.05)
        time.sleep(0.3)
        received = log.read_text()
        assert "from-the-attacker" not in received, received
        assert "own-subnet" not in received, received
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "netns", "delete", attacker], check=False)
