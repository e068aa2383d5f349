"""A worker's copies through its life after the join, through the real engine, the real
Kubernetes provider plugin and the lab's Longhorn manager stand-in (lab/longhorn_standin/manager.py:
Longhorn nodes with the hosts' real disk figures, replicas placed, rebuilt and evicted as Longhorn's
scheduler does). The tests share one cluster (a server and two workers; the last two tests add a third)
and run in order.

- Reboot: a volume pinned to the server whose only copy sits on the worker is refused while the
  server has no room for it, naming the volume and the space; with room, its copy moves to the
  server (a second copy made there and healthy first) before the worker goes down.
- Remove: a copy that has nowhere to go (its volume's node tags match only the leaving worker)
  refuses the removal before anything changes, naming the volume; once that volume is gone, the
  removal asks Longhorn to evict the worker's copies, waits until each one is healthy on another
  node and the old one is gone, then drains, wipes and deregisters the worker.
- Add: a third worker added to the config, a plain `pulumi preview` (what `pulumi up` runs first)
  plans it: the providers' checks let through what the run has yet to decide (its disk verdict).
- Give up: the third worker joins, goes down, is fenced as powered off; back on with its agent
  running, `node remove --force` is refused and nothing changes; off again, it is given up: no
  Node, no Longhorn node, and no peer's host firewall (the program's nftables rules, read on each
  peer before and after) admits its address any more; the next `up` has nothing to do. Its name is
  unusable until it joins again: let through the server's firewall (as one the operator runs might),
  the host powered back on is refused its Node with the kubelet credentials it kept, and so is an
  agent there under that name with a live bootstrap token.
The volumes are made as Longhorn's API makes them (volumes.longhorn.io objects, as the CSI driver
would for a claim; attached by setting spec.nodeID, as Longhorn's attachment controller does); the
operator's Longhorn node tags and scheduling flags are set with kubectl, as in Longhorn's UI."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from lab import registration_attempts
from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    LabStack,
    base_config,
    port_reachable,
    run_cli,
    server_spec,
    skip_without_kubernetes_provider,
    up_or_fail,
    wait_until,
    worker_spec,
)
from operator_api import MaintenanceError

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"
GIB = 1024**3
# The lab's disks are this machine's, often fuller than Longhorn's defaults allow a copy on
# (25 % kept available): shares low enough that a 1 GiB copy fits, as an operator would set them.
STORAGE = {
    "install_longhorn": True,
    "longhorn_chart": str(LONGHORN_STANDIN_CHART),
    "reserved_percent": 5,
    "minimal_available_percent": 5,
}


def kubectl(server: Host, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return server.run([K3S, "kubectl", "-n", "longhorn-system", *args], check=check)


def items(server: Host, kind: str) -> list[dict[str, Any]]:
    return list(json.loads(kubectl(server, "get", kind, "-o", "json").stdout)["items"])


def patch(server: Host, kind: str, name: str, body: dict[str, Any]) -> None:
    kubectl(server, "patch", kind, name, "--type", "merge", "-p", json.dumps(body))


def make_volume(server: Host, name: str, replicas: int, node_selector: list[str] | None = None) -> None:
    manifest = {
        "apiVersion": "longhorn.io/v1beta2",
        "kind": "Volume",
        "metadata": {"name": name, "namespace": "longhorn-system"},
        "spec": {"numberOfReplicas": replicas, "size": str(GIB), "nodeSelector": node_selector or []},
    }
    (server.root / f"root/{name}.json").write_text(json.dumps(manifest))
    server.run([K3S, "kubectl", "apply", "-f", f"/root/{name}.json"])


def healthy_replicas(server: Host, name: str) -> dict[str, str]:
    """The volume's healthy replicas: replica name -> node."""
    return {
        r["metadata"]["name"]: r["spec"].get("nodeID", "")
        for r in items(server, "replicas.longhorn.io")
        if r["spec"].get("volumeName") == name and r["spec"].get("healthyAt") and not r["spec"].get("failedAt")
    }


