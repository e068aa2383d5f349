"""Network mode through the real Pulumi engine on booted lab hosts (a private network
when every node shares one, else public addresses): the lab's private bridge is the shared
private network, its public bridge the Internet. Nothing is mocked: the
decision reads the hosts' real routing tables, the connection checks open real
TCP connections, and the k3s stand-in registers the nodes at the addresses the
program chose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, worker_spec

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"


@dataclass
class Stack:
    lab: Lab
    server: Host
    stack: LabStack

    def config(self, workers: list[Host], **network: Any) -> dict[str, Any]:
        return base_config(self.lab, self.server, workers, network={"mode": "auto", **network})

    def up(self) -> auto.UpResult:
        try:
            return self.stack.up()
        except auto.CommandError as error:
            pytest.fail(f"pulumi up failed:\n{self.stack.text()[-8000:]}\n{error}")

    def up_fails(self) -> str:
        before = len(self.stack.log)
        with pytest.raises(auto.CommandError) as failure:
            self.stack.up()
        return "\n".join(self.stack.log[before:]) + str(failure.value)

    def node_names(self) -> set[str]:
        listed = json.loads(self.server.run([K3S, "kubectl", "get", "nodes", "-o", "json"]).stdout)
        return {item["metadata"]["name"] for item in listed["items"]}

    def internal_ip(self, name: str) -> str:
        node = json.loads(self.server.run([K3S, "kubectl", "get", "node", name, "-o", "json"]).stdout)
        return next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")

    def outputs_nodes(self) -> dict[str, dict[str, Any]]:
        outputs = self.stack.stack().outputs()
        return {node["name"]: node for node in outputs["nodes"].value}


def _stack(lab: Lab, tmp: pytest.TempPathFactory, name: str, **server: Any) -> Stack:
    skip_without_lab_binaries()
    host = lab.add_host(server_spec(name, **server))
    lab.wait_ssh_ready([host])
    return Stack(lab, host, LabStack(tmp.mktemp(name)))


@pytest.fixture(scope="module")
def private(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield _stack(lab, tmp_path_factory, "nm-server")


def test_shared_private_network_is_chosen_and_used(lab: Lab, private: Stack) -> None:
    worker = lab.add_host(worker_spec("nm-worker-1"))
    lab.wait_ssh_ready([worker])
    assert worker.private_ip and private.server.private_ip
    private.stack.write_config(private.config([worker]))
    result = private.up()
    nodes = {node["name"]: node for node in result.outputs["nodes"].value}
    assert nodes["nm-worker-1"]["network_mode"] == "private"
    # The cluster talks over the private network: the node's InternalIP, the agent's
    # server URL and its flannel interface are the private ones.
    assert private.internal_ip("nm-worker-1") == worker.private_ip
    assert private.internal_ip("nm-server") == private.server.private_ip
    config_yaml = worker.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout
    assert f"https://{private.server.private_ip}:6443" in config_yaml and "enp7s0" in config_yaml
    # The API is advertised on the private address too (k3s would take the server's external IP,
    # closed to 6443 in private mode): the `kubernetes` Service endpoint pods and agents use.
    endpoints = json.loads(
        private.server.run(["/usr/local/bin/k3s", "kubectl", "get", "endpoints", "kubernetes", "-o", "json"]).stdout
    )
    assert [a["ip"] for s in endpoints["subsets"] for a in s["addresses"]] == [private.server.private_ip]
    # Both connection checks ran over the private network before the join.
    text = private.stack.text()
    assert f"connected to nm-worker-1 at {worker.private_ip}:22 over the private network" in text
    assert f"connected to nm-server at {private.server.private_ip}:6443 over the private network" in text
    assert "network mode private over" in text


def test_a_later_change_of_mode_is_refused(private: Stack) -> None:
    current = yaml_config(private)
    current["network"] = {**current["network"], "mode": "public"}
    private.stack.write_config(current)
    try:
        message = private.up_fails()
        assert "first join fixed it to private" in message and "Set hk3s:network.mode back to private" in message
        assert private.outputs_nodes()["nm-worker-1"]["network_mode"] == "private"
    finally:
        current["network"]["mode"] = "auto"
        private.stack.write_config(current)


def test_failed_connection_check_stops_the_join_naming_it(lab: Lab, private: Stack) -> None:
    worker = lab.add_host(worker_spec("nm-worker-2"))
    lab.wait_ssh_ready([worker])
    assert worker.private_ip
    # The private route exists, but SSH over the private NIC is dropped.
    worker.run(["nft", "add table inet block"])
    worker.run(["nft", "add chain inet block input { type filter hook input priority -10; policy accept; }"])
    worker.run(["nft", "add rule inet block input iifname enp7s0 tcp dport 22 drop"])
    current = yaml_config(private)
    current["workers"].append(base_config(private.lab, private.server, [worker])["workers"][0])
    private.stack.write_config(current)
    message = private.up_fails()
    assert (
        f"the connection from nm-server to nm-worker-2 at {worker.private_ip}:22 over the private network failed"
        in message
    ), message[-4000:]
    assert "hk3s:network.mode: public" in message
    assert "nm-worker-2" not in private.node_names()
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0
    # Opened again, the next run joins it over the private network.
    worker.run(["nft", "delete table inet block"])
    private.up()
    assert private.internal_ip("nm-worker-2") == worker.private_ip


def yaml_config(stack: Stack) -> dict[str, Any]:
    import yaml  # noqa: PLC0415

    document = yaml.safe_load((stack.stack.project / f"Pulumi.{stack.stack.name}.yaml").read_text())
    return {key.removeprefix("hk3s:"): value for key, value in document["config"].items()}


def test_no_shared_private_network_means_public(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> None:
    stack = _stack(lab, tmp_path_factory, "nm-pub-server")
    worker = lab.add_host(worker_spec("nm-pub-worker", private_nic=False))
    lab.wait_ssh_ready([worker])
    stack.stack.write_config(stack.config([worker]))
    result = stack.up()
    nodes = {node["name"]: node for node in result.outputs["nodes"].value}
    assert nodes["nm-pub-worker"]["network_mode"] == "public"
    assert stack.internal_ip("nm-pub-worker") == worker.public_ip
    assert stack.internal_ip("nm-pub-server") == stack.server.public_ip
    assert "nm-pub-worker has no private path to the server nm-pub-server" in stack.stack.text()


def test_default_route_network_stops_with_the_setting_then_is_used(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stack = _stack(lab, tmp_path_factory, "nm-dr-server")
    worker = lab.add_host(worker_spec("nm-dr-worker", private_default_route=True))
    lab.wait_ssh_ready([worker])
    stack.stack.write_config(stack.config([worker]))
    message = stack.up_fails()
    private_net = str(lab.private_net)
    assert f"private_network: {private_net}" in message and "carries their default route" in message, message[-4000:]
    assert "Nothing was joined" in message
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0
    # With the setting, the worker joins over that network.
    stack.stack.write_config(stack.config([worker], private_network=private_net))
    stack.up()
    assert stack.internal_ip("nm-dr-worker") == worker.private_ip
    # Recorded: without the setting it keeps its private path; only the decision's inputs change.
    stack.stack.write_config(stack.config([worker]))
    result = stack.up()
    changes = {str(getattr(op, "value", op)): count for op, count in (result.summary.resource_changes or {}).items()}
    assert changes.get("update", 0) <= 1 and not {"create", "replace", "delete"} & set(changes), changes
    assert stack.internal_ip("nm-dr-worker") == worker.private_ip


def test_private_network_overlapping_the_pod_network_is_refused(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stack = _stack(lab, tmp_path_factory, "nm-ov-server", private_cidr="10.42.0.0/16")
    worker = lab.add_host(worker_spec("nm-ov-worker", private_cidr="10.42.0.0/16"))
    lab.wait_ssh_ready([worker])
    stack.stack.write_config(stack.config([worker]))
    message = stack.up_fails()
    assert "10.42.0.0/16 overlaps the cluster's pod cidr 10.42.0.0/16 (hk3s:cluster.pod_cidr)" in message, message[
        -4000:
    ]
    # Refused before k3s was touched anywhere.
    for host in (stack.server, worker):
        assert host.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0


def _k3s_main_pid(host: Host) -> str:
    return host.run(["systemctl", "show", "-p", "MainPID", "--value", "k3s"]).stdout.strip()


def _node_ip_in_config(host: Host) -> str:
    import yaml  # noqa: PLC0415

    return str(yaml.safe_load(host.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout)["node-ip"])


def test_moving_the_server_into_private_mode_needs_approval_and_rolls_back(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The server is installed before any worker (mode still open: public address). The
    first join decides private, which moves the server: refused without approval; with
    approval, a failed recovery restores the previous configuration; then it moves."""
    stack = _stack(lab, tmp_path_factory, "nm-mv-server")
    server = stack.server
    assert server.public_ip and server.private_ip
    stack.stack.write_config(stack.config([]))
    first = stack.up()
    assert first.summary.result == "succeeded"
    assert _node_ip_in_config(server) == server.public_ip
    worker = lab.add_host(worker_spec("nm-mv-worker"))
    lab.wait_ssh_ready([worker])
    stack.stack.write_config(stack.config([worker]))
    stack.stack.preview()
    assert "k3s restarts on the server (the API is down for 10-30 s" in stack.stack.text()
    pid = _k3s_main_pid(server)

    message = stack.up_fails()
    assert "restarts k3s on the server" in message and "approve_server_restart: true" in message, message[-4000:]
    assert _k3s_main_pid(server) == pid and _node_ip_in_config(server) == server.public_ip
    assert "nm-mv-worker" not in stack.node_names()

    # A fault that stops k3s from starting with the new address: the recovery checks fail.
    dropin = "/etc/systemd/system/k3s.service.d"
    server.run(["mkdir", "-p", dropin])
    server.run(
        [
            "sh",
            "-c",
            f'printf \'[Service]\\nExecStartPre=/bin/sh -c "! grep -qx \\\\"node-ip: {server.private_ip}\\\\" '
            f"/etc/rancher/k3s/config.yaml\"\\n' > {dropin}/fault.conf && systemctl daemon-reload",
        ]
    )
    stack.stack.write_config(stack.config([worker], approve_server_restart=True))
    message = stack.up_fails()
    assert "previous configuration was restored" in message, message[-4000:]
    assert _node_ip_in_config(server) == server.public_ip
    server.run([K3S, "kubectl", "get", "--raw", "/readyz"])
    assert "nm-mv-worker" not in stack.node_names()

    server.run(["sh", "-c", f"rm -f {dropin}/fault.conf && systemctl daemon-reload"])
    stack.up()
    assert _node_ip_in_config(server) == server.private_ip
    assert stack.internal_ip("nm-mv-server") == server.private_ip
    assert stack.internal_ip("nm-mv-worker") == worker.private_ip


