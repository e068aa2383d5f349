"""Fencing a dead worker, through the real Pulumi engine on pod-capable lab hosts: a real
containerd, runc and kubelet under the k3s stand-in, and the real kube-controller-manager,
whose taint manager and pod garbage collector delete the pods of a node tainted out of service.

One cluster for the module (the tests run in order): a server and three workers running a
Deployment of three web pods, one per worker.
- fe-w1's agent is stopped (its containers keep running, as on k3s): fenced while NotReady for
  less than a minute is refused, naming how long; after a minute it is fenced over SSH: a drop-in
  holds its agent down, no container, shim or pod mount is left, and the drop-in holds across a
  reboot of the host.
- Runs SIGKILLed (with their provider processes) at each boundary of fe-w1's fence (after the
  record, after the stop, after the taint) leave the record and what was done; after `cancel` and
  `refresh --clear-pending-creates` each next `up` resumes from that record (one record, the same
  time), and the last one finishes the fence.
- fe-w2 does not answer over SSH, and the server reaches it through a router (the machine's
  side of the lab's public bridge): refused without powered_off, refused while something answers
  at its kubelet's address (a kubelet, an ICMP host-unreachable from fe-w2 itself, a TCP reset),
  fenced once it is powered off (its address silent: the router's ICMP host-unreachable, sent when
  no machine answered its ARP for the address, is not an answer from fe-w2).
- Both Nodes show OutOfService, and the web pods run on fe-w3.
- fe-w1's sshd refuses the program's key: giving it up is refused (a refused login is a host
  that answers, not silence), and nothing changes.
- fe-w1's fence entry removed: it rejoins (validation taint on before the out-of-service taint
  comes off, the join's checks, the drop-in gone) and takes pods again.
- fe-w2 given up (`node remove --force`) only while the fence holds it: powered back on with its
  sshd masked and its Node Ready, or answering and running its agent, it is refused; added back,
  its join removes the fence's leftover drop-in and it joins.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from host_scripts import script_path
from lab import pod_hosts
from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.stack_harness import (
    LabStack,
    base_config,
    run_cli,
    server_spec,
    skip_without_lab_binaries,
    up_or_fail,
    wait_until,
    worker_spec,
)
from node_operations.fence import FENCE_ANNOTATION

pytestmark = pytest.mark.lab

K3S = "/usr/local/bin/k3s"
DROP_IN = "/etc/systemd/system/k3s-agent.service.d/hk3s-fence.conf"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
# One pod per worker while all are schedulable; tainted nodes leave the spread (nodeTaintsPolicy:
# Honor), so the replacements may all start on the worker left.
DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {node-role.kubernetes.io/worker: "true"}
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
           nodeTaintsPolicy: Honor, labelSelector: {matchLabels: {app: web}}}
      terminationGracePeriodSeconds: 2
      containers:
        - name: web
          image: IMAGE
          imagePullPolicy: Never
          command: ["sh", "-c", "exec httpd -f -p 8080 -h /tmp"]
"""
# Something answering at a kubelet's port on a host that no longer answers over SSH.
FAKE_KUBELET = ["systemd-run", "--unit=fake-kubelet", "python3", "-m", "http.server", "10250"]
BLOCK_SSH = "add table inet labblock; add chain inet labblock input { type filter hook input priority -10; }; " + (
    "add rule inet labblock input tcp dport 22 reject with tcp reset"
)


def kubectl(server: Host, *args: str) -> str:
    return server.run([K3S, "kubectl", *args], timeout=60).stdout


def node(server: Host, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(server, "get", "node", name, "-o", "json"))
    return found


def ready_status(server: Host, name: str) -> str:
    return next(c["status"] for c in node(server, name)["status"]["conditions"] if c["type"] == "Ready")


def down_seconds(server: Host, name: str) -> float:
    """How long the Node has been NotReady, by its Ready condition and the server's clock."""
    ready = next(c for c in node(server, name)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] != "True", ready
    since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()
    return float(server.run(["date", "+%s"]).stdout) - since


def web_pods(server: Host) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl(server, "get", "pods", "-l", "app=web", "-o", "json"))["items"]
    return items