@dataclass
class Cluster:
    lab: Lab
    stack: LabStack
    server: Host
    w1: Host
    w2: Host

    def diagnose(self) -> str:
        kinds = "nodes.longhorn.io,volumes.longhorn.io,replicas.longhorn.io"
        return kubectl(self.server, "get", kinds, "-o", "wide").stdout + self.stack.text()[-3000:]

    def only_scheduling_on(self, node: str, tags: dict[str, list[str]] | None = None) -> None:
        for name in (self.server.name, self.w1.name, self.w2.name):
            body: dict[str, Any] = {"spec": {"allowScheduling": name == node}}
            if tags and name in tags:
                body["spec"]["tags"] = tags[name]
            patch(self.server, "nodes.longhorn.io", name, body)


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_kubernetes_provider()
    server = lab.add_host(server_spec("rc-server"))
    w1, w2 = lab.add_host(worker_spec("rc-worker-1")), lab.add_host(worker_spec("rc-worker-2"))
    lab.wait_ssh_ready([server, w1, w2])
    stack = LabStack(tmp_path_factory.mktemp("copies"))
    stack.write_config(base_config(lab, server, [w1, w2], storage=STORAGE, firewall={"managed": True}))
    up_or_fail(stack)
    cluster = Cluster(lab, stack, server, w1, w2)
    names = {server.name, w1.name, w2.name}
    wait_until(
        "a Longhorn node per node",
        lambda: {n["metadata"]["name"] for n in items(server, "nodes.longhorn.io")} == names,
        120,
        cluster.diagnose,
    )
    yield cluster


def test_a_reboot_moves_a_copy_pinned_to_the_server_there_first(cluster: Cluster) -> None:
    server, w1 = cluster.server, cluster.w1
    # "db" asks for the server (its selector) but its copy lands on rc-worker-1, as one made while
    # the worker carried the server's tag would: Longhorn never moves a placed copy by itself.
    cluster.only_scheduling_on(w1.name, tags={w1.name: ["hk3s-server"]})
    make_volume(server, "db", 1, ["hk3s-server"])
    wait_until(
        "db's copy on rc-worker-1",
        lambda: list(healthy_replicas(server, "db").values()) == [w1.name],
        60,
        cluster.diagnose,
    )
    patch(server, "volumes.longhorn.io", "db", {"spec": {"nodeID": w1.name}})  # attached where its pod runs
    wait_until(
        "db attached",
        lambda: (
            json.loads(kubectl(server, "get", "volumes.longhorn.io", "db", "-o", "json").stdout)["status"].get("state")
            == "attached"
        ),
        60,
        cluster.diagnose,
    )
    patch(server, "nodes.longhorn.io", w1.name, {"spec": {"tags": []}})
    patch(server, "nodes.longhorn.io", server.name, {"spec": {"allowScheduling": True, "tags": ["hk3s-server"]}})
    for name in (cluster.w2.name,):
        patch(server, "nodes.longhorn.io", name, {"spec": {"allowScheduling": True}})

    # status --check names the single copy on a worker.
    warnings = cluster.stack.api().status(check_hosts=True).warnings
    single = f"{server.name}: volume db keeps its only copy on worker {w1.name}: losing that worker loses it"
    assert any(w.startswith(single) for w in warnings), warnings

    # No room on the server (all of its disk reserved): refused, naming the volume and the space.
    disk_name, disk = next(iter(items_of(server, server.name)["spec"]["disks"].items()))
    maximum = items_of(server, server.name)["status"]["diskStatus"][disk_name]["storageMaximum"]
    patch(
        server, "nodes.longhorn.io", server.name, {"spec": {"disks": {disk_name: {**disk, "storageReserved": maximum}}}}
    )
    wait_until(
        "the server's disk full by its reserve",
        lambda: items_of(server, server.name)["spec"]["disks"][disk_name]["storageReserved"] == maximum,
        30,
    )
    with pytest.raises(MaintenanceError) as refused:
        cluster.stack.api().reboot_worker(w1.name)
    message = str(refused.value)
    assert (
        refused.value.put_back and "reboot refused: the only copy of db (1.0 GiB), pinned to the server" in message
    ), message
    assert f"free 1.0 GiB on {server.name}'s Longhorn disk" in message, message
    assert list(healthy_replicas(server, "db").values()) == [w1.name]
    unschedulable = json.loads(server.run([K3S, "kubectl", "get", "node", w1.name, "-o", "json"]).stdout)["spec"]
    assert not unschedulable.get("unschedulable")  # not cordoned: nothing changed
    patch(server, "nodes.longhorn.io", server.name, {"spec": {"disks": {disk_name: disk}}})

    # With room: the copy moves to the server before the worker goes down.
    lines: list[str] = []
    report = cluster.stack.api().reboot_worker(w1.name, on_output=lines.append)
    text = "\n".join(lines)
    assert "moving the copy of db (1.0 GiB) to rc-server first" in text and "moved to rc-server: db" in text, text
    moved_at = next(i for i, line in enumerate(lines) if "moved to rc-server: db" in line)
    assert not [line for line in lines[:moved_at] if "drain" in line or "cordon" in line], text
    assert list(healthy_replicas(server, "db").values()) == [server.name], cluster.diagnose()
    db = json.loads(kubectl(server, "get", "volumes.longhorn.io", "db", "-o", "json").stdout)
    assert db["spec"]["numberOfReplicas"] == 1 and "hk3s.dev/moving-to-server" not in (
        db["metadata"].get("annotations") or {}
    )
    assert not report.not_ready, report
    assert not [w for w in cluster.stack.api().status(check_hosts=True).warnings if "volume db keeps" in w]
    patch(server, "volumes.longhorn.io", "db", {"spec": {"nodeID": ""}})


