"""Removing a worker by dropping it from the stack, through the real Pulumi engine on booted lab
hosts whose nftables firewalls the program manages; ports are probed for real between hosts.

- A worker that does not answer is refused at `preview` and by `up` before any firewall changed.
- A worker that answers is drained, wiped and deregistered by the worker roster before any
  peer's firewall drops it (the engine's own event order shows it); afterwards the peers'
  ports are closed to it.
- A removal SIGKILLed halfway is finished by the next `up`; removing it again changes nothing.
- A host that also runs another container engine (a containerd of its own, a shim under
  /usr/bin and its container) keeps it through the wipe, and through a fence, which stops k3s's
  own shim and container beside it and then finds nothing of k3s left.
- The removed worker's name holds no join permit any more: the removed host, let through the
  server's firewall as a firewall the operator runs might, starts an agent under that name with a
  live bootstrap token (one made for another node's join) and its Node is refused.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pulumi import automation as auto
from pulumi.automation import events as auto_events

from host_scripts import script_path
from lab import registration_attempts
from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.stack_harness import (
    LabStack,
    base_config,
    port_reachable,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    wait_until,
    worker_spec,
)
from node_operations.host_facts import parse_host_facts
from node_operations.preflight import container_engine_notice

pytestmark = pytest.mark.lab

K3S = "/usr/local/bin/k3s"


def node_names(server: Host) -> set[str]:
    out = server.run([K3S, "kubectl", "get", "nodes", "-o", "json"]).stdout
    return {item["metadata"]["name"] for item in json.loads(out)["items"]}


def ready(server: Host, name: str) -> bool:
    node = json.loads(server.run([K3S, "kubectl", "get", "node", name, "-o", "json"]).stdout)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


# Another container engine on a worker, as Docker or the host's own containerd runs it: a real
# containerd (the lab cache's) under /usr/bin, and a shim under /usr/bin whose container (a
# process in a PID namespace of its own) runs under it. Units of their own, so a kill of either
# shows as the unit no longer active.
FOREIGN_UNITS = ("foreign-containerd", "foreign-container")
FOREIGN_SHIM = "/usr/bin/containerd-shim-runc-v2"
# k3s's own shim path (k3s extracts its binaries under <data dir>/data/<hash>/bin).
K3S_SHIM = "/var/lib/rancher/k3s/data/lab/bin/containerd-shim-runc-v2"


def shim_with_container(unit: str, shim_path: str) -> list[str]:
    """A process that `ps` shows as the shim at `shim_path`, its container (sleep, in a PID
    namespace of its own) under it, in the unit `unit`."""
    container = f"exec -a {shim_path} unshare --pid --fork --kill-child sleep infinity"
    return ["systemd-run", f"--unit={unit}", "bash", "-c", container]


def start_foreign_engine(host: Host) -> None:
    shutil.copy(DEFAULT_CACHE_DIR / "bin" / "containerd", host.root / "usr/bin/containerd")
    state = ["--root", "/var/lib/foreign-containerd", "--state", "/run/foreign-containerd"]
    address = ["--address", "/run/foreign-containerd/containerd.sock"]
    host.run(["systemd-run", "--unit=foreign-containerd", "/usr/bin/containerd", *state, *address])
    host.run(shim_with_container("foreign-container", FOREIGN_SHIM))
    wait_until(f"the other container engine runs on {host.name}", lambda: foreign_engine_runs(host), 20)


def foreign_engine_runs(host: Host) -> bool:
    states = host.run(["systemctl", "is-active", *FOREIGN_UNITS], check=False).stdout.split()
    return states == ["active"] * len(FOREIGN_UNITS)


@dataclass
class Cluster:
    lab: Lab
    stack: LabStack
    server: Host
    w1: Host
    w2: Host

    def config(self, workers: list[Host]) -> dict[str, object]:
        """rm-worker-2 is an existing host in the pool `edge`: removing a pool's member is the
        same removal."""
        config = base_config(self.lab, self.server, workers, firewall={"managed": True})
        for entry in config["workers"]:
            if entry["name"] == "rm-worker-2":
                entry["pool"] = "edge"
        config["worker_pools"] = [{"name": "edge", "count": 0, "labels": {"pool": "edge"}}]
        return config

    def rules(self) -> dict[str, str]:
        return {
            host.name: host.run(["nft", "list", "table", "inet", "hk3s_node"]).stdout for host in (self.server, self.w1)
        }


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("rm-server"))
    w1, w2 = lab.add_host(worker_spec("rm-worker-1")), lab.add_host(worker_spec("rm-worker-2"))
    lab.wait_ssh_ready([server, w1, w2])
    cluster = Cluster(lab, LabStack(tmp_path_factory.mktemp("removal")), server, w1, w2)
    cluster.stack.write_config(cluster.config([w1, w2]))
    up_or_fail(cluster.stack)
    # Peers reach the kubelet and the API through the program's nftables rules.
    assert port_reachable(w1, w2, 10250) and port_reachable(server, w2, 10250) and port_reachable(w2, server, 6443)
    assert port_reachable(w2, w1, 10250)
    labels = json.loads(server.run([K3S, "kubectl", "get", "node", "rm-worker-2", "-o", "json"]).stdout)
    assert labels["metadata"]["labels"].get("pool") == "edge"
    yield cluster


def test_dropping_a_worker_that_does_not_answer_is_refused_before_any_firewall_changes(cluster: Cluster) -> None:
    rules_before = cluster.rules()
    cluster.w2.power_off()
    try:
        cluster.stack.write_config(cluster.config([cluster.w1]))
        with pytest.raises(auto.CommandError) as previewed:
            cluster.stack.preview()
        refusal = "rm-worker-2: removing the worker is refused: does not answer over SSH"
        assert refusal in str(previewed.value), str(previewed.value)[-3000:]
        assert "fence it first (hk3s:fences.rm-worker-2)" in str(previewed.value)
        cluster.stack.log.clear()
        with pytest.raises(auto.CommandError) as refused:
            cluster.stack.up()
        assert refusal in str(refused.value) + cluster.stack.text()
        # Nothing of the run started: no firewall was touched, the worker is still a peer everywhere.
        assert cluster.rules() == rules_before
        assert "rm-worker-2" in node_names(cluster.server)
        cluster.w2.power_on(wait=True)
        # Back on, it is still a peer everywhere: the ports are open to it for real.
        assert port_reachable(cluster.w2, cluster.server, 6443) and port_reachable(cluster.w2, cluster.w1, 10250)
    finally:
        cluster.stack.write_config(cluster.config([cluster.w1, cluster.w2]))
        cluster.w2.power_on(wait=True)


def test_a_removal_killed_halfway_is_finished_by_the_next_up_before_the_peers_drop_it(cluster: Cluster) -> None:
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    start_foreign_engine(w2)
    cluster.stack.write_config(cluster.config([w1]))
    # SIGKILL in the middle of the removal: the host is being wiped.
    killed = cluster.stack.hk3s("up", "--yes", kill_when="wiping k3s, its data")
    assert killed.killed, (killed.stderr or killed.output)[-3000:]
    # The peers still admit it: the firewalls wait for the removal.
    assert port_reachable(w2, server, 6443) or port_reachable(w2, w1, 10250)

    # The operator API's up clears what the killed run left (its lock, its pending operation).
    events: list[auto_events.EngineEvent] = []
    lines: list[str] = []
    cluster.stack.api().up(on_event=events.append, on_output=lines.append)
    text = "\n".join(lines)
    assert "[rm-worker-2] removed:" in text, text[-3000:]

    # The engine's order: the roster's update (the removal) finished before any host firewall changed.
    def index(predicate: object) -> list[int]:
        return [i for i, event in enumerate(events) if predicate(event)]  # type: ignore[operator]

    roster_done = index(
        lambda e: e.res_outputs_event is not None and e.res_outputs_event.metadata.urn.endswith("::workers")
    )
    firewall_updates = index(
        lambda e: (
            e.resource_pre_event is not None
            and e.resource_pre_event.metadata.type.endswith(":HostFirewall")
            and str(e.resource_pre_event.metadata.op) in ("OpType.UPDATE", "update")
        )
    )
    assert roster_done and firewall_updates, (roster_done, firewall_updates)
    assert roster_done[0] < min(firewall_updates), (roster_done, firewall_updates)

    # Gone: no Node, no k3s on the host, no firewall of the program's there; the peers closed to it.
    assert "rm-worker-2" not in node_names(server)
    assert w2.run(["test", "-e", "/var/lib/rancher/k3s"], check=False).returncode != 0
    assert w2.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() != "active"
    assert w2.run(["nft", "list", "table", "inet", "hk3s_node"], check=False).returncode != 0
    assert not port_reachable(w2, server, 6443) and not port_reachable(w2, w1, 10250)
    assert port_reachable(w1, server, 6443) and port_reachable(server, w1, 10250)
    assert ready(server, "rm-worker-1")
    # The wipes (the killed one and the one that finished) stopped k3s's alone: the host's other
    # container engine, its shim and its container run on.
    assert foreign_engine_runs(w2), w2.run(["systemctl", "status", "--no-pager", *FOREIGN_UNITS], check=False).stdout

    # Removing it again is a no-op: nothing to change.
    again = cluster.stack.api().up()
    assert set(again.summary) <= {"same"}, again.summary


def test_a_fence_stops_k3s_containers_and_leaves_another_engines(cluster: Cluster) -> None:
    """The fence's host script (k3s_fence.sh, as a fence runs it over SSH) on a host running
    another container engine beside k3s: k3s's shim (under its data dir) and its container are
    killed, the other engine's containerd, shim and container are not, and the fence's check of
    what is left finds nothing of k3s (another engine's processes are not k3s's)."""
    w2 = cluster.w2
    if not foreign_engine_runs(w2):  # started by the test before this one, unless run alone
        start_foreign_engine(w2)
    # The host's facts, as a join's preflight reads them, name the other engine, and the join says
    # what a fence will and will not stop there.
    (w2.root / "root/host_facts.sh").write_text(script_path("host_facts.sh").read_text())
    facts = parse_host_facts(w2.name, w2.run(["bash", "/root/host_facts.sh"]).stdout)
    assert facts.container_engines == ["/usr/bin/containerd"], facts.container_engines
    notice = container_engine_notice(w2.name, facts)
    assert notice is not None and "does not stop that engine or its containers" in notice, notice
    w2.run(["mkdir", "-p", K3S_SHIM.rsplit("/", 1)[0]])
    w2.run(shim_with_container("k3s-container", K3S_SHIM))
    wait_until("k3s's shim runs", lambda: w2.run(["pgrep", "-f", K3S_SHIM], check=False).returncode == 0, 20)
    (w2.root / "root/k3s_fence.sh").write_text(script_path("k3s_fence.sh").read_text())
    try:
        fenced = w2.run(["bash", "/root/k3s_fence.sh"], timeout=120)
        assert "result left \n" in fenced.stdout, fenced.stdout + fenced.stderr
        assert w2.run(["pgrep", "-f", K3S_SHIM], check=False).returncode != 0, "k3s's shim outlived the fence"
        assert w2.run(["systemctl", "is-active", "k3s-container"], check=False).stdout.strip() != "active"
        assert foreign_engine_runs(w2), w2.run(["systemctl", "status", "--no-pager", *FOREIGN_UNITS], check=False)
    finally:
        # SIGKILL: unshare --fork ignores SIGTERM, and a PID namespace's first process has no
        # default action for it, so a plain stop would wait out the unit's stop timeout.
        w2.run(["systemctl", "kill", "--signal=SIGKILL", "k3s-container", *FOREIGN_UNITS], check=False)
        w2.run(["systemctl", "reset-failed", "k3s-container", *FOREIGN_UNITS], check=False)
        w2.run(["rm", "-rf", "/var/lib/rancher/k3s/data/lab", "/etc/systemd/system/k3s-agent.service.d"])
        w2.run(["systemctl", "daemon-reload"])


def test_a_removed_workers_name_takes_no_registration_with_a_live_token(cluster: Cluster) -> None:
    """Any live bootstrap token gets its agent a kubelet certificate for whatever name it asks
    (k3s binds a token to no name); the join permit is what ties a registration to the join of
    that name. The removal revoked rm-worker-2's, so an agent under that name is refused."""
    server, w2 = cluster.server, cluster.w2
    assert "rm-worker-2" not in node_names(server)  # removed by the test before this one
    # A join of another node is under way: its token is live for ten minutes.
    token = registration_attempts.live_token(server, "rm-worker-3")
    with registration_attempts.admitted_to_api(server, w2):
        since = registration_attempts.start_agent(cluster.lab, w2, server, token, "rm-worker-2")
        try:
            wait_until(
                "the Node rm-worker-2 refused by the join-permit admission",
                lambda: registration_attempts.refusal("rm-worker-2") in registration_attempts.agent_log(w2, since),
                90,
                lambda: registration_attempts.agent_log(w2, since)[-3000:] + "\n" + str(node_names(server)),
            )
            assert not registration_attempts.node_exists(server, "rm-worker-2")
        finally:
            w2.run(["systemctl", "stop", "k3s-agent"], check=False)
    assert not registration_attempts.node_exists(server, "rm-worker-2")
    assert "rm-worker-2" not in registration_attempts.permits(server)