def running_on(server: Host) -> dict[str, str]:
    """Each running, Ready web pod and its node."""
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in web_pods(server)
        if p["status"].get("phase") == "Running"
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        and not p["metadata"].get("deletionTimestamp")
    }


@dataclass
class Cluster:
    lab: Lab
    stack: LabStack
    server: Host
    w1: Host
    w2: Host
    w3: Host
    config: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    recorded_at: str = ""
    router: str = ""  # the router between the server and fe-w2

    def fence(self, fences: dict[str, dict[str, bool]]) -> str:
        """`up` with these fences; the run's output (it failed) or "" (it succeeded)."""
        self.write_fences(fences)
        return self.stack.up_output()

    def write_fences(self, fences: dict[str, dict[str, bool]]) -> None:
        self.config["fences"] = fences
        self.stack.write_config(self.config)

    def diagnose(self) -> str:
        return kubectl(self.server, "get", "pods,nodes", "-o", "wide") + self.stack.text()[-4000:]

    def unchanged(self, worker: Host) -> None:
        """A refusal changed nothing: no record, no taint, the host's drop-in not written."""
        found = node(self.server, worker.name)
        assert FENCE_ANNOTATION not in (found["metadata"].get("annotations") or {}), found["metadata"]
        assert OUT_OF_SERVICE not in {t["key"] for t in found["spec"].get("taints") or []}
        assert (worker.root / DROP_IN.lstrip("/")).exists() is False


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    skip_without_lab_binaries()
    reason = pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    server = lab.add_host(server_spec("fe-srv"))
    workers = [lab.add_host(worker_spec(f"fe-w{i}", pods=True)) for i in (1, 2, 3)]
    lab.wait_ssh_ready([server, *workers])
    for worker in workers:  # before k3s is installed, as k3s's air-gap instructions say
        pod_hosts.place_airgap_images(worker.root, DEFAULT_CACHE_DIR)
    stack = LabStack(tmp_path_factory.mktemp("fence-stack"))
    config = base_config(lab, server, workers)
    stack.write_config(config)
    up_or_fail(stack)
    cluster = Cluster(lab, stack, server, workers[0], workers[1], workers[2], config)
    image = pod_hosts.busybox_image()
    for worker in workers:
        wait_until(
            f"{worker.name} imports the air-gap images",
            lambda w=worker: image in w.run([K3S, "ctr", "images", "ls", "-q"]).stdout,  # type: ignore[misc]
            60,
        )
    (server.root / "root/web.yaml").write_text(DEPLOYMENT.replace("IMAGE", image))
    kubectl(server, "apply", "-f", "/root/web.yaml")
    wait_until(
        "a web pod Ready on each worker", lambda: len(set(running_on(server).values())) == 3, 120, cluster.diagnose
    )
    cluster.timings["cluster"] = time.monotonic() - started
    return cluster


def test_the_workers_have_no_k3s_killall_script(cluster: Cluster) -> None:
    """Only k3s's install script writes /usr/local/bin/k3s-killall.sh, and the product installs
    k3s without it: its fence must stop the agent's containers and mounts with its own steps,
    so the lab's hosts have no such script either."""
    for worker in (cluster.w1, cluster.w2, cluster.w3):
        assert not (worker.root / "usr/local/bin/k3s-killall.sh").exists(), f"{worker.name} has k3s-killall.sh"


def test_a_worker_down_for_less_than_a_minute_is_refused(cluster: Cluster) -> None:
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    # Both agents stopped; their containers keep running, as on k3s.
    for worker in (w1, w2):
        worker.run(["systemctl", "stop", "k3s-agent"])
    assert w1.run(["pgrep", "-x", "httpd"], check=False).returncode == 0, "the pod stopped with the agent"
    wait_until(f"{w1.name} NotReady", lambda: ready_status(server, w1.name) != "True", 90, cluster.diagnose)
    output = cluster.fence({w1.name: {}})
    assert "fencing is refused" in output and f"{w1.name} has been NotReady for only" in output, output[-4000:]
    assert "a fence needs it down for at least 60 s" in output and "[refused: fence]" in output, output[-4000:]
    cluster.unchanged(w1)
    assert w1.run(["pgrep", "-x", "httpd"], check=False).returncode == 0, "a refused fence stopped a container"