def items_of(server: Host, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl(server, "get", "nodes.longhorn.io", name, "-o", "json").stdout))


def test_a_worker_whose_copies_cannot_move_is_refused_then_its_copies_move_off(cluster: Cluster) -> None:
    lab, stack, server, w1, w2 = cluster.lab, cluster.stack, cluster.server, cluster.w1, cluster.w2
    # Only rc-worker-2 takes copies while the volumes are made, so both land there.
    cluster.only_scheduling_on(w2.name, tags={w2.name: ["only-here"]})
    make_volume(server, "data-1", 1)
    make_volume(server, "pinned", 1, ["only-here"])
    for name in ("data-1", "pinned"):
        wait_until(
            f"{name}'s copy healthy on {w2.name}",
            lambda n=name: list(healthy_replicas(server, n).values()) == [w2.name],  # type: ignore[misc]
            60,
            cluster.diagnose,
        )
    for other in (server.name, w1.name):
        patch(server, "nodes.longhorn.io", other, {"spec": {"allowScheduling": True}})

    # "pinned" can go nowhere else (no other node has its tag): refused, nothing changed.
    stack.write_config(base_config(lab, server, [w1], storage=STORAGE, firewall={"managed": True}))
    stack.log.clear()
    with pytest.raises(auto.CommandError):
        stack.up()
    text = stack.text()
    assert f"{w2.name}: its copies cannot move" in text and "pinned" in text, text[-4000:]
    assert "data-1" not in text.split("its copies cannot move", 1)[1].split("\n", 1)[0], text[-4000:]
    longhorn_w2 = json.loads(kubectl(server, "get", "nodes.longhorn.io", w2.name, "-o", "json").stdout)
    assert longhorn_w2["spec"]["allowScheduling"] is True and not longhorn_w2["spec"].get("evictionRequested")
    assert w2.name in server.run([K3S, "kubectl", "get", "nodes", "-o", "name"]).stdout

    # The operator lets "pinned" go; the removal then moves data-1's copy off before the wipe.
    kubectl(server, "delete", "volumes.longhorn.io", "pinned")
    for replica in [
        r["metadata"]["name"] for r in items(server, "replicas.longhorn.io") if r["spec"].get("volumeName") == "pinned"
    ]:
        kubectl(server, "delete", "replicas.longhorn.io", replica, check=False)
    stack.log.clear()
    started = time.monotonic()
    up_or_fail(stack)
    took = time.monotonic() - started
    text = stack.text()
    assert f"[{w2.name}] removed: 1 copies moved off" in text, text[-4000:]
    moved = healthy_replicas(server, "data-1")
    assert len(moved) == 1 and set(moved.values()) <= {server.name, w1.name}, (moved, cluster.diagnose())
    assert not [r for r in items(server, "replicas.longhorn.io") if r["spec"].get("nodeID") == w2.name]
    assert w2.name not in {n["metadata"]["name"] for n in items(server, "nodes.longhorn.io")}
    assert w2.name not in server.run([K3S, "kubectl", "get", "nodes", "-o", "name"]).stdout
    assert w2.run(["test", "-e", "/var/lib/rancher/k3s"], check=False).returncode != 0
    # The peers' firewalls (the program's nftables rules) no longer admit it: real dials.
    assert not port_reachable(w2, server, 6443) and not port_reachable(w2, w1, 10250)
    assert port_reachable(w1, server, 6443)  # the worker staying still reaches the API
    print(f"removal with one copy moved: {took:.1f} s")


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def nft_networks(value: Any) -> list[Network]:
    """The addresses an nft JSON value names (an address, a prefix, a range, a set of them, a
    set element)."""
    if isinstance(value, str):
        return [ipaddress.ip_network(value, strict=False)]
    if isinstance(value, list):
        return [network for item in value for network in nft_networks(item)]
    if "elem" in value:
        return nft_networks(value["elem"]["val"])
    if "set" in value:
        return nft_networks(value["set"])
    if "prefix" in value:
        return [ipaddress.ip_network(f"{value['prefix']['addr']}/{value['prefix']['len']}", strict=False)]
    if "range" in value:
        first, last = (ipaddress.ip_address(end) for end in value["range"])
        return list(ipaddress.summarize_address_range(first, last))
    raise AssertionError(f"an address value this test does not read: {value!r}")


