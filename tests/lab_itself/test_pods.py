"""Pods really run in the lab: pod-capable hosts (``HostSpec(pods=True)``, see lab.pod_hosts).

A pod-capable host gets its own writable cgroup subtree, plain directories for containerd
and the kubelet, and the runtime ``lab/build/pod_runtime.sh`` builds (containerd, runc, CNI
plugins, crictl; a kubelet per k3s release of the stand-in, from ``lab/build/kube.sh``'s
Kubernetes) where k3s keeps its bundled binaries. These tests check the host itself:
containerd and runc run a container from an image imported without a registry, inside the
host's own cgroups, and a teardown leaves no cgroup, mount or process behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pulumi import automation as auto

from host_scripts import script_path
from lab import pod_hosts
from lab.hosts import DEFAULT_CACHE_DIR, Host, HostSpec, Lab
from lab.stack_harness import (
    LabStack,
    base_config,
    k3s_release,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    worker_spec,
)
from node_operations.firewall_plan import METADATA_ADDRESS, inbound_rules
from node_operations.host_firewall.apply import apply_node_firewall, remove_node_firewall
from node_operations.host_firewall.plan import NodeFirewallPlan
from node_operations.reboot import REBOOT_ANNOTATION
from operator_api import MaintenanceError
from remote_access.ssh import SshTarget

pytestmark = pytest.mark.lab

RUNTIME = pod_hosts.RUNTIME_BIN_IN_HOST
# A bare containerd (no CRI, no kubelet) to prove the host runs containers at all.
CONTAINERD_CONFIG = f"""version = 3
root = "{pod_hosts.CONTAINERD_DIR_IN_HOST}"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{RUNTIME}/runc"
"""


@pytest.fixture(scope="module")
def pod_host(lab: Lab) -> Host:
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    host = lab.add_host(HostSpec("pods-one", pods=True))
    lab.wait_ssh_ready([host], timeout=120)
    return host


def _start_containerd(host: Host) -> None:
    host.run(["mkdir", "-p", "/etc/hk3s-lab-test"])
    (host.root / "etc/hk3s-lab-test/containerd.toml").write_text(CONTAINERD_CONFIG)
    host.run(
        [
            "systemd-run", "--unit=test-containerd", "--property=Delegate=yes", "--property=KillMode=process",
            f"--setenv=PATH={RUNTIME}:/usr/sbin:/usr/bin:/sbin:/bin",
            f"{RUNTIME}/containerd", "--config", "/etc/hk3s-lab-test/containerd.toml",
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while host.run([f"{RUNTIME}/ctr", "version"], check=False).returncode != 0:
        assert time.monotonic() < deadline, host.run(["journalctl", "-u", "test-containerd", "--no-pager"]).stdout
        time.sleep(0.3)


def test_pod_host_has_its_own_writable_cgroups(pod_host: Host) -> None:
    # The container's cgroup root is the host's own subtree (init.scope at the top), and
    # the host can create cgroups that land under its subtree on the machine.
    cgroup = pod_host.run(["cat", "/proc/1/cgroup"], via="ssh").stdout
    assert "memory:/init.scope" in cgroup, cgroup
    pod_host.run(["mkdir", "/sys/fs/cgroup/memory/hk3s-probe"])
    on_machine = Path(pod_host.cgroup_dirs["memory"]) / "hk3s-probe"
    assert on_machine.is_dir()
    pod_host.run(["rmdir", "/sys/fs/cgroup/memory/hk3s-probe"])
    assert not on_machine.exists()
    # The kubelet's kernel values, and a plain (non-overlay) containerd directory.
    assert pod_host.run(["cat", "/proc/sys/vm/overcommit_memory"]).stdout.strip() == "1"
    fstype = pod_host.run(["findmnt", "-n", "-o", "FSTYPE", pod_hosts.CONTAINERD_DIR_IN_HOST]).stdout.strip()
    assert fstype not in ("overlay", ""), fstype


def test_ctr_runs_a_container_from_an_imported_image(pod_host: Host) -> None:
    _start_containerd(pod_host)
    for archive in pod_hosts.image_archives(DEFAULT_CACHE_DIR):
        pod_host.run(["mkdir", "-p", "/root/images"])
        (pod_host.root / "root/images" / archive.name).write_bytes(archive.read_bytes())
        pod_host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "images", "import", "--local", f"/root/images/{archive.name}"])
    images = pod_host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "images", "ls", "-q"]).stdout
    busybox = next(line for line in images.splitlines() if "busybox" in line)
    out = pod_host.run(
        [f"{RUNTIME}/ctr", "-n", "k8s.io", "run", "--rm", busybox, "probe", "sh", "-c", "echo hello from $(hostname); cat /proc/self/cgroup"],
        timeout=60,
    ).stdout  # fmt: skip
    assert "hello from" in out, out
    # runc put the container in a cgroup of the host's subtree (containerd's /<namespace>/<id>).
    assert "memory:/k8s.io/probe" in out, out
    # A long-running container keeps running while containerd is stopped (KillMode=process):
    # the shim holds it, as on a k3s node whose agent is stopped.
    pod_host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "run", "-d", busybox, "sleeper", "sleep", "3600"], timeout=60)
    pod_host.run(["systemctl", "stop", "test-containerd"])
    assert pod_host.run(["pgrep", "-f", "sleep 3600"], check=False).returncode == 0
    assert (Path(pod_host.cgroup_dirs["memory"]) / "k8s.io" / "sleeper").is_dir()


def test_teardown_removes_pod_hosts_cgroups(lab: Lab, fresh_lab: Lab) -> None:
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    host = fresh_lab.add_host(HostSpec("pods-td", pods=True))
    fresh_lab.wait_ssh_ready([host], timeout=120)
    _start_containerd(host)
    host.run(["mkdir", "-p", "/sys/fs/cgroup/pids/deep/deeper"])
    # A running container (its shim and process) at teardown.
    archive = next(a for a in pod_hosts.image_archives(DEFAULT_CACHE_DIR) if a.name.startswith("busybox"))
    (host.root / "root" / archive.name).write_bytes(archive.read_bytes())
    host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "images", "import", "--local", f"/root/{archive.name}"])
    image = next(
        i for i in host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "images", "ls", "-q"]).stdout.split() if "busybox" in i
    )
    host.run([f"{RUNTIME}/ctr", "-n", "k8s.io", "run", "-d", image, "td-sleeper", "sleep", "3601"], timeout=60)
    dirs = dict(host.cgroup_dirs)
    assert all(Path(d).is_dir() for d in dirs.values())
    container_pids = _pids_in_cgroups(dirs)
    assert any(_cmdline(pid) == ["sleep", "3601"] for pid in container_pids), container_pids
    assert any("containerd-shim" in " ".join(_cmdline(pid)) for pid in container_pids), container_pids
    assert fresh_lab.leftovers().cgroups
    fresh_lab.teardown()
    assert not [d for d in dirs.values() if Path(d).exists()]
    assert not [pid for pid in container_pids if Path(f"/proc/{pid}").exists()]
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if "td-sleeper" in m]
    assert fresh_lab.leftovers().empty()


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _pids_in_cgroups(dirs: dict[str, str]) -> set[int]:
    """Every process of the machine inside the host's cgroup subtrees."""
    pids: set[int] = set()
    for directory in dirs.values():
        for procs in Path(directory).rglob("cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


# --------------------------------------------------------------------------- through the real engine

DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {node-role.kubernetes.io/worker: "true"}
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: IMAGE
          imagePullPolicy: Never
          command: ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && echo serving $(hostname) && exec httpd -f -p 8080 -h /www"]
          readinessProbe:
            exec: {command: ["cat", "/www/index.html"]}
            periodSeconds: 2
"""


def _kubectl(server: Host, *args: str, timeout: float = 60) -> str:
    return server.run(["/usr/local/bin/k3s", "kubectl", *args], timeout=timeout).stdout


def _wait(what: str, check: Callable[[], bool], timeout: float, diagnose: Callable[[], str]) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not within {timeout:.0f}s\n{diagnose()}")
        time.sleep(1)
    return time.monotonic() - started


def _pods(server: Host) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(_kubectl(server, "get", "pods", "-l", "app=web", "-o", "json"))["items"]
    return items


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod.get("status", {}).get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def _running_container_ids(host: Host) -> set[str]:
    return set(host.run(["/usr/local/bin/k3s", "crictl", "ps", "-q", "--state", "Running"]).stdout.split())


def _diagnose(server: Host, workers: list[Host]) -> Callable[[], str]:
    def text() -> str:
        parts = [_kubectl(server, "get", "pods,nodes", "-o", "wide"), _kubectl(server, "get", "events", "-A")[-3000:]]
        for w in workers:
            parts.append(w.run("journalctl -u k3s-agent --no-pager | tail -n 30", check=False).stdout)
            parts.append(w.run("tail -n 30 /var/lib/rancher/k3s/agent/kubelet.log", check=False).stdout)
        return "\n".join(parts)

    return text


@dataclass
class PodCluster:
    server: Host
    first: Host
    second: Host
    stack: LabStack
    config: dict[str, Any]
    diagnose: Callable[[], str]

    @property
    def workers(self) -> list[Host]:
        return [self.first, self.second]


@pytest.fixture(scope="module")
def pod_cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> PodCluster:
    """A server and two pod-capable workers joined through the real engine, running a
    Deployment of 4 web pods spread over the workers. The tests below run in order."""
    skip_without_lab_binaries()
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    server = lab.add_host(server_spec("pods-srv"))
    workers = [lab.add_host(worker_spec(f"pods-w{i}", pods=True)) for i in (1, 2)]
    lab.wait_ssh_ready([server, *workers])
    for worker in workers:  # before k3s is installed, as k3s's air-gap instructions say
        pod_hosts.place_airgap_images(worker.root, DEFAULT_CACHE_DIR)
    stack = LabStack(tmp_path_factory.mktemp("pods-stack"))
    config = base_config(lab, server, workers)
    stack.write_config(config)
    up_or_fail(stack)
    return PodCluster(server, workers[0], workers[1], stack, config, _diagnose(server, workers))


def _pod_uids(server: Host) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(server)}


def test_deployment_runs_on_two_joined_pod_workers(pod_cluster: PodCluster) -> None:
    server, workers, diagnose, stack = pod_cluster.server, pod_cluster.workers, pod_cluster.diagnose, pod_cluster.stack
    for worker in workers:
        info = json.loads(_kubectl(server, "get", "node", worker.name, "-o", "json"))["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://"), info
        assert info["kubeletVersion"].endswith("+k3s1"), info
        # The join's validation pod ran on the node while it was tainted, and was removed.
        assert f"[{worker.name}] validation pod hk3s-validate-{worker.name} ran in" in stack.text(), stack.text()
    assert not _kubectl(server, "get", "pods", "-n", "kube-system", "-o", "name").strip()
    image = pod_hosts.busybox_image()
    for worker in workers:
        _wait(
            f"{worker.name} imports the air-gap images",
            lambda w=worker: image in w.run(["/usr/local/bin/k3s", "ctr", "images", "ls", "-q"]).stdout,  # type: ignore[misc]
            60,
            diagnose,
        )

    (server.root / "root/web.yaml").write_text(DEPLOYMENT.replace("IMAGE", image))
    _kubectl(server, "apply", "-f", "/root/web.yaml")
    seconds = _wait("4 web pods Running and Ready", lambda: sum(map(_ready, _pods(server))) == 4, 180, diagnose)
    print(f"4 pods Running and Ready {seconds:.1f}s after the Deployment was created")
    pods = _pods(server)
    by_node: dict[str, list[str]] = {}
    for pod in pods:
        by_node.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
    assert sorted(by_node) == sorted(w.name for w in workers), by_node
    assert all(len(names) == 2 for names in by_node.values()), by_node
    # Logs and exec go through the API server to the kubelets.
    name = pods[0]["metadata"]["name"]
    assert f"serving {name}" in _kubectl(server, "logs", name)
    assert _kubectl(server, "exec", name, "--", "cat", "/www/index.html").strip() == name
    # A pod on one worker reaches a pod on the other by pod IP (the VXLAN pod network).
    here = pods[0]
    there = next(p for p in pods if p["spec"]["nodeName"] != here["spec"]["nodeName"])
    url = f"http://{there['status']['podIP']}:8080/"
    answer = _kubectl(server, "exec", here["metadata"]["name"], "--", "timeout", "10", "wget", "-q", "-O", "-", url)
    assert answer.strip() == there["metadata"]["name"], (url, answer)

    # Stopping the agent leaves the containers running, as on k3s; starting it again keeps them.
    first = pod_cluster.first
    before = _running_container_ids(first)
    assert len(before) >= 2, before
    first.run(["systemctl", "stop", "k3s-agent"])
    assert first.run(["pgrep", "-x", "containerd"], check=False).returncode != 0, "containerd outlived the agent"
    assert first.run(["pgrep", "-x", "kubelet"], check=False).returncode != 0, "the kubelet outlived the agent"
    assert len(first.run(["pgrep", "-x", "httpd"]).stdout.split()) == 2, "the pods' processes stopped with the agent"
    first.run(["systemctl", "start", "k3s-agent"], timeout=120)
    _wait(
        "the restarted agent's containers listed again", lambda: _running_container_ids(first) == before, 60, diagnose
    )
    _wait("4 web pods Ready after the restart", lambda: sum(map(_ready, _pods(server))) == 4, 120, diagnose)


def _login(lab: Lab, host: Host) -> SshTarget:
    return SshTarget(
        node=host.name,
        address=host.ssh_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=host.ssh_host_public_key,
    )


def test_a_real_pod_on_a_hetzner_node_cannot_reach_the_metadata_service(lab: Lab, pod_cluster: PodCluster) -> None:
    """A web pod on pods-w1 asks the metadata service for its user_data, before and after the
    program's host firewall (nftables, `block_metadata` as on a Hetzner server) is on pods-w1;
    the host itself (as a hostNetwork pod would) still gets it. The lab has no metadata service:
    pods-w2 stands for it, 169.254.169.254 on its loopback and an HTTP server on port 80, and
    pods-w1 routes that address to it as a Hetzner server routes it to its gateway, masquerading
    its pods' traffic there as flannel does for traffic leaving the pod network. The firewall is
    taken off again, so the tests after this one find the cluster as it was."""
    server, first, second, diagnose = pod_cluster.server, pod_cluster.first, pod_cluster.second, pod_cluster.diagnose
    (second.root / "root/meta").mkdir(exist_ok=True)
    (second.root / "root/meta/user-data").write_text("hk3s-lab-user-data\n")
    second.run(["ip", "addr", "replace", f"{METADATA_ADDRESS}/32", "dev", "lo"])
    metadata_server = ["python3", "-m", "http.server", "80", "--bind", METADATA_ADDRESS, "--directory", "/root/meta"]
    second.run(["systemd-run", "--unit=hk3s-test-metadata", "--collect", *metadata_server])
    pod_cidr = json.loads(_kubectl(server, "get", "node", first.name, "-o", "json"))["spec"]["podCIDR"]
    first.run(["ip", "route", "replace", f"{METADATA_ADDRESS}/32", "via", str(second.public_ip)])
    masquerade = (
        "table ip hk3s_test_masq {\n chain postrouting {\n  type nat hook postrouting priority srcnat; policy accept;\n"
        f"  ip saddr {pod_cidr} ip daddr {METADATA_ADDRESS} masquerade\n }}\n}}\n"
    )
    first.run(f"nft -f - <<'EOF'\n{masquerade}EOF")
    pod = next(p["metadata"]["name"] for p in _pods(server) if p["spec"]["nodeName"] == first.name)
    url = f"http://{METADATA_ADDRESS}/user-data"

    def pod_reads() -> subprocess.CompletedProcess[str]:
        argv = ["/usr/local/bin/k3s", "kubectl", "exec", pod, "--", "timeout", "10", "wget", "-q", "-O", "-", url]
        return server.run(argv, check=False, timeout=60)

    def host_reads() -> str:
        script = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read())"
        return first.run(["python3", "-c", script], check=False, timeout=30).stdout

    def why() -> str:
        read = pod_reads()
        return "\n".join(
            [
                f"pod: {read.returncode} {read.stdout} {read.stderr}",
                f"host: {host_reads()}",
                first.run(["ip", "route", "get", METADATA_ADDRESS], check=False).stdout,
                second.run(["ss", "-Htln"], check=False).stdout,
                first.run(["nft", "list", "ruleset"], check=False).stdout[-3000:],
            ]
        )

    _wait("the node reaches the metadata stand-in", lambda: "hk3s-lab-user-data" in host_reads(), 30, why)
    _wait("its pod reaches the metadata stand-in", lambda: "hk3s-lab-user-data" in pod_reads().stdout, 30, why)
    peers = {host.name: str(host.public_ip) for host in (server, first, second)}
    rules = inbound_rules(role="worker", node=first.name, peers=peers, server=server.name, pod_network="vxlan")
    plan = NodeFirewallPlan(first.name, "worker", tuple(rules), block_metadata=True)
    try:
        # The same firewall without the block lets the pod through: what stops it below is the block.
        asyncio.run(apply_node_firewall(_login(lab, first), dataclasses.replace(plan, block_metadata=False)))
        assert "hk3s-lab-user-data" in pod_reads().stdout, why()
        asyncio.run(apply_node_firewall(_login(lab, first), plan))
        blocked = pod_reads()
        assert blocked.returncode != 0 and "hk3s-lab-user-data" not in blocked.stdout, blocked
        # The node itself is not held (hostNetwork pods are the node as far as the network can tell).
        assert "hk3s-lab-user-data" in host_reads()
        # The pod still reaches the rest of the cluster: the other worker's pod by its pod IP.
        there = next(p for p in _pods(server) if p["spec"]["nodeName"] == second.name)
        answer = _kubectl(
            server,
            "exec",
            pod,
            "--",
            "timeout",
            "10",
            "wget",
            "-q",
            "-O",
            "-",
            f"http://{there['status']['podIP']}:8080/",
        )
        assert answer.strip() == there["metadata"]["name"]
    finally:
        asyncio.run(remove_node_firewall(_login(lab, first)))
        first.run(["nft", "delete", "table", "ip", "hk3s_test_masq"], check=False)
        second.run(["systemctl", "stop", "hk3s-test-metadata"], check=False)
    _wait("4 web pods Ready", lambda: sum(map(_ready, _pods(server))) == 4, 60, diagnose)


def test_rejoin_keeps_the_pods_running(pod_cluster: PodCluster) -> None:
    """A rejoin (here: a cluster registry configured, which every worker is checked against
    again; the API server answers /v2/ as one) cordons the worker for its checks and leaves its
    pods alone: the same pods with the same containers, Ready throughout the run's end."""
    server, first = pod_cluster.server, pod_cluster.first
    containers = {w.name: _running_container_ids(w) for w in pod_cluster.workers}
    uids = _pod_uids(server)
    pod_cluster.config["cluster"]["registry"] = f"{server.public_ip}:6443"
    pod_cluster.config["workers"][0]["labels"] = {"tier": "web"}
    pod_cluster.stack.write_config(pod_cluster.config)
    pod_cluster.stack.log.clear()  # the rejoin's own lines only
    result = up_or_fail(pod_cluster.stack)
    updates = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert updates.get("update", 0) >= 1, updates
    for worker in pod_cluster.workers:
        assert f"[{worker.name}] validating while tainted" in pod_cluster.stack.text(), "no rejoin ran"
    node = json.loads(_kubectl(server, "get", "node", first.name, "-o", "json"))
    assert node["metadata"]["labels"]["tier"] == "web" and not node["spec"].get("unschedulable")
    assert {w.name: _running_container_ids(w) for w in pod_cluster.workers} == containers
    assert _pod_uids(server) == uids
    assert sum(map(_ready, _pods(server))) == 4


def test_a_powered_off_workers_pods_are_seen_by_the_controller_manager(pod_cluster: PodCluster) -> None:
    """The real controller manager marks a powered-off worker's node unreachable and its
    pods not Ready (it deletes none: they wait for the node or a fence)."""
    server, first, second = pod_cluster.server, pod_cluster.first, pod_cluster.second
    uids = _pod_uids(server)
    second.power_off()

    def unreachable() -> bool:
        node = json.loads(_kubectl(server, "get", "node", second.name, "-o", "json"))
        taints = {t["key"] for t in node["spec"].get("taints", [])}
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        return ready["status"] == "Unknown" and "node.kubernetes.io/unreachable" in taints

    _wait(f"{second.name} marked unreachable", unreachable, 120, pod_cluster.diagnose)
    _wait(
        f"{second.name}'s pods marked not Ready",
        lambda: all(not _ready(p) for p in _pods(server) if p["spec"]["nodeName"] == second.name),
        60,
        pod_cluster.diagnose,
    )
    pods = _pods(server)
    assert sum(1 for p in pods if p["spec"]["nodeName"] == first.name and _ready(p)) == 2, pods
    assert _pod_uids(server) == uids  # none deleted or replaced
    second.power_on(wait=True)
    _wait(
        "4 web pods Ready after the power-on", lambda: sum(map(_ready, _pods(server))) == 4, 180, pod_cluster.diagnose
    )
    assert _pod_uids(server) == uids


def _node(server: Host, name: str) -> dict[str, Any]:
    node: dict[str, Any] = json.loads(_kubectl(server, "get", "node", name, "-o", "json"))
    return node


def test_a_reboot_is_refused_while_another_node_is_cordoned(pod_cluster: PodCluster) -> None:
    """Never two workers down at once: a cordoned peer refuses the reboot, nothing changes."""
    server, first, second = pod_cluster.server, pod_cluster.first, pod_cluster.second
    _kubectl(server, "cordon", second.name)
    try:
        with pytest.raises(MaintenanceError) as caught:
            pod_cluster.stack.api().reboot_worker(first.name)
    finally:
        _kubectl(server, "uncordon", second.name)
    assert caught.value.put_back is True
    assert f"{second.name} is cordoned (draining or in maintenance): never two nodes down at once" in str(caught.value)
    node = _node(server, first.name)
    assert not node["spec"].get("unschedulable") and REBOOT_ANNOTATION not in node["metadata"].get("annotations", {})
    assert pod_cluster.stack.hk3s("node", "reboot", "no-such-worker").returncode == 3


def test_a_drain_held_by_a_disruption_budget_names_the_pod_and_budget_and_puts_the_worker_back(
    pod_cluster: PodCluster,
) -> None:
    server, first = pod_cluster.server, pod_cluster.first
    boots = first.boots
    budget = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web-all, namespace: default}\n"
    budget += "spec: {minAvailable: 4, selector: {matchLabels: {app: web}}}\n"
    (server.root / "root/pdb.yaml").write_text(budget)
    _kubectl(server, "apply", "-f", "/root/pdb.yaml")
    try:
        with pytest.raises(MaintenanceError) as caught:
            pod_cluster.stack.api().reboot_worker(first.name, drain_timeout=15)
    finally:
        _kubectl(server, "delete", "-f", "/root/pdb.yaml")
    message = str(caught.value)
    on_first = [p["metadata"]["name"] for p in _pods(server) if p["spec"]["nodeName"] == first.name]
    assert len(on_first) == 2, on_first
    for pod in on_first:
        assert f"pod default/{pod} held by PodDisruptionBudget default/web-all (allows 0 disruption(s))" in message
    assert "is uncordoned again and was not rebooted" in message and caught.value.put_back is True
    node = _node(server, first.name)
    assert not node["spec"].get("unschedulable") and REBOOT_ANNOTATION not in node["metadata"].get("annotations", {})
    assert first.boots == boots
    assert sum(map(_ready, _pods(server))) == 4