def test_a_fence_killed_at_each_step_boundary_resumes_from_its_record(cluster: Cluster) -> None:
    """SIGKILL of the run and every process it started (as when the machine running it goes down)
    at each boundary between the fence's steps: right after the record, right after the host was
    stopped, right after the taint. Each time the record stays (one record, the first time) and
    what the steps before did stays done; the next run resumes from the record (the last kill's
    run here, then the fence's own test's `up`, which finishes it)."""
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    wait_until(f"{w2.name} NotReady", lambda: ready_status(server, w2.name) != "True", 60, cluster.diagnose)
    # The minute the fence asks for, by the Nodes' own record (both stopped at the same time).
    time.sleep(max(0.0, 62 - min(down_seconds(server, w.name) for w in (w1, w2))))
    cluster.write_fences({w1.name: {}})
    boundaries = [
        ("recorded", f"[{w1.name}] fence recorded on the Node"),
        ("stopped", f"[{w1.name}] no container, shim, Longhorn process or pod mount is left on the host"),
        ("tainted", f"[{w1.name}] tainted {OUT_OF_SERVICE}=nodeshutdown:NoExecute"),
    ]
    for step, line in boundaries:
        run = run_cli(cluster.stack, ["up", "--yes", "--skip-preview"], kill_when=line, crash=True)
        assert run.killed, f"not killed after {step}: {run.output[-4000:]}"
        found = node(server, w1.name)
        recorded = found["metadata"]["annotations"][FENCE_ANNOTATION]
        cluster.recorded_at = cluster.recorded_at or recorded
        assert recorded == cluster.recorded_at, f"a second record after the kill at {step}"
        tainted = OUT_OF_SERVICE in {t["key"] for t in found["spec"].get("taints") or []}
        # Right after the record the stop (seconds over SSH) still lies ahead, so no taint; right
        # after the stop the taint is a single API call away and may have landed before the kill.
        if step != "stopped":
            assert tainted == (step == "tainted"), f"killed after {step}: taints {found['spec'].get('taints')}"
        if step != "recorded":
            # The stop is done and holds: the drop-in written, the agent down.
            assert (w1.root / DROP_IN.lstrip("/")).exists(), f"no drop-in after the kill at {step}"
            assert w1.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() != "active"
            assert f"[{w1.name}] the fence recorded at {cluster.recorded_at} resumes" in run.output, run.output[-4000:]
        # As "When a run is interrupted" says: the killed run's lock, then its pending operations.
        assert run_cli(cluster.stack, ["cancel", "--yes"]).returncode == 0
        refresh = run_cli(cluster.stack, ["refresh", "--yes", "--skip-preview", "--clear-pending-creates"])
        assert refresh.returncode == 0, refresh.output[-3000:]


def route_through_the_router(cluster: Cluster, worker: Host) -> str:
    """The server reaches `worker` through a router, as a host in another network does: the
    machine's side of the lab's public bridge (it forwards, and answers for an address no machine
    answers ARP for with an ICMP host-unreachable of its own, Linux's arp_error_report). The server
    takes no ICMP redirect from it: a router between two networks sends none (this one shares one
    link with both ends). Returns the router's address."""
    router = cluster.lab.public_gateway
    ns = cluster.server.netns
    subprocess.run(["ip", "-n", ns, "route", "replace", f"{worker.public_ip}/32", "via", router], check=True)
    for setting in ("all", "eth0"):
        subprocess.run(
            ["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.conf.{setting}.accept_redirects=0"], check=True
        )
    assert (
        f" via {router} "
        in subprocess.run(
            ["ip", "-n", ns, "-o", "route", "get", str(worker.public_ip)], capture_output=True, text=True, check=True
        ).stdout
    )
    return router