def admitted_sources(host: Host) -> list[Network]:
    """Every source network an accept rule on `host` admits by its source address, from
    `nft -j list ruleset` (the whole ruleset, whatever wrote it): a rule's `saddr` match against
    a named set or a literal."""
    ruleset = json.loads(host.run(["nft", "-j", "list", "ruleset"]).stdout)["nftables"]
    sets = {(s["family"], s["table"], s["name"]): s.get("elem", []) for s in (i["set"] for i in ruleset if "set" in i)}
    admitted: list[Network] = []
    for rule in (item["rule"] for item in ruleset if "rule" in item):
        if not any("accept" in expr for expr in rule["expr"]):
            continue
        for expr in rule["expr"]:
            match = expr.get("match") or {}
            if (match.get("left") or {}).get("payload", {}).get("field") != "saddr" or match["op"] not in ("==", "in"):
                continue
            right = match["right"]
            named = isinstance(right, str) and right.startswith("@")
            admitted += nft_networks(sets[(rule["family"], rule["table"], right[1:])] if named else right)
    return admitted


def admits(host: Host, worker: Host) -> set[str]:
    """Which of `worker`'s addresses an accept rule on `host` admits."""
    sources = admitted_sources(host)
    addresses = [address for address in (worker.public_ip, worker.private_ip) if address]
    return {a for a in addresses if any(ipaddress.ip_address(a) in network for network in sources)}


def staying_workers(cluster: Cluster) -> list[Host]:
    """The first two workers still in the cluster (rc-worker-2 is gone once the removal's test ran)."""
    names = cluster.server.run([K3S, "kubectl", "get", "nodes", "-o", "name"]).stdout.split()
    return [w for w in (cluster.w1, cluster.w2) if f"node/{w.name}" in names]


def third_worker(lab: Lab) -> Host:
    """rc-worker-3, booted once for the tests that add it to the stack."""
    if "rc-worker-3" not in lab.hosts:
        lab.wait_ssh_ready([lab.add_host(worker_spec("rc-worker-3"))])
    return lab.hosts["rc-worker-3"]