def test_a_reboot_drains_reboots_and_brings_the_workloads_back(pod_cluster: PodCluster) -> None:
    """Cordon, drain, reboot, Ready, uncordon, then the workloads that were ready before are
    ready again, through the CLI as an operator runs it."""
    server, first = pod_cluster.server, pod_cluster.first
    boots = first.boots
    cordoned = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if _node(server, first.name)["spec"].get("unschedulable"):
                cordoned.set()
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run = pod_cluster.stack.hk3s("node", "reboot", first.name, "--json")
    finally:
        stop.set()
        watcher.join()
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert first.boots > boots, "the host did not reboot"
    assert cordoned.is_set(), f"{first.name} was never cordoned"
    for step in ("draining: 2 pod(s) to evict", "rebooting the host", "the host booted again", "uncordoned"):
        assert f"[{first.name}] {step}" in run.stderr, run.stderr
    assert len(report["evicted"]) == 2 and all(pod.startswith("default/web-") for pod in report["evicted"])
    assert "deployment/default/web" in report["ready_again"] and report["not_ready"] == [], report
    node = _node(server, first.name)
    assert not node["spec"].get("unschedulable") and REBOOT_ANNOTATION not in node["metadata"].get("annotations", {})
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
    assert sum(map(_ready, _pods(server))) == 4
    assert {p["spec"]["nodeName"] for p in _pods(server)} == {w.name for w in pod_cluster.workers}