def test_a_worker_that_does_not_answer_needs_powered_off_and_a_silent_kubelet(cluster: Cluster) -> None:
    w2 = cluster.w2
    cluster.router = route_through_the_router(cluster, w2)
    # fe-w2 stops answering over SSH, and something answers at its kubelet's port.
    w2.run(FAKE_KUBELET)
    w2.run(["nft", BLOCK_SSH])
    output = cluster.fence({w2.name: {}})
    assert f"{w2.name} does not answer over SSH" in output, output[-4000:]
    assert f"hk3s:fences.{w2.name}.powered_off: true" in output, output[-4000:]
    cluster.unchanged(w2)
    output = cluster.fence({w2.name: {"powered_off": True}})
    assert f"{w2.name}'s kubelet still answers at {w2.public_ip}:10250" in output, output[-4000:]
    cluster.unchanged(w2)
    # No kubelet there, but the host answers the dial: with an ICMP host-unreachable (a firewall's
    # reject), then with a TCP reset (a closed port). Either answer means a machine is up there.
    w2.run(["systemctl", "stop", "fake-kubelet"])
    w2.run(["nft", "add rule inet labblock input tcp dport 10250 reject with icmp type host-unreachable"])
    output = cluster.fence({w2.name: {"powered_off": True}})
    assert f"dial of {w2.name}'s kubelet at {w2.public_ip}:10250 was answered: an ICMP host-unreachable" in output, (
        output[-4000:]
    )
    # Through the router as well: the error came from fe-w2's own address, so fe-w2 is up.
    assert f"from {w2.public_ip} itself" in output, output[-4000:]
    cluster.unchanged(w2)
    w2.run(["nft", "flush chain inet labblock input; add rule inet labblock input tcp dport 22 reject with tcp reset"])
    output = cluster.fence({w2.name: {"powered_off": True}})
    assert f"{w2.public_ip}:10250 was answered: a TCP reset answered (connection refused)" in output, output[-4000:]
    cluster.unchanged(w2)
    w2.power_off()