def test_a_plain_preview_of_a_worker_added_to_a_longhorn_stack_succeeds(cluster: Cluster) -> None:
    """`pulumi preview`, as the README has a person run it (and as `pulumi up` runs first), after a
    worker is added to the config of a running stack with Longhorn. Its disk probe has not run, so
    its Longhorn node role's `holds_copies` (the probe's verdict) and everything else taken from
    resources the run creates are unknown to the providers' checks: they must pass."""
    w3 = third_worker(cluster.lab)
    stack = cluster.stack
    stack.write_config(
        base_config(
            cluster.lab, cluster.server, [*staying_workers(cluster), w3], storage=STORAGE, firewall={"managed": True}
        )
    )
    run = run_cli(stack, ["preview"], timeout=600)
    assert run.returncode == 0, run.output[-6000:]
    assert "has a problem" not in run.output, run.output[-6000:]
    # The plan adds the worker, its Longhorn node role included.
    planned = [line for line in run.output.splitlines() if f"{w3.name}-longhorn-role" in line]
    assert any("create" in line for line in planned), run.output[-6000:]
    # A preview changes nothing: the worker has not joined.
    assert f"node/{w3.name}" not in cluster.server.run([K3S, "kubectl", "get", "nodes", "-o", "name"]).stdout.split()


