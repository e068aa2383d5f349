"""Joining workers through the real Pulumi engine, on booted lab hosts, with the
k3s stand-in and a real Kubernetes API server. Nothing is mocked. The tests of
this module share one cluster and run in order."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.node_watch import NodeWatcher
from lab.stack_harness import (
    LabStack,
    base_config,
    k3s_release,
    run_cli,
    server_spec,
    skip_without_lab_binaries,
    worker_spec,
)
from tests.lab.agent_certificate import AGENT_DIR, expire_client_certificate

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"


@dataclass
class Cluster:
    lab: Lab
    server: Host
    w1: Host
    w2: Host
    w3: Host
    stack: LabStack
    # jn-worker-2 is an existing host in the pool "web", whose taints it takes.
    pool_taints: tuple[str, ...] = ("dedicated=web:NoSchedule",)
    registry: str | None = None
    # hk3s:cluster's k3s settings when a test moved the cluster to another stand-in release.
    release: dict[str, str] | None = None

    def config(self, workers: list[Host], labels: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
        config = base_config(self.lab, self.server, workers)
        config["cluster"].update(self.release or {})
        for worker in config["workers"]:
            worker["labels"] = (labels or {}).get(worker["name"], {})
            if worker["name"] == "jn-worker-2":
                worker["pool"] = "web"
        config["worker_pools"] = [{"name": "web", "count": 0, "taints": list(self.pool_taints)}]
        if self.registry is not None:
            config["cluster"]["registry"] = self.registry
        return config

    def taints(self, node: dict) -> set[str]:
        return {f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in node["spec"].get("taints", [])}

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.server.run([K3S, "kubectl", *args, "-o", "json"]).stdout)

    def node(self, name: str) -> dict:
        return self.kubectl_json("get", "node", name)

    def tokens(self) -> list[dict]:
        secrets = self.kubectl_json("get", "secrets", "-n", "kube-system")
        return [s for s in secrets["items"] if s.get("type") == "bootstrap.kubernetes.io/token"]

    def up(self) -> auto.UpResult:
        try:
            return self.stack.up()
        except auto.CommandError as error:
            pytest.fail(f"pulumi up failed:\n{self.stack.text()[-8000:]}\n{error}")


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("jn-server"))
    w1, w2 = lab.add_host(worker_spec("jn-worker-1")), lab.add_host(worker_spec("jn-worker-2"))
    # jn-worker-3 boots from the plain base: its join installs Longhorn's packages itself.
    w3 = lab.add_host(worker_spec("jn-worker-3", extra_packages=()))
    lab.wait_ssh_ready([server, w1, w2, w3])
    yield Cluster(lab, server, w1, w2, w3, LabStack(tmp_path_factory.mktemp("join-stack")))


def changes(summary: Any) -> dict[str, int]:
    """An engine change summary keyed by plain operation names."""
    return {str(getattr(op, "value", op)): count for op, count in (summary or {}).items()}


def ready(node: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_first_up_installs_the_server_and_joins_a_worker(cluster: Cluster) -> None:
    cluster.stack.write_config(cluster.config([cluster.w1], labels={"jn-worker-1": {"tier": "batch"}}))
    result = cluster.up()
    assert result.summary.result == "succeeded", cluster.stack.text()
    # Server outputs: version, CA hash (pinned by every token), kubeconfig as a secret.
    assert result.outputs["k3s_version"].value == base_config(cluster.lab, cluster.server, [])["cluster"]["k3s_version"]
    assert result.outputs["kubeconfig"].secret is True
    assert "certificate-authority-data" in result.outputs["kubeconfig"].value
    assert result.outputs["api_endpoint"].value == f"https://{cluster.server.public_ip}:6443"
    node = cluster.node("jn-worker-1")
    assert ready(node)
    labels = node["metadata"]["labels"]
    assert labels["node-role.kubernetes.io/worker"] == "true" and labels["tier"] == "batch"
    assert not [t for t in node["spec"].get("taints", []) if t["key"] == "hk3s.dev/validating"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == result.outputs["k3s_version"].value
    # Registered under the validation taint: the agent's config carried it.
    config_yaml = cluster.w1.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout
    assert "hk3s.dev/validating=true:NoSchedule" in config_yaml
    nodes = {n["name"]: n for n in result.outputs["nodes"].value}
    assert nodes["jn-worker-1"]["state"] == "ready" and nodes["jn-worker-1"]["network_mode"] == "public"
    # The join token: deleted in the cluster, never in the state. The host keeps it, dead, in a
    # root-only file its config names: every k3s agent start parses it (an empty one is refused)
    # and checks the CA hash in it.
    assert cluster.tokens() == []
    token_file = "/etc/rancher/k3s/hk3s-join-token"
    assert cluster.w1.run(["stat", "-c", "%a %U", token_file]).stdout.split() == ["600", "root"]
    # The CA hash in it is the cluster's (as in the server's own token file); the rest is not read.
    ca_hash = cluster.server.run(["cut", "-c4-67", "/var/lib/rancher/k3s/server/token"]).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", ca_hash)
    assert cluster.w1.run(["grep", "-c", f"^K10{ca_hash}::", token_file]).stdout.strip() == "1"
    assert f"token-file: {token_file}" in config_yaml
    state = "\n".join(p.read_text() for p in (cluster.stack.directory / "state").rglob("*.json"))
    # A k3s token is K10<CA hash>::<id>:<secret>; a bare "K10" also turns up in random base64 (host keys, ciphertext).
    assert not re.search(r"K10[0-9a-f]{64}::", state) and "BEGIN OPENSSH PRIVATE KEY" not in state
    assert "BEGIN OPENSSH PRIVATE KEY" not in cluster.stack.text()


def _host_snapshot(host: Host) -> str:
    script = (
        "sha256sum /etc/rancher/k3s/config.yaml /usr/local/bin/k3s 2>/dev/null; ls -l --time-style=full-iso "
        "/var/lib/hk3s/journal /etc/rancher/k3s 2>/dev/null; systemctl show k3s k3s-agent -p ActiveEnterTimestamp"
    )
    return host.run(["sh", "-c", script]).stdout


def test_preview_changes_nothing_on_any_host(cluster: Cluster) -> None:
    hosts = [cluster.server, cluster.w1, cluster.w2]
    before = [_host_snapshot(h) for h in hosts]
    nodes_before = cluster.kubectl_json("get", "nodes")["items"]
    # A cluster registry configured: every joined worker is checked against it again, in a
    # rejoin (any HTTPS server answering /v2/ passes the check: here the API server). A label
    # alone would not rejoin: labels and taints are set through the API.
    cluster.registry = f"{cluster.server.public_ip}:6443"
    cluster.stack.write_config(cluster.config([cluster.w1, cluster.w2], labels={"jn-worker-1": {"tier": "web"}}))
    preview = cluster.stack.preview()
    summary = changes(preview.change_summary)
    assert summary.get("create", 0) >= 2 and summary.get("update", 0) >= 1, summary
    assert [_host_snapshot(h) for h in hosts] == before
    nodes_after = cluster.kubectl_json("get", "nodes")["items"]
    assert {n["metadata"]["name"] for n in nodes_after} == {n["metadata"]["name"] for n in nodes_before}
    assert cluster.node("jn-worker-1")["metadata"]["labels"]["tier"] == "batch"
    assert cluster.tokens() == []


def test_rejoin_cordons_for_the_checks_and_leaves_pods(cluster: Cluster) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "keep-me", "namespace": "default"},
        "spec": {
            "nodeName": "jn-worker-1",
            "containers": [{"name": "c", "image": "registry.invalid/none"}],
        },
    }
    cluster.server.run(["sh", "-c", f'printf "%s" "$1" | {K3S} kubectl create -f -', "-", json.dumps(pod)])
    uid = cluster.kubectl_json("get", "pod", "keep-me")["metadata"]["uid"]
    # jn-worker-2 joins in this run, in the pool "web": every version of its Node the API's watch
    # delivers, from the first, carries the pool's taint (never schedulable for ordinary pods without it).
    with NodeWatcher(cluster.server) as watcher:
        result = cluster.up()  # config from the previous test: a registry (a rejoin), w1 relabelled, w2 added
    pool_node_seen = [cluster.taints(node) for node in watcher.seen("jn-worker-2")]
    assert result.summary.result == "succeeded"
    assert changes(result.summary.resource_changes).get("update", 0) >= 1
    assert watcher.cordoned("jn-worker-1"), "jn-worker-1 was never cordoned during its rejoin"
    node = cluster.node("jn-worker-1")
    assert not node["spec"].get("unschedulable") and node["metadata"]["labels"]["tier"] == "web"
    assert cluster.kubectl_json("get", "pod", "keep-me")["metadata"]["uid"] == uid
    assert ready(cluster.node("jn-worker-2"))
    assert pool_node_seen, "the watcher never saw jn-worker-2's Node"
    assert all("dedicated=web:NoSchedule" in taints for taints in pool_node_seen), pool_node_seen
    # Released: the validation taint went, the pool's stays.
    assert cluster.taints(cluster.node("jn-worker-2")) == {"dedicated=web:NoSchedule"}


def test_dropping_a_worker_is_planned_as_its_removal_and_preview_changes_nothing(cluster: Cluster) -> None:
    cluster.stack.write_config(cluster.config([cluster.w1], labels={"jn-worker-1": {"tier": "web"}}))
    cluster.stack.log.clear()
    preview = cluster.stack.preview()
    text = cluster.stack.text()
    assert "[jn-worker-2] plan: leaves the stack: its copies move off, it is drained, wiped" in text, text[-3000:]
    assert changes(preview.change_summary).get("delete", 0) >= 1, preview.change_summary
    assert ready(cluster.node("jn-worker-2"))
    assert cluster.w2.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() == "active"
    # Put it back: the stack is whole again and nothing changes.
    cluster.stack.write_config(cluster.config([cluster.w1, cluster.w2], labels={"jn-worker-1": {"tier": "web"}}))
    assert changes(cluster.up().summary.resource_changes).get("delete", 0) == 0


def test_a_pools_taints_and_labels_reach_its_running_worker_without_a_rejoin(cluster: Cluster) -> None:
    """A pool's change reaches its running workers through the API: no rejoin, never cordoned,
    no command on the worker; labels and taints set by hand stay."""
    cluster.server.run([K3S, "kubectl", "taint", "node", "jn-worker-2", "by-hand=yes:PreferNoSchedule"])
    cluster.server.run([K3S, "kubectl", "label", "node", "jn-worker-2", "by-hand=yes"])
    cluster.pool_taints = ("dedicated=api:NoSchedule", "spot:PreferNoSchedule")
    config = cluster.config([cluster.w1, cluster.w2], labels={"jn-worker-1": {"tier": "web"}})
    config["worker_pools"][0]["labels"] = {"pool": "web"}
    cluster.stack.write_config(config)
    agent_started = cluster.w2.run(["systemctl", "show", "-p", "ExecMainStartTimestamp", "k3s-agent"]).stdout
    cluster.stack.log.clear()
    with NodeWatcher(cluster.server) as watcher:
        result = cluster.up()
    summary = changes(result.summary.resource_changes)
    assert summary.get("delete", 0) == 0 and summary.get("replace", 0) == 0, summary
    text = cluster.stack.text()
    assert "[jn-worker-2] labels and taints in step" in text and "no rejoin" in text, text[-3000:]
    assert "[jn-worker-2] preflight" not in text and "[jn-worker-2] validating" not in text
    assert watcher.seen("jn-worker-2"), "the watch delivered no version of jn-worker-2's Node"
    assert not watcher.cordoned("jn-worker-2"), "jn-worker-2 was cordoned: a rejoin ran"
    node = cluster.node("jn-worker-2")
    # The key kept its place with the new value, the new taint came, the hand-set one stayed.
    assert cluster.taints(node) == {
        "dedicated=api:NoSchedule",
        "spot=:PreferNoSchedule",
        "by-hand=yes:PreferNoSchedule",
    }
    labels = node["metadata"]["labels"]
    assert labels["pool"] == "web" and labels["by-hand"] == "yes"
    assert ready(node) and not node["spec"].get("unschedulable")
    assert cluster.w2.run(["systemctl", "show", "-p", "ExecMainStartTimestamp", "k3s-agent"]).stdout == agent_started
    # Dropped from the config: the pool's label goes, the hand-set one stays.
    cluster.stack.write_config(cluster.config([cluster.w1, cluster.w2], labels={"jn-worker-1": {"tier": "web"}}))
    cluster.up()
    labels = cluster.node("jn-worker-2")["metadata"]["labels"]
    assert "pool" not in labels and labels["by-hand"] == "yes"
    # jn-worker-1 is in no pool: untouched.
    assert cluster.taints(cluster.node("jn-worker-1")) == set()


def test_the_node_watcher_sees_a_cordon_shorter_than_any_poll(cluster: Cluster) -> None:
    """The tests above judge "never cordoned" and "cordoned during its rejoin" from lab.node_watch,
    which reads the API's watch: a cordon lifted a moment later (one shell line on the server,
    well under the 0.3 s a poll used to wait) is seen, and so is its end."""
    with NodeWatcher(cluster.server) as watcher:
        deadline = time.monotonic() + 30
        while not watcher.seen("jn-worker-2"):  # the watch's first list arrived
            assert time.monotonic() < deadline, "the watch delivered no Node within 30 s"
            time.sleep(0.1)
        cluster.server.run(["sh", "-c", f"{K3S} kubectl cordon jn-worker-2 && {K3S} kubectl uncordon jn-worker-2"])
        deadline = time.monotonic() + 30
        while not (
            watcher.cordoned("jn-worker-2") and not watcher.seen("jn-worker-2")[-1]["spec"].get("unschedulable")
        ):
            assert time.monotonic() < deadline, watcher.sights[-10:]
            time.sleep(0.1)
    assert not cluster.node("jn-worker-2")["spec"].get("unschedulable")


def test_a_k3s_version_past_the_next_minor_is_refused_at_preview(cluster: Cluster) -> None:
    config = cluster.config([cluster.w1, cluster.w2], labels={"jn-worker-1": {"tier": "web"}})
    running = config["cluster"]["k3s_version"]
    major, minor = (int(part) for part in running.lstrip("v").split(".")[:2])
    skipping = f"v{major}.{minor + 2}.0+k3s1"
    config["cluster"]["k3s_version"] = skipping
    cluster.stack.write_config(config)
    before = [cluster.node(name)["status"]["nodeInfo"]["kubeletVersion"] for name in ("jn-server", "jn-worker-1")]
    with pytest.raises(auto.CommandError):
        cluster.stack.preview()
    assert (
        f"hk3s:cluster.k3s_version {skipping} skips minor releases from the running {running}" in cluster.stack.text()
    )
    assert f"Set it to the latest v{major}.{minor + 1} release" in cluster.stack.text()
    after = [cluster.node(name)["status"]["nodeInfo"]["kubeletVersion"] for name in ("jn-server", "jn-worker-1")]
    assert after == before
    # Back to the running version: the stack is whole again for the tests after this one.
    cluster.stack.write_config(cluster.config([cluster.w1, cluster.w2], labels={"jn-worker-1": {"tier": "web"}}))


BACKEND_TYPE = "flannel.alpha.coreos.com/backend-type"


def test_a_new_pod_network_on_the_running_cluster_is_refused_at_preview(cluster: Cluster) -> None:
    """Each node runs the server's flannel backend and publishes it, as flannel's kube subnet
    manager does (its Node's backend-type annotation): a k3s agent reads the backend from the
    server's agent configuration once, at its start (pkg/agent/config/config.go get()), so a
    server switched to another backend would leave every running worker on the old one and pod
    traffic between them would stop. The program therefore refuses a new hk3s:cluster.pod_network on
    the running cluster at preview, approved server restart or not, naming the setting, the way
    back and the procedure; nothing changes on any node."""
    workers = [cluster.w1, cluster.w2]
    backends = {n: cluster.node(n)["metadata"]["annotations"].get(BACKEND_TYPE) for n in ("jn-server", "jn-worker-1")}
    assert backends == {"jn-server": "vxlan", "jn-worker-1": "vxlan"}, backends
    config = cluster.config(workers, labels={"jn-worker-1": {"tier": "web"}})
    config["cluster"]["pod_network"] = "wireguard"
    config["network"]["approve_server_restart"] = True
    cluster.stack.write_config(config)
    server_config = cluster.server.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout
    cluster.stack.log.clear()
    with pytest.raises(auto.CommandError):
        cluster.stack.preview()
    text = cluster.stack.text()
    assert "hk3s:cluster.pod_network is vxlan on the running cluster and cannot change to wireguard" in text, text[
        -4000:
    ]
    assert "Set hk3s:cluster.pod_network back to vxlan" in text and "create a new stack" in text, text[-4000:]
    with pytest.raises(auto.CommandError):
        cluster.stack.up()
    assert cluster.server.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout == server_config
    after = {n: cluster.node(n)["metadata"]["annotations"].get(BACKEND_TYPE) for n in ("jn-server", "jn-worker-1")}
    assert after == backends
    # Back to the running setting: the stack is whole again for the tests after this one.
    cluster.stack.write_config(cluster.config(workers, labels={"jn-worker-1": {"tier": "web"}}))


PHASES = [
    "[jn-worker-3] preflight",
    "[jn-worker-3] preparing the host",
    "join token",
    "[jn-worker-3] waiting for the node to register",
    "[jn-worker-3] validating while tainted",
]


def test_join_resumes_after_sigkill_at_each_phase(cluster: Cluster) -> None:
    cluster.stack.write_config(
        cluster.config([cluster.w1, cluster.w2, cluster.w3], labels={"jn-worker-1": {"tier": "web"}})
    )
    outputs: list[str] = []
    for phase in PHASES:
        run = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"], kill_when=phase)
        outputs.append(run.output)
        assert run.killed, f"the up finished before reaching {phase!r}:\n{run.output[-3000:]}"
        # What Pulumi requires after a crash (docs/recovery.md, "When a run is interrupted"): the killed
        # run's lock is released, then its pending operations are cleared.
        blocked = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"])
        assert blocked.returncode != 0 and "pulumi cancel" in blocked.output, blocked.output[-2000:]
        cancel = run_cli(cluster.stack, ["cancel", "--yes"])
        assert cancel.returncode == 0, cancel.output[-2000:]
        refresh = run_cli(cluster.stack, ["refresh", "--yes", "--skip-preview", "--clear-pending-creates"])
        assert refresh.returncode == 0, refresh.output[-3000:]
    final = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"])
    assert final.returncode == 0, final.output[-5000:]
    names = [n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"]]
    assert names.count("jn-worker-3") == 1
    assert ready(cluster.node("jn-worker-3"))
    assert cluster.tokens() == []
    # No host change done twice: the final run found the preparation and the binary in place.
    assert "[jn-worker-3] longhorn-packages skipped" in final.output
    assert "[jn-worker-3] binary unchanged" in final.output
    longhorn_installs = sum(o.count("[jn-worker-3] longhorn-packages applied") for o in [*outputs, final.output])
    assert longhorn_installs <= 1


WORKERS = ("jn-worker-1", "jn-worker-2", "jn-worker-3")
NODES = ("jn-server", *WORKERS)
# A systemd drop-in that keeps the agent from starting: a host whose agent cannot come back.
BROKEN_AGENT = "/etc/systemd/system/k3s-agent.service.d/lab-broken.conf"
SLOW_AGENT = "/etc/systemd/system/k3s-agent.service.d/lab-slow.conf"


def _agent_starts(host: Host, version: str) -> int:
    """How often the host's agent started at `version` (the stand-in logs each start, as k3s does)."""
    log = host.run(["journalctl", "-u", "k3s-agent", "--no-pager", "-o", "cat"]).stdout
    return log.count(f"Starting k3s agent {version}")


def _versions(cluster: Cluster) -> dict[str, str]:
    return {name: cluster.node(name)["status"]["nodeInfo"]["kubeletVersion"] for name in NODES}


def test_a_worker_that_does_not_come_back_stops_a_patch_upgrade_there(cluster: Cluster) -> None:
    """Patch upgrade: the server first, then the workers in order, in place (never cordoned);
    jn-worker-2's agent cannot start on its host, so the run stops there naming it, and
    jn-worker-3 keeps its agent and release untouched."""
    skip_without_lab_binaries("k3s-patch", "k3s-minor")
    old = _versions(cluster)["jn-server"]
    cluster.release = k3s_release("k3s-patch")
    new = cluster.release["k3s_version"]
    cluster.stack.write_config(
        cluster.config([cluster.w1, cluster.w2, cluster.w3], labels={"jn-worker-1": {"tier": "web"}})
    )
    cluster.w2.run(
        f"mkdir -p {BROKEN_AGENT.rsplit('/', 1)[0]} && printf '[Service]\\nExecStartPre=/bin/false\\n' > {BROKEN_AGENT}"
        " && systemctl daemon-reload"
    )
    w3_agent = cluster.w3.run(["systemctl", "show", "-p", "ExecMainStartTimestamp", "k3s-agent"]).stdout
    cluster.stack.log.clear()
    cluster.stack.preview()
    plan = f"plan: k3s {old} -> {new}: the server first, then one worker at a time"
    assert (
        plan in cluster.stack.text() and "jn-worker-1, jn-worker-2, jn-worker-3; each in place" in cluster.stack.text()
    )
    cluster.stack.log.clear()
    with (
        NodeWatcher(cluster.server) as watcher,
        pytest.raises(auto.CommandError),
    ):
        cluster.stack.up()
    text = cluster.stack.text()
    assert f"jn-worker-2: the upgrade to {new} stopped here: its agent failed 3 times on the new binary" in text, text[
        -4000:
    ]
    assert "the workers after it were not touched" in text
    versions = _versions(cluster)
    assert versions["jn-server"] == versions["jn-worker-1"] == new
    assert versions["jn-worker-3"] == old
    assert cluster.w3.run(["systemctl", "show", "-p", "ExecMainStartTimestamp", "k3s-agent"]).stdout == w3_agent
    # The order: the server Ready at the release before the first worker moved; in place.
    server_at, w1_at = watcher.first_at("jn-server", new), watcher.first_at("jn-worker-1", new)
    assert server_at is not None and w1_at is not None and server_at < w1_at, watcher.sights[-20:]
    assert not any(watcher.cordoned(name) for name in WORKERS), "a patch upgrade cordoned a worker"
    # No rejoin ran for the upgraded worker.
    assert "[jn-worker-1] preflight" not in text and "[jn-worker-1] validating" not in text


def test_a_worker_gone_not_ready_mid_run_stops_the_upgrade_there_untouched(cluster: Cluster) -> None:
    """The stopped patch upgrade goes on once jn-worker-2's host is repaired: the next up resumes
    jn-worker-2 (its agent slow to start: 40 s); while it moves, jn-worker-3's agent stops, after the
    run found every worker Ready. Read again at its turn, jn-worker-3 is NotReady: the run stops
    there naming it, jn-worker-2 at the release, jn-worker-3 untouched (no record, no cordon, its
    binary as it was, at its release)."""
    new = cluster.release["k3s_version"] if cluster.release else ""
    if not new or _versions(cluster)["jn-worker-1"] != new:
        pytest.skip("needs the failed patch upgrade of the test before")
    old = _versions(cluster)["jn-worker-3"]
    assert old != new
    # Longer than the lab's node monitor grace period (20 s): jn-worker-3 is NotReady by its turn.
    cluster.w2.run(
        f"rm -f {BROKEN_AGENT} && mkdir -p {SLOW_AGENT.rsplit('/', 1)[0]} && "
        f"printf '[Service]\\nExecStartPre=/bin/sleep 40\\n' > {SLOW_AGENT} && systemctl daemon-reload"
    )
    binary = cluster.w3.run(["sha256sum", K3S]).stdout.split()[0]
    stopped = threading.Event()

    def stop_the_next_worker(line: str) -> None:
        if "[jn-worker-2] resuming the upgrade recorded on its Node" in line and not stopped.is_set():
            cluster.w3.run(["systemctl", "stop", "k3s-agent"])
            stopped.set()

    cluster.stack.log.clear()
    try:
        with pytest.raises(auto.CommandError):
            cluster.stack.up(on_output=stop_the_next_worker)
    finally:
        cluster.w2.run(f"rm -f {SLOW_AGENT} && systemctl daemon-reload")
    text = cluster.stack.text()
    assert stopped.is_set() and "[jn-worker-2] resuming the upgrade recorded on its Node" in text, text[-4000:]
    assert f"jn-worker-3: the upgrade to {new} stopped here: it went NotReady" in text, text[-4000:]
    assert f"it still runs {old}). Moved to {new} in this run: jn-worker-2." in text, text[-4000:]
    versions = _versions(cluster)
    assert versions["jn-worker-2"] == new and versions["jn-worker-3"] == old, versions
    w3 = cluster.node("jn-worker-3")
    assert "hk3s.dev/k3s-upgrade" not in (w3["metadata"].get("annotations") or {})
    assert not w3["spec"].get("unschedulable")
    assert cluster.w3.run(["sha256sum", K3S]).stdout.split()[0] == binary
    assert "[jn-worker-3] upgrading" not in text
    # Back in service at its release, for the next test's run.
    cluster.w3.run(["systemctl", "start", "k3s-agent"])
    deadline = time.monotonic() + 90
    while not ready(cluster.node("jn-worker-3")):
        assert time.monotonic() < deadline, "jn-worker-3 not Ready again within 90 s"
        time.sleep(2)


def test_an_upgrade_killed_midway_converges_on_the_next_up(cluster: Cluster) -> None:
    """An up crashed (SIGKILL to every process of the run) just after jn-worker-3's agent restarted
    on the new binary (jn-worker-2 was finished by the run of the test before, which resumed it);
    the next up finishes: every worker at the release, each agent started on it exactly once."""
    new = cluster.release["k3s_version"] if cluster.release else ""
    if not new or _versions(cluster)["jn-worker-1"] != new:
        pytest.skip("needs the failed patch upgrade of the test before")
    cluster.w2.run(f"rm -f {BROKEN_AGENT} && systemctl daemon-reload")
    # jn-worker-3's agent takes 10 s to start (a busy host): the kill lands while the run waits for it.
    cluster.w3.run(
        f"mkdir -p {SLOW_AGENT.rsplit('/', 1)[0]} && printf '[Service]\\nExecStartPre=/bin/sleep 10\\n' > {SLOW_AGENT}"
        " && systemctl daemon-reload"
    )
    # A crash: the provider processes go too, so the upgrade in flight stops where it was.
    killed = run_cli(
        cluster.stack, ["up", "--yes", "--skip-preview"], kill_when="[jn-worker-3] service restarted", crash=True
    )
    assert killed.killed, killed.output[-4000:]
    assert run_cli(cluster.stack, ["cancel", "--yes"]).returncode == 0
    refresh = run_cli(cluster.stack, ["refresh", "--yes", "--skip-preview", "--clear-pending-creates"])
    assert refresh.returncode == 0, refresh.output[-3000:]
    final = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"])
    cluster.w3.run(f"rm -f {SLOW_AGENT} && systemctl daemon-reload")
    assert final.returncode == 0, final.output[-5000:]
    assert "[jn-worker-3] resuming the upgrade recorded on its Node" in final.output, final.output[-4000:]
    assert set(_versions(cluster).values()) == {new}
    hosts = {"jn-worker-1": cluster.w1, "jn-worker-2": cluster.w2, "jn-worker-3": cluster.w3}
    assert {name: _agent_starts(host, new) for name, host in hosts.items()} == dict.fromkeys(WORKERS, 1)
    for name in WORKERS:
        node = cluster.node(name)
        assert ready(node) and "hk3s.dev/k3s-upgrade" not in (node["metadata"].get("annotations") or {})


def _agent_started(host: Host) -> str:
    return host.run(["systemctl", "show", "-p", "ExecMainStartTimestamp", "k3s-agent"]).stdout


def test_a_worker_down_right_after_its_move_stops_the_upgrade_before_the_next(cluster: Cluster) -> None:
    """Minor upgrade: jn-worker-1's agent stops right after the run saw it Ready at the release, so
    its Node still reads Ready for the node monitor's grace period. Before the next worker is taken
    down, every other node is read again, its kubelet itself included (through the API server's node
    proxy, which reaches it over its agent's tunnel): jn-worker-1 is seen down and the run stops
    there naming it. jn-worker-2 and jn-worker-3 are not restarted (their agents' start times as
    before), stay at their release, uncordoned, with no upgrade record."""
    skip_without_lab_binaries("k3s-patch", "k3s-minor")
    # keep-me (an earlier test's pod) has no controller: a drain would refuse to delete it for good.
    cluster.server.run([K3S, "kubectl", "delete", "pod", "keep-me", "--ignore-not-found", "--wait=false", "--force"])
    old = _versions(cluster)["jn-worker-2"]
    cluster.release = k3s_release("k3s-minor")
    new = cluster.release["k3s_version"]
    assert old != new
    cluster.stack.write_config(
        cluster.config([cluster.w1, cluster.w2, cluster.w3], labels={"jn-worker-1": {"tier": "web"}})
    )
    agents = {host.name: _agent_started(host) for host in (cluster.w2, cluster.w3)}
    stopped = threading.Event()

    def stop_the_moved_worker(line: str) -> None:
        if f"[jn-worker-1] Ready at {new}" in line and not stopped.is_set():
            cluster.w1.run(["systemctl", "stop", "k3s-agent"])
            stopped.set()

    cluster.stack.log.clear()
    try:
        with pytest.raises(auto.CommandError):
            cluster.stack.up(on_output=stop_the_moved_worker)
    finally:
        cluster.w1.run(["systemctl", "start", "--no-block", "k3s-agent"])
    text = cluster.stack.text()
    assert stopped.is_set(), text[-4000:]
    assert "jn-worker-1's kubelet does not answer" in text, text[-4000:]
    assert "never two nodes down at once" in text, text[-4000:]
    assert {host.name: _agent_started(host) for host in (cluster.w2, cluster.w3)} == agents, "a next worker restarted"
    versions = _versions(cluster)
    assert versions["jn-worker-1"] == new and versions["jn-worker-2"] == versions["jn-worker-3"] == old, versions
    for name in ("jn-worker-2", "jn-worker-3"):
        node = cluster.node(name)
        assert not node["spec"].get("unschedulable"), f"{name} left cordoned"
        assert "hk3s.dev/k3s-upgrade" not in (node["metadata"].get("annotations") or {}), name
    # jn-worker-1 back in service at the release (its kubelet answering again), for the next test's run.
    healthz = [K3S, "kubectl", "get", "--raw", "/api/v1/nodes/jn-worker-1/proxy/healthz"]
    deadline = time.monotonic() + 90
    while cluster.server.run(healthz, check=False).returncode != 0 or not ready(cluster.node("jn-worker-1")):
        assert time.monotonic() < deadline, "jn-worker-1 not back within 90 s"
        time.sleep(2)


def test_a_minor_upgrade_drains_one_worker_at_a_time_after_the_server(cluster: Cluster) -> None:
    """Minor upgrade: the server Ready at the release first; then each worker cordoned, drained,
    moved and Ready at the release before the next is cordoned; all uncordoned after; no rejoin.
    The run of the test before (stopped by jn-worker-1 going down) moved the server and jn-worker-1
    already: this run moves the others, the server and each worker before them first."""
    skip_without_lab_binaries("k3s-patch", "k3s-minor")
    # keep-me (an earlier test's pod) has no controller: a drain would refuse to delete it for good.
    cluster.server.run([K3S, "kubectl", "delete", "pod", "keep-me", "--ignore-not-found", "--wait=false", "--force"])
    cluster.release = k3s_release("k3s-minor")
    new = cluster.release["k3s_version"]
    moving = [name for name in WORKERS if _versions(cluster)[name] != new]
    assert moving, "no worker left to move"
    cluster.stack.write_config(
        cluster.config([cluster.w1, cluster.w2, cluster.w3], labels={"jn-worker-1": {"tier": "web"}})
    )
    cluster.stack.log.clear()
    started = time.monotonic()
    with NodeWatcher(cluster.server) as watcher:
        result = cluster.up()
    seconds = time.monotonic() - started
    assert result.summary.result == "succeeded"
    text = cluster.stack.text()
    assert "each cordoned and drained first (a minor release; hk3s:cluster.drain_on_minor_upgrade)" in text
    assert set(_versions(cluster).values()) == {new}
    server_at = watcher.first_at("jn-server", new)
    assert server_at is not None
    previous_done = server_at
    for name in moving:
        cordons, at = watcher.cordoned(name), watcher.first_at(name, new)
        assert cordons and at is not None, (name, watcher.sights[-30:])
        # Cordoned only after the node before it was Ready at the release, and Ready at it itself after.
        assert min(cordons) > previous_done and at > min(cordons), (name, watcher.sights)
        previous_done = at
    # Never two workers cordoned at one sight.
    for moment in {t for t, *_ in watcher.sights}:
        assert sum(1 for t, n, _, _, c in watcher.sights if t == moment and c and n in WORKERS) <= 1
    for name in WORKERS:
        node = cluster.node(name)
        assert ready(node) and not node["spec"].get("unschedulable")
        assert f"[{name}] runs {new} (upgraded in place, no rejoin)" in text
        assert f"[{name}] preflight" not in text
    print(f"minor upgrade of a server and 3 workers: {seconds:.0f} s")


def _expire_client_certificate(cluster: Cluster, worker: Host) -> None:
    expire_client_certificate(cluster.server, worker)


def test_a_worker_whose_client_certificate_expired_is_joined_again_with_a_fresh_token(cluster: Cluster) -> None:
    """jn-worker-1's kubelet client certificate has expired (see _expire_client_certificate) and its
    agent restarted: it cannot authenticate (its join token is spent, the certificate refused:
    k3s's pkg/agent/config/config.go get() retries "Waiting to retrieve agent configuration"
    forever) and its Node goes NotReady. A refresh reads the certificate's end on the host and
    records it; the next up joins the worker again with a fresh one-time token (a rejoin otherwise
    makes none), waits until the agent holds a new certificate the server signed, and deletes the
    token; the Node is Ready again. The restart waits 15 s first: the API server caches a token it
    accepted for 10 s (kube-apiserver's token cache), so the join's token, deleted moments before
    in the test before, is refused as it would be a year on."""
    worker = cluster.w1
    _expire_client_certificate(cluster, worker)
    time.sleep(15)
    worker.run(["systemctl", "restart", "--no-block", "k3s-agent"])
    deadline = time.monotonic() + 90
    while ready(cluster.node(worker.name)):
        assert time.monotonic() < deadline, (
            f"{worker.name} still Ready 90 s after its certificate expired: "
            + worker.run(["journalctl", "-u", "k3s-agent", "--no-pager", "-o", "cat", "-n", "15"]).stdout
        )
        time.sleep(2)
    log = worker.run(["journalctl", "-u", "k3s-agent", "--no-pager", "-o", "cat", "-n", "30"]).stdout
    assert "Waiting to retrieve agent configuration" in log, log

    cluster.stack.log.clear()
    started = time.monotonic()
    cluster.stack.refresh()
    text = cluster.stack.text()
    expired = f"[{worker.name}] its agent's client certificate /{AGENT_DIR}/client-kubelet.crt expired at"
    assert expired in text and "the next up joins it again" in text, text[-4000:]
    cluster.stack.log.clear()
    cluster.up()
    seconds = time.monotonic() - started
    text = cluster.stack.text()
    assert "this run joins it again" in text and f"[{worker.name}] joined and released" in text, text[-4000:]
    assert "expired at" in text and "a fresh join token brings it a new certificate" in text, text[-4000:]
    assert f"[{worker.name}] the agent holds a new client certificate" in text, text[-4000:]
    assert ready(cluster.node(worker.name))
    cert = x509.load_pem_x509_certificate(worker.run(["cat", f"/{AGENT_DIR}/client-kubelet.crt"]).stdout.encode())
    assert cert.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300), cert.not_valid_after_utc
    assert cluster.tokens() == []
    print(f"refresh and rejoin of a worker whose certificate expired: {seconds:.0f} s")