def test_host_behind_nat_joins_only_over_the_private_network(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A worker behind a NAT router: it can connect out, nothing can connect in. The
    program runs on the NAT's LAN (inside the router's namespace), as an operator there
    would, so it reaches the worker by SSH while the server cannot."""
    stack = _stack(lab, tmp_path_factory, "nm-nat-server")
    worker = lab.add_host(worker_spec("nm-nat-worker", behind_nat=True))
    lab.wait_ssh_ready([worker])
    assert worker.router_netns and worker.public_ip is None and worker.private_ip
    stack.stack.netns = worker.router_netns

    def config(**network: Any) -> dict[str, Any]:
        values = stack.config([worker], **network)
        # Its public face is the NAT's address; the program reaches it on the LAN.
        values["workers"][0].update(address=worker.egress_ip, ssh_address=worker.ssh_ip)
        return values

    stack.stack.write_config(config(mode="public"))
    message = stack.up_fails()
    assert (
        f"nm-nat-worker: its address {worker.egress_ip} is on none of its interfaces" in message
        and f"the server nm-nat-server cannot connect to it at {worker.egress_ip}:22" in message
        and "is behind NAT" in message
    ), message[-4000:]
    for host in (stack.server, worker):
        assert host.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0

    # With the private network it shares with the server, auto joins it there.
    stack.stack.write_config(config())
    result = stack.up()
    nodes = {node["name"]: node for node in result.outputs["nodes"].value}
    assert nodes["nm-nat-worker"]["network_mode"] == "private"
    assert stack.internal_ip("nm-nat-worker") == worker.private_ip


def test_recorded_private_addresses_are_reused_when_routes_reach_them(
    lab: Lab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The hosts' private NICs sit in different subnets (no shared network found), but each
    holds a recorded private address on another interface and routes the other's through
    its private NIC: that path is checked (routing, both connections, overlap) and used."""
    stack = _stack(lab, tmp_path_factory, "nm-rec-server", private_cidr="10.50.1.0/24")
    worker = lab.add_host(worker_spec("nm-rec-worker", private_cidr="10.50.2.0/24"))
    lab.wait_ssh_ready([worker])
    server = stack.server
    assert server.private_ip and worker.private_ip
    recorded = {server.name: "172.30.1.2", worker.name: "172.30.2.3"}
    for host, peer in ((server, worker), (worker, server)):
        # A routed address on an interface of its own (the lab kernel has no dummy driver: a veth pair).
        host.run(["ip", "link", "add", "hk3s-rec", "type", "veth", "peer", "name", "hk3s-rec-end"])
        host.run(["ip", "link", "set", "hk3s-rec-end", "up"])
        host.run(["ip", "link", "set", "hk3s-rec", "up"])
        host.run(["ip", "addr", "add", f"{recorded[host.name]}/32", "dev", "hk3s-rec"])
        via = ["via", peer.private_ip or "", "dev", "enp7s0", "onlink", "src", recorded[host.name]]
        host.run(["ip", "route", "add", f"{recorded[peer.name]}/32", *via])
    config = stack.config([worker])
    config["server"]["private_address"] = recorded[server.name]
    config["workers"][0]["private_address"] = recorded[worker.name]
    stack.stack.write_config(config)
    result = stack.up()
    nodes = {node["name"]: node for node in result.outputs["nodes"].value}
    assert nodes["nm-rec-worker"]["network_mode"] == "private"
    assert stack.internal_ip("nm-rec-worker") == recorded[worker.name]
    assert stack.internal_ip("nm-rec-server") == recorded[server.name]
    assert "network mode private over 172.30.1.2/32" in stack.stack.text()