def test_a_reboot_killed_before_the_host_went_down_is_resumed_by_the_next_call(pod_cluster: PodCluster) -> None:
    """SIGKILL as the reboot is about to be issued: the worker stays cordoned with the reboot
    recorded on its Node (visible, not forgotten); the next call resumes it and finishes."""
    server, second = pod_cluster.server, pod_cluster.second
    boots = second.boots
    killed = pod_cluster.stack.hk3s("node", "reboot", second.name, kill_when="rebooting the host")
    assert killed.killed, killed.stderr[-3000:]
    node = _node(server, second.name)
    assert node["spec"].get("unschedulable") and REBOOT_ANNOTATION in node["metadata"].get("annotations", {})
    run = pod_cluster.stack.hk3s("node", "reboot", second.name)
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"[{second.name}] resuming the reboot recorded on its Node" in run.stderr
    # Rebooted exactly once, whichever side of the kill the reboot command fell on (killed
    # before it: "the recorded reboot did not happen; rebooting now"; after: it waits for the boot).
    assert second.boots == boots + 1
    node = _node(server, second.name)
    assert not node["spec"].get("unschedulable") and REBOOT_ANNOTATION not in node["metadata"].get("annotations", {})
    _wait(
        "4 web pods Ready after the resumed reboot",
        lambda: sum(map(_ready, _pods(server))) == 4,
        120,
        pod_cluster.diagnose,
    )