def test_a_fenced_worker_given_up_leaves_no_node_longhorn_node_or_firewall_peer(cluster: Cluster) -> None:
    """`node remove --force` of a fenced worker in a stack with Longhorn and managed host
    firewalls: refused while its host answers and runs its agent (nothing changes: its Node and
    Longhorn node stay, every peer still admits it); once it is off, its Node and Longhorn node are
    gone and no staying peer's firewall admits its address; the next `up` has nothing to do."""
    lab, stack, server = cluster.lab, cluster.stack, cluster.server
    staying = staying_workers(cluster)
    w3 = third_worker(lab)
    stack.write_config(base_config(lab, server, [*staying, w3], storage=STORAGE, firewall={"managed": True}))
    stack.log.clear()
    up_or_fail(stack)

    def longhorn_nodes() -> set[str]:
        return {n["metadata"]["name"] for n in items(server, "nodes.longhorn.io")}

    def kube_nodes() -> set[str]:
        return {
            n.removeprefix("node/") for n in server.run([K3S, "kubectl", "get", "nodes", "-o", "name"]).stdout.split()
        }

    def ready() -> str:
        found = json.loads(server.run([K3S, "kubectl", "get", "node", w3.name, "-o", "json"]).stdout)
        return str(next(c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready"))

    wait_until(f"a Longhorn node for {w3.name}", lambda: w3.name in longhorn_nodes(), 120, cluster.diagnose)
    peers = [server, *staying]
    # Every peer admits it: the same reading after the removal can fail.
    assert {p.name: admits(p, w3) for p in peers} == {p.name: {w3.public_ip} for p in peers}

    # Down for the minute a fence asks for, then off: fenced as powered off.
    w3.run(["systemctl", "stop", "k3s-agent"])
    wait_until(f"{w3.name} NotReady", lambda: ready() != "True", 90, cluster.diagnose)
    down_since = time.monotonic()
    w3.power_off()
    time.sleep(max(0.0, 62 - (time.monotonic() - down_since)))
    fence = stack.hk3s("node", "fence", w3.name, "--powered-off")
    assert fence.returncode == 0, fence.stderr[-4000:]
    assert f"[{w3.name}] fenced (recorded" in fence.stderr, fence.stderr[-4000:]

    # Back on, its agent runs: the fence does not hold it, so it is not given up; nothing changes.
    w3.power_on(wait=True)
    wait_until(
        f"{w3.name}'s agent running",
        lambda: w3.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() == "active",
        60,
    )
    rules = {p.name: p.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout for p in peers}
    refused = stack.hk3s("node", "remove", w3.name, "--force", "--yes")
    assert refused.returncode == 3, refused.stderr[-4000:]
    assert "the fence does not hold it stopped (drop-in=absent, agent=active)" in refused.stderr, refused.stderr[-4000:]
    assert w3.name in kube_nodes() and w3.name in longhorn_nodes()
    assert {p.name: p.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout for p in peers} == rules

    # Off again: given up without a drain, once its Node is NotReady (a give-up checks the host as it
    # is now: a Node posting Ready runs).
    w3.power_off()
    wait_until(f"{w3.name} NotReady", lambda: ready() != "True", 90, cluster.diagnose)
    run = stack.hk3s("node", "remove", w3.name, "--force", "--yes")
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"[{w3.name}] given up (fenced since" in run.stderr, run.stderr[-4000:]
    assert w3.name not in kube_nodes()
    assert w3.name not in longhorn_nodes(), cluster.diagnose()
    secrets = server.run([K3S, "kubectl", "get", "secrets", "-n", "kube-system", "-o", "name"]).stdout
    assert f"{w3.name}.node-password.k3s" not in secrets
    # No staying peer's firewall admits it any more; the staying nodes still admit each other.
    assert {p.name: admits(p, w3) for p in peers} == {p.name: set() for p in peers}
    for peer in peers:
        for other in peers:
            if other is not peer:
                assert other.public_ip in admits(peer, other), (peer.name, other.name)
    # Done is done: the next up changes nothing.
    result = up_or_fail(stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert set(changes) == {"same"}, changes

    # Its name is unusable until it joins again, wherever a firewall still lets the host in.
    def node_refused(since: str) -> None:
        wait_until(
            f"the Node {w3.name} refused by the join-permit admission",
            lambda: registration_attempts.refusal(w3.name) in registration_attempts.agent_log(w3, since),
            90,
            lambda: registration_attempts.agent_log(w3, since)[-3000:] + "\n" + str(kube_nodes()),
        )
        assert w3.name not in kube_nodes()

    with registration_attempts.admitted_to_api(server, w3):
        try:
            # Powered back on (the fence confirmed it off, so no drop-in holds its agent): the agent
            # starts with the certificates it kept. k3s's supervisor refuses a node certificate
            # whose Node was deleted (401, pkg/nodepassword verifyNode), and the agent's retry with
            # its token alone fails too (its one-time token was spent at its join): the agent never
            # gets its node certificates, so it never starts a kubelet that would register the name.
            since = server.run(["date", "+%Y-%m-%d %H:%M:%S"]).stdout.strip()  # one clock for all lab hosts
            w3.power_on(wait=True)
            wait_until(
                f"{w3.name}'s agent refused by the supervisor",
                lambda: "Node authorization rejected" in registration_attempts.agent_log(w3, since),
                90,
                lambda: registration_attempts.agent_log(w3, since)[-3000:],
            )
            assert w3.name not in kube_nodes()
            # The kubelet credentials the host kept are valid for the API server itself for a year:
            # used straight to create its Node (what a kubelet still running would do), the
            # join-permit admission refuses them.
            agent = "/var/lib/rancher/k3s/agent"
            kubeconfig = yaml.safe_load(w3.run(["cat", f"{agent}/kubelet.kubeconfig"]).stdout)
            api = kubeconfig["clusters"][0]["cluster"]["server"]
            node = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": w3.name}})
            created = w3.run(
                [
                    "curl", "-sS", "--max-time", "30",
                    "--cacert", f"{agent}/server-ca.crt",
                    "--cert", f"{agent}/client-kubelet.crt", "--key", f"{agent}/client-kubelet.key",
                    "-H", "Content-Type: application/json", "-X", "POST", "--data", node,
                    "-w", "\nHTTP %{http_code}", f"{api}/api/v1/nodes",
                ],
                check=False,
            )  # fmt: skip
            assert created.returncode == 0, created.stderr[-3000:]
            assert "HTTP 201" not in created.stdout, created.stdout[-3000:]
            assert registration_attempts.refusal(w3.name) in created.stdout, created.stdout[-3000:]
            assert w3.name not in kube_nodes()
            # A live bootstrap token (a join of another node is under way) and no certificate kept.
            w3.run(["systemctl", "stop", "k3s-agent"])
            w3.run(["rm", "-rf", "/var/lib/rancher/k3s/agent"])
            token = registration_attempts.live_token(server, "rc-worker-4")
            node_refused(registration_attempts.start_agent(lab, w3, server, token, w3.name))
        finally:
            w3.run(["systemctl", "stop", "k3s-agent"], check=False)
    assert w3.name not in kube_nodes() and w3.name not in registration_attempts.permits(server)