def test_host_behind_a_one_to_one_nat_joins_in_public_mode(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A cloud's 1:1 NAT: the worker's public address is on none of its interfaces, but
    connections to it are forwarded. It joins in public mode with k3s bound to its own
    address, the public one as its external IP, and flannel on external addresses."""
    stack = _stack(lab, tmp_path_factory, "nm-1to1-server")
    worker = lab.add_host(worker_spec("nm-1to1-worker", behind_nat=True, nat_inbound=True, private_nic=False))
    lab.wait_ssh_ready([worker])
    assert worker.nat_inner_ip and worker.public_ip is None
    values = stack.config([worker])
    values["workers"][0]["address"] = worker.egress_ip
    stack.stack.write_config(values)
    result = stack.up()
    nodes = {node["name"]: node for node in result.outputs["nodes"].value}
    assert nodes["nm-1to1-worker"]["network_mode"] == "public" and nodes["nm-1to1-worker"]["state"] == "ready"
    node = json.loads(stack.server.run([K3S, "kubectl", "get", "node", "nm-1to1-worker", "-o", "json"]).stdout)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == worker.nat_inner_ip and addresses["ExternalIP"] == worker.egress_ip
    server_config = stack.server.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout
    assert "flannel-external-ip: true" in server_config
    agent_config = worker.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout
    assert f"node-ip: {worker.nat_inner_ip}" in agent_config and f"node-external-ip: {worker.egress_ip}" in agent_config