def test_a_patch_upgrade_moves_each_pod_workers_kubelet_to_the_new_release(pod_cluster: PodCluster) -> None:
    """k3s runs the kubelet compiled into its own binary (pkg/daemons/agent/agent.go starts it in
    the k3s process; there is no kubelet file to pick), so a Node always reports the k3s binary's
    own version. A patch upgrade through the product (the stand-in stamped as the next patch
    release) restarts each pod worker's agent on the new binary; its real kubelet must then report
    that release, Ready, and the workloads run again."""
    skip_without_lab_binaries("k3s-patch")
    server = pod_cluster.server
    release = k3s_release("k3s-patch")
    new = release["k3s_version"]
    for worker in pod_cluster.workers:
        assert _node(server, worker.name)["status"]["nodeInfo"]["kubeletVersion"] != new
    pod_cluster.config["cluster"].update(release)
    pod_cluster.stack.write_config(pod_cluster.config)
    pod_cluster.stack.log.clear()
    up_or_fail(pod_cluster.stack)
    text = pod_cluster.stack.text()
    for worker in pod_cluster.workers:
        assert f"[{worker.name}] Ready at {new}" in text, text[-4000:]
        node = _node(server, worker.name)
        assert node["status"]["nodeInfo"]["kubeletVersion"] == new, node["status"]["nodeInfo"]
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"]), node
        # The kubelet process that runs is the new release's own.
        pids = worker.run(["pgrep", "-x", "kubelet"]).stdout.split()
        exes = {worker.run(["readlink", f"/proc/{pid}/exe"]).stdout.strip() for pid in pids}
        assert exes == {f"{RUNTIME}/kubelets/{new}/kubelet"}, exes
    _wait("4 web pods Ready after the upgrade", lambda: sum(map(_ready, _pods(server))) == 4, 120, pod_cluster.diagnose)