def router_says_unreachable(cluster: Cluster, worker: Host) -> bool:
    """Whether the router answers a dial of `worker`'s kubelet with its own ICMP error, as seen
    from the server (host_scripts/icmp_answers.py). A router whose neighbour entry for the address
    is still STALE from before the power-off first sends to the old link address (5 s of delay and
    3 of probes) and only then says host-unreachable; once its entry has FAILED, each new dial is
    told within its ARP's 3 s."""
    script = script_path("icmp_answers.py").read_text()
    run = subprocess.run(
        ["ip", "netns", "exec", cluster.server.netns, "python3", "-", str(worker.public_ip), "10250", "10"],
        input=script,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return any(answer["from"] == cluster.router for answer in json.loads(run.stdout)["icmp"])


def test_fenced_workers_are_stopped_and_their_pods_start_elsewhere(cluster: Cluster) -> None:
    server, w1, w2, w3 = cluster.server, cluster.w1, cluster.w2, cluster.w3
    # The router knows fe-w2 is gone (its ARP failed), as a router does some seconds after a host died.
    wait_until("the router's host-unreachable for fe-w2", lambda: router_says_unreachable(cluster, w2), 60)
    started = time.monotonic()
    output = cluster.fence({w1.name: {}, w2.name: {"powered_off": True}})
    cluster.timings["fence up"] = time.monotonic() - started
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    print("\n".join(line for line in text.splitlines() if "fence" in line or "runs:" in line))
    # fe-w1's fence resumed from the record the killed run left: one record, the same time.
    assert f"[{w1.name}] the fence recorded at {cluster.recorded_at} resumes" in text, text[-4000:]
    assert node(server, w1.name)["metadata"]["annotations"][FENCE_ANNOTATION] == cluster.recorded_at
    assert f"[{w1.name}] fenced (recorded {cluster.recorded_at}, resumed" in text and "stopped over SSH" in text
    assert f"[{w2.name}] fenced (recorded" in text and "confirmed powered off" in text, text[-4000:]
    assert f"[{w2.name}] confirmed powered off; its kubelet at {w2.public_ip}:10250 is silent (" in text, text[-4000:]
    # Behind the router: its host-unreachable for fe-w2's address is no answer from fe-w2.
    silent = next(line for line in text.splitlines() if f"[{w2.name}] confirmed powered off;" in line)
    assert f"only {cluster.router}, a router on the way, answered: host-unreachable" in silent, silent
    for worker in (w1, w2):
        found = node(server, worker.name)
        assert FENCE_ANNOTATION in found["metadata"]["annotations"]
        assert {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"} in found["spec"]["taints"]
        assert not [p for p in web_pods(server) if p["spec"].get("nodeName") == worker.name]
    # The host the fence stopped: its agent held down, nothing of its pods left.
    assert w1.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() != "active"
    for process in ("containerd-shim", "httpd", "kubelet", "containerd"):
        assert w1.run(["pgrep", "-f", process], check=False).returncode != 0, f"{process} still runs on {w1.name}"
    mounts = w1.run(["cat", "/proc/self/mounts"]).stdout
    assert not [m for m in mounts.splitlines() if " /var/lib/kubelet/pods/" in m or " /run/k3s/" in m], mounts
    # The workload runs on the worker left.
    wait_until(
        "3 web pods Ready on fe-w3", lambda: list(running_on(server).values()) == [w3.name] * 3, 120, cluster.diagnose
    )
    states = {n.name: n.state for n in cluster.stack.api().nodes(live=True)}
    assert states[w1.name] == states[w2.name] == "OutOfService" and states[w3.name] == "Ready", states
    # Done is done: the next up changes nothing.
    result = up_or_fail(cluster.stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert set(changes) == {"same"}, changes


def test_the_drop_in_holds_the_agent_down_across_a_reboot(cluster: Cluster) -> None:
    w1 = cluster.w1
    boots = w1.boots
    w1.reboot()
    assert w1.boots > boots
    time.sleep(3)  # the agent would be starting now (it is enabled at boot)
    assert w1.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() != "active"
    assert w1.run(["pgrep", "-x", "kubelet"], check=False).returncode != 0
    condition = w1.run(["systemctl", "show", "k3s-agent", "-p", "ConditionResult"]).stdout.strip()
    assert condition == "ConditionResult=no", condition
    assert ready_status(cluster.server, w1.name) != "True"


def test_a_worker_whose_sshd_refuses_the_key_is_not_given_up(cluster: Cluster) -> None:
    """fe-w1, fenced over SSH (its Node NotReady, its agent held down), has an sshd that now refuses
    the program's key (as after a reinstall or an authorized_keys edit). A refused login is an
    answer: the host is up, and whether the fence still holds it is not known. So `node remove
    fe-w1 --force` is refused, naming the refused login, and nothing changes: the Node, its record
    and its taint stay, and the stack file is as it was."""
    server, w1 = cluster.server, cluster.w1
    found = node(server, w1.name)
    recorded = found["metadata"]["annotations"][FENCE_ANNOTATION]
    stack_file = cluster.stack.project / f"Pulumi.{cluster.stack.name}.yaml"
    before = stack_file.read_bytes()
    # sshd keeps the first value it reads: no authorized key is read from anywhere.
    w1.set_sshd_options(["AuthorizedKeysFile /dev/null"])
    try:
        refused = cluster.stack.hk3s("node", "remove", w1.name, "--force", "--yes")
    finally:
        w1.set_sshd_options([])
    assert refused.returncode == 3, refused.stderr[-4000:]
    said = " ".join(refused.stderr.split())
    assert f"{w1.name}: giving the worker up is refused: its host answers over SSH" in said, said[-4000:]
    assert "refused the key" in said and "is not silence" in said, said[-4000:]
    assert stack_file.read_bytes() == before
    found = node(server, w1.name)
    assert found["metadata"]["annotations"][FENCE_ANNOTATION] == recorded
    assert OUT_OF_SERVICE in {t["key"] for t in found["spec"].get("taints") or []}


def test_removing_the_fence_entry_rejoins_the_worker(cluster: Cluster) -> None:
    """fe-w1's entry removed (fe-w2's kept): the validation taint goes on before the out-of-service
    taint comes off, the drop-in goes, the agent starts, the join's checks pass, and the worker
    takes pods again."""
    server, w1, w2 = cluster.server, cluster.w1, cluster.w2
    started = time.monotonic()
    output = cluster.fence({w2.name: {"powered_off": True}})
    cluster.timings["lift up"] = time.monotonic() - started
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    validation_on = text.find(f"[{w1.name}] lifting the fence: hk3s.dev/validating=true:NoSchedule on")
    out_of_service_off = text.find(f"[{w1.name}] Ready again; {OUT_OF_SERVICE} removed")
    assert 0 <= validation_on < out_of_service_off, text[-4000:]
    assert out_of_service_off < text.find(f"[{w1.name}] validating while tainted"), text[-4000:]
    assert f"[{w1.name}] fence lifted: rejoined" in text, text[-4000:]
    found = node(server, w1.name)
    assert ready_status(server, w1.name) == "True"
    assert not {t["key"] for t in found["spec"].get("taints") or []} & {OUT_OF_SERVICE, "hk3s.dev/validating"}
    assert FENCE_ANNOTATION not in (found["metadata"].get("annotations") or {})
    assert not (w1.root / DROP_IN.lstrip("/")).exists()
    assert w1.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() == "active"
    # It takes pods again: a fourth replica goes to the worker with none (the spread).
    kubectl(server, "scale", "deployment/web", "--replicas=4")
    wait_until(f"a web pod Ready on {w1.name}", lambda: w1.name in running_on(server).values(), 90, cluster.diagnose)
    states = {n.name: n.state for n in cluster.stack.api().nodes(live=True)}
    assert states[w1.name] == "Ready" and states[w2.name] == "OutOfService", states
    print(f"timings: {cluster.timings}")


def test_a_fenced_worker_that_is_off_is_left_alone_by_a_join(cluster: Cluster) -> None:
    """fe-w2 stays fenced and powered off while one `up` joins a new worker: the access check of
    the recorded nodes leaves it out, and the run succeeds around it, its fence still recorded.
    (That an upgrade leaves it alone is shown without the lab: tests/node_operations/
    test_k3s_upgrade_plans.py and tests/providers/test_k3s_upgrade_plan.py. Pod-capable lab hosts
    run a real kubelet whose version is its own, so the stand-in's next release cannot move them.)"""
    server, w2 = cluster.server, cluster.w2
    w4 = cluster.lab.add_host(worker_spec("fe-w4"))
    cluster.lab.wait_ssh_ready([w4])
    cluster.config["workers"] = [
        *cluster.config["workers"],
        {"name": w4.name, "kind": "existing", "address": w4.public_ip},
    ]
    cluster.stack.write_config(cluster.config)
    cluster.stack.log.clear()
    up_or_fail(cluster.stack)
    text = cluster.stack.text()
    # The server's recorded workers, fe-w2 left out: fe-w1 and fe-w3.
    assert "checking SSH access to 2 recorded node(s) once for this run" in text, text[-4000:]
    assert f"[{w4.name}] joined and released" in text, text[-4000:]
    assert ready_status(server, w4.name) == "True"
    found = node(server, w2.name)
    assert FENCE_ANNOTATION in found["metadata"]["annotations"]
    assert OUT_OF_SERVICE in {t["key"] for t in found["spec"]["taints"]}


def test_a_fenced_worker_is_given_up_only_while_the_fence_holds_it(cluster: Cluster) -> None:
    """`node remove fe-w2` without --force is refused for a fenced worker; `node remove fe-w2
    --force` is refused while its host runs its agent (powered back on after a fence that confirmed
    it off: the fence does not hold it): first with its sshd masked, so SSH finds nothing, but its
    Node Ready and its kubelet answering; then answering over SSH. Nothing changes; once it is off
    again, it is deregistered without a drain, its fence entry kept with force_remove, and the next
    up has nothing to do."""
    server, w2 = cluster.server, cluster.w2
    # Its SSH back (the block is in its network namespace, which outlives a power-off), then on.
    subprocess.run(["ip", "netns", "exec", w2.netns, "nft", "delete", "table", "inet", "labblock"], check=True)
    w2.power_on(wait=True)
    wait_until(
        f"{w2.name}'s agent running",
        lambda: w2.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() == "active",
        60,
    )
    stack_file = cluster.stack.project / f"Pulumi.{cluster.stack.name}.yaml"
    before = stack_file.read_bytes()
    # Its sshd masked (connections refused) while its agent posts the Node Ready: SSH alone would
    # read as a host that is off.
    w2.run(["systemctl", "mask", "--now", "ssh.service"])
    wait_until(f"{w2.name} Ready", lambda: ready_status(server, w2.name) == "True", 90, cluster.diagnose)
    try:
        masked = cluster.stack.hk3s("node", "remove", w2.name, "--force", "--yes")
    finally:
        w2.run(["systemctl", "unmask", "ssh.service"])
        w2.run(["systemctl", "start", "ssh.service"])
        w2.wait_sshd_listening("after the unmask")
    assert masked.returncode == 3, masked.stderr[-4000:]
    said = " ".join(masked.stderr.split())
    assert f"{w2.name}: giving the worker up is refused: {w2.name}'s Node is Ready" in said, said[-4000:]
    assert stack_file.read_bytes() == before
    assert w2.name in {
        n["metadata"]["name"] for n in json.loads(kubectl(server, "get", "nodes", "-o", "json"))["items"]
    }
    # Without --force a fenced worker is not removed (drained and wiped), even while it answers.
    plain = cluster.stack.hk3s("node", "remove", w2.name, "--yes")
    assert plain.returncode == 3, plain.stderr[-4000:]
    assert f"removing the worker is refused: {w2.name} is fenced" in plain.stderr, plain.stderr[-4000:]
    assert stack_file.read_bytes() == before
    refused = cluster.stack.hk3s("node", "remove", w2.name, "--force", "--yes")
    assert refused.returncode == 3, refused.stderr[-4000:]
    assert "the fence does not hold it stopped (drop-in=absent, agent=active)" in refused.stderr, refused.stderr[-4000:]
    assert stack_file.read_bytes() == before
    assert FENCE_ANNOTATION in node(server, w2.name)["metadata"]["annotations"]
    w2.power_off()
    # Off again: a give-up needs its Node NotReady (the controller-manager's grace period) and its
    # kubelet silent.
    wait_until(f"{w2.name} NotReady", lambda: ready_status(server, w2.name) != "True", 90, cluster.diagnose)
    run = cluster.stack.hk3s("node", "remove", w2.name, "--force", "--yes")
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"[{w2.name}] given up (fenced since" in run.stderr, run.stderr[-4000:]
    assert "no fence left to lift" in run.stderr, run.stderr[-4000:]
    names = json.loads(kubectl(server, "get", "nodes", "-o", "json"))["items"]
    assert w2.name not in {n["metadata"]["name"] for n in names}
    secrets = kubectl(server, "get", "secrets", "-n", "kube-system", "-o", "name")
    assert f"{w2.name}.node-password.k3s" not in secrets
    config = stack_file.read_text()
    assert f"name: {w2.name}" not in config and "force_remove: true" in config, config
    result = up_or_fail(cluster.stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert set(changes) == {"same"}, changes


def test_a_worker_given_up_joins_again_once_added_back(cluster: Cluster) -> None:
    """fe-w2, given up with its host left as it was (the fence's drop-in still on its disk), is
    powered on and added back (its fence entry gone): the join removes the leftover drop-in, says
    so, and the worker joins (without that its agent never starts: systemd skips a unit whose
    ConditionPathExists fails, and the join times out waiting for its registration)."""
    server, w2 = cluster.server, cluster.w2
    w2.power_on(wait=True)
    # fe-w2's fence confirmed it powered off (no drop-in written); a worker fenced over SSH keeps the
    # drop-in the fence's own script writes, as fe-w2 now does once that script has run on it.
    (w2.root / "root/k3s_fence.sh").write_bytes(script_path("k3s_fence.sh").read_bytes())
    w2.run(["bash", "/root/k3s_fence.sh"], timeout=200)
    assert (w2.root / DROP_IN.lstrip("/")).exists()
    assert w2.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() != "active"
    # cluster.config still lists fe-w2 among the workers: written back, with no fence entry left.
    output = cluster.fence({})
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    assert f"[{w2.name}] removed a fence's drop-in left on the host" in text, text[-4000:]
    assert not (w2.root / DROP_IN.lstrip("/")).exists()
    assert ready_status(server, w2.name) == "True"
    assert FENCE_ANNOTATION not in (node(server, w2.name)["metadata"].get("annotations") or {})