def test_the_fence_script_stops_every_container_shim_and_pod_mount(pod_cluster: PodCluster) -> None:
    """The product's own stop (host_scripts/k3s_fence.sh) on a pod host, which has no
    k3s-killall.sh (only k3s's install script writes one): no shim, container or pod mount left."""
    second = pod_cluster.second
    assert not (second.root / "usr/local/bin/k3s-killall.sh").exists()
    assert second.run(["pgrep", "-x", "httpd"], check=False).returncode == 0
    (second.root / "root/k3s_fence.sh").write_bytes(script_path("k3s_fence.sh").read_bytes())
    stopped = second.run(["bash", "/root/k3s_fence.sh"], timeout=180).stdout
    left = next(line.split()[2:] for line in stopped.splitlines() if line.startswith("result left"))
    assert left == [], stopped
    assert second.run(["pgrep", "-f", "containerd-shim"], check=False).returncode != 0
    assert second.run(["pgrep", "-x", "httpd"], check=False).returncode != 0
    mounts = second.run(["cat", "/proc/self/mounts"]).stdout
    assert not [m for m in mounts.splitlines() if " /run/k3s" in m or "/var/lib/kubelet/pods" in m], mounts


def test_join_stops_when_the_validation_pod_cannot_run(lab: Lab, tmp_path: Path) -> None:
    """A pod-capable worker without the validation pod's image (no air-gap images, no
    registry): the join stops naming the node, the pod and the reason."""
    skip_without_lab_binaries()
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    server = lab.add_host(server_spec("pods-srv2"))
    worker = lab.add_host(worker_spec("pods-noimg", pods=True))
    lab.wait_ssh_ready([server, worker])
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker]))
    with pytest.raises(auto.CommandError):
        stack.up()
    text = stack.text()
    assert (
        "pods-noimg: join stopped at validation-pod: the validation pod kube-system/hk3s-validate-pods-noimg" in text
    ), text[-4000:]
    # The reason: the image (here the sandbox's too) could not be pulled without a registry.
    assert "pull" in text.split("join stopped at validation-pod", 1)[1].lower(), text[-4000:]
