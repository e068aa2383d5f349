"""Fencing Hetzner workers through the Hetzner API, through the real Pulumi engine: lab hosts
registered as servers in the lab's Hetzner API stand-in (lab/hcloud_standin.py), which the
program reaches at hcloud:endpoint with the token in hcloud:token (a stack secret), through its
real client (remote_access/hetzner_api.py, Hetzner's own library) as it would reach Hetzner.

One cluster for the module (the tests run in order): a server and two existing workers that
name their Hetzner servers (hcloud_server: fh-w1 by id, fh-w2 by name), both agents stopped so
their Nodes go NotReady.
- fh-w1 first names the wrong Hetzner server (a typo): the control plane's, then fh-w3's. Each
  fence is refused before any power action, naming whose server it is; nothing is recorded.
- fh-w1 still answers over SSH: fenced with no powered_off. The drop-in goes on over SSH, then
  the stand-in sees one poweroff and the lab host is really off (no SSH, no process left); the
  Node has the fence record and the out-of-service taint; the token is nowhere in plain text.
- fh-w2 does not answer over SSH and its poweroff action fails (injected): the `up` fails naming
  the action's error; the fence is recorded and nothing else was done (no taint, the host
  running). Giving it up then (`node remove --force`) is refused: the fence did not complete,
  and its Node stays. With the failure gone, the next `up` resumes the fence and completes it.
- fh-w1 powered on again (as in Hetzner's console) and its fence entry removed: the worker
  rejoins (the drop-in gone, the Node Ready with neither taint nor record).
- fh-w3, no Hetzner server, is fenced over SSH beside fh-w1 (its boot recorded) and lifted beside
  it: still in the boot the fence recorded, it is rebooted before it rejoins; fh-w1, power-cycled
  since its fence, is not.
- fh-w2 still fenced and off: fh-w1 is rebooted through the API (a finished fence is no node down);
  fh-w3 with a fence recorded only on its Node is refused; a `node reboot fh-w3` killed at its drain
  is not resumed while fh-w1 is cordoned, then resumed and finished once it is not. fh-w3's agent
  stopped while fh-w1 drains stops fh-w1's reboot before its host goes down.
- fh-w2, still fenced and off, is unfenced through the API: its server is powered on through the
  Hetzner API, the API waits for SSH, and the run's lift rejoins it.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
import yaml
from pulumi import automation as auto

from lab.hcloud_standin import HcloudStandin, running_standin
from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec
from node_operations.fence import FENCE_ANNOTATION, FENCE_BOOT_ANNOTATION
from node_operations.reboot import REBOOT_ANNOTATION
from operator_api import MaintenanceError

pytestmark = pytest.mark.lab

K3S = "/usr/local/bin/k3s"
DROP_IN = "etc/systemd/system/k3s-agent.service.d/hk3s-fence.conf"
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
BLOCK_SSH = "add table inet labblock; add chain inet labblock input { type filter hook input priority -10; }; " + (
    "add rule inet labblock input tcp dport 22 reject with tcp reset"
)
FAILURE = ("action_failed", "the server's host is in maintenance")


def kubectl(server: Host, *args: str) -> str:
    return server.run([K3S, "kubectl", *args], timeout=60).stdout


def node(server: Host, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(server, "get", "node", name, "-o", "json"))
    return found


def ready(server: Host, name: str) -> dict[str, Any]:
    return next(c for c in node(server, name)["status"]["conditions"] if c["type"] == "Ready")


def wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(1)


def ssh_answers(host: Host) -> bool:
    try:
        with socket.create_connection((host.ssh_ip, 22), timeout=3) as connection:
            return connection.recv(4).startswith(b"SSH")
    except OSError:
        return False


@dataclass
class Cluster:
    stack: LabStack
    standin: HcloudStandin
    server: Host
    w1: Host
    w2: Host
    w3: Host
    ids: dict[str, int]
    config: dict[str, Any]

    def write(self) -> None:
        """The hk3s config; the stack file's other keys (hcloud:*, the secrets' salt) kept."""
        path = self.stack.project / f"Pulumi.{self.stack.name}.yaml"
        old = yaml.safe_load(path.read_text()) if path.exists() else {}
        self.stack.write_config(self.config)
        new = yaml.safe_load(path.read_text())
        new.update({key: value for key, value in (old or {}).items() if key != "config"})
        new["config"].update({k: v for k, v in ((old or {}).get("config") or {}).items() if not k.startswith("hk3s:")})
        path.write_text(yaml.safe_dump(new, sort_keys=False))

    def fence(self, fences: dict[str, dict[str, bool]]) -> str:
        """`up` with these fences; the run's output (it failed) or "" (it succeeded)."""
        self.config["fences"] = fences
        self.write()
        return self.stack.up_output()

    def not_fenced(self, worker: Host) -> None:
        found = node(self.server, worker.name)
        assert OUT_OF_SERVICE not in (found["spec"].get("taints") or []), found["spec"]


@pytest.fixture(scope="module")
def standin() -> Iterator[HcloudStandin]:
    with running_standin() as running:
        yield running


@pytest.fixture(scope="module")
def cluster(lab: Lab, standin: HcloudStandin, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("fh-srv"))
    w1, w2, w3 = (lab.add_host(worker_spec(name)) for name in ("fh-w1", "fh-w2", "fh-w3"))
    lab.wait_ssh_ready([server, w1, w2, w3])
    # The control plane and fh-w3 (fenced over SSH: no hcloud_server) are Hetzner servers too, which
    # a typo in a worker's hcloud_server may name.
    ids = {host.name: standin.add_server(f"lab-{host.name}", host) for host in (w1, w2, w3, server)}
    stack = LabStack(tmp_path_factory.mktemp("fence-hcloud-stack"))
    config = base_config(lab, server, [w1, w2, w3])
    # fh-w1 names its server by id, fh-w2 by name.
    config["workers"][0]["hcloud_server"] = ids[w1.name]
    config["workers"][1]["hcloud_server"] = f"lab-{w2.name}"
    cluster = Cluster(stack, standin, server, w1, w2, w3, ids, config)
    cluster.write()
    stack.stack().set_all_config(
        {
            "hcloud:token": auto.ConfigValue(standin.token, secret=True),
            "hcloud:endpoint": auto.ConfigValue(standin.url),
        }
    )
    up_or_fail(stack)
    return cluster


def test_a_hetzner_worker_is_powered_off_through_the_api_with_no_confirmation(cluster: Cluster) -> None:
    server, w1, w2, w3, standin = cluster.server, cluster.w1, cluster.w2, cluster.w3, cluster.standin
    for worker in (w1, w2, w3):  # all down now: fh-w2's minute runs while fh-w1 is fenced
        worker.run(["systemctl", "stop", "k3s-agent"])
    for worker in (w1, w2, w3):
        wait(f"{worker.name} NotReady", lambda w=worker: ready(server, w.name)["status"] != "True", 90)  # type: ignore[misc]
    since = datetime.fromisoformat(ready(server, w1.name)["lastTransitionTime"]).timestamp()
    time.sleep(max(0.0, since + 62 - float(server.run(["date", "+%s"]).stdout)))
    assert ssh_answers(w1)
    # A typo in hcloud_server naming the control plane's server, then fh-w3's (a bystander no worker
    # names; naming another worker's is a settings error): refused before any power action or
    # record, naming whose server it is.
    for wrong, whose in (
        (cluster.ids[server.name], "is the control plane's server"),
        (f"lab-{w3.name}", f"is {w3.name}'s server"),
    ):
        cluster.config["workers"][0]["hcloud_server"] = wrong
        output = cluster.fence({w1.name: {}})
        assert output, f"the fence of {w1.name} went on with hcloud_server {wrong}"
        assert f"{w1.name}: fencing is refused: Hetzner server" in output and whose in output, output[-6000:]
        assert "nothing was powered off" in output, output[-6000:]
        assert all(standin.power_actions(i) == [] for i in cluster.ids.values())
        assert server.is_running and w1.is_running and w2.is_running
        assert FENCE_ANNOTATION not in (node(server, w1.name)["metadata"].get("annotations") or {})
    cluster.config["workers"][0]["hcloud_server"] = cluster.ids[w1.name]
    started = time.monotonic()
    output = cluster.fence({w1.name: {}, w3.name: {}})
    elapsed = time.monotonic() - started
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    print(f"fence up: {elapsed:.1f} s\n" + "\n".join(line for line in text.splitlines() if f"[{w1.name}]" in line))
    # The drop-in went on over SSH first, then one poweroff through the API, waited for.
    assert text.find(f"[{w1.name}] stopping the k3s agent") < text.find(f"[{w1.name}] powering off Hetzner server")
    actions = standin.power_actions(cluster.ids[w1.name])
    assert [(a.command, a.status) for a in actions] == [("stop_server", "success")], actions
    assert (
        f"powered off through the Hetzner API (lab-{w1.name} (id {cluster.ids[w1.name]}): action {actions[0].id}"
        in text
    )
    # The host is really off: no SSH, no process of it left, and the drop-in on its disk.
    assert not w1.is_running and w1.leader_pid is None
    assert not ssh_answers(w1)
    assert (w1.root / DROP_IN).is_file()
    found = node(server, w1.name)
    assert FENCE_ANNOTATION in found["metadata"]["annotations"]
    assert OUT_OF_SERVICE in found["spec"]["taints"]
    # The token is a secret: neither the run's output nor the state holds it in plain text.
    assert standin.token not in text
    state = "".join(path.read_text() for path in (cluster.stack.directory / "state").rglob("*.json"))
    assert state and standin.token not in state
    assert w2.is_running and standin.power_actions(cluster.ids[w2.name]) == []
    # fh-w3 (no Hetzner server) was stopped over SSH and stays up; both fences recorded the boot.
    assert f"[{w3.name}] fenced (recorded" in text and "stopped over SSH" in text, text[-4000:]
    assert w3.is_running and (w3.root / DROP_IN).is_file()
    for worker in (w1, w3):
        assert node(server, worker.name)["metadata"]["annotations"][FENCE_BOOT_ANNOTATION]


def test_a_failed_power_off_stops_the_fence_naming_the_actions_error(cluster: Cluster) -> None:
    server, w2, standin = cluster.server, cluster.w2, cluster.standin
    w2_id = cluster.ids[w2.name]
    w2.run(["nft", BLOCK_SSH])  # fh-w2 no longer answers over SSH
    standin.fail_actions(w2_id, *FAILURE)
    fences: dict[str, dict[str, bool]] = {cluster.w1.name: {}, w2.name: {}, cluster.w3.name: {}}
    output = cluster.fence(fences)
    assert output, "the up succeeded with a failed poweroff action"
    print("\n".join(line for line in output.splitlines() if "poweroff action" in line)[-3000:])
    action = standin.power_actions(w2_id)[0]
    assert action.status == "error"
    expected = f"the poweroff action {action.id} (stop_server) of Hetzner server lab-{w2.name} (id {w2_id}) ended"
    assert expected in output and f"{FAILURE[0]}: {FAILURE[1]}" in output, output[-6000:]
    assert "the fence is recorded but powering the host off did not finish" in output, output[-6000:]
    assert f"hk3s:fences.{w2.name}.powered_off" not in output  # no confirmation asked of the operator
    # Recorded, and nothing else: no taint, the host still running.
    recorded = node(server, w2.name)["metadata"]["annotations"][FENCE_ANNOTATION]
    cluster.not_fenced(w2)
    assert w2.is_running

    # Recorded but not complete (the host may run): giving it up is refused, and nothing changes.
    stack_file = cluster.stack.project / f"Pulumi.{cluster.stack.name}.yaml"
    before = stack_file.read_bytes()
    refused = cluster.stack.hk3s("node", "remove", w2.name, "--force", "--yes")
    assert refused.returncode == 3, refused.stderr[-4000:]
    assert f"the fence of {w2.name} recorded at {recorded} did not complete" in refused.stderr, refused.stderr[-4000:]
    assert "Finish the fence first" in refused.stderr, refused.stderr[-4000:]
    assert stack_file.read_bytes() == before
    assert node(server, w2.name)["metadata"]["annotations"][FENCE_ANNOTATION] == recorded
    # The CLI's refused change puts the stack file back and runs up on it again, which resumes the
    # recorded fence: one more poweroff, failed as the failure is still injected; still no taint.
    assert "the stack file is put back" in refused.stderr, refused.stderr[-4000:]
    assert [a.status for a in standin.power_actions(w2_id)] == ["error", "error"] and w2.is_running
    cluster.not_fenced(w2)

    standin.clear_failures(w2_id)
    output = cluster.fence(fences)
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    assert f"[{w2.name}] the fence recorded at {recorded} resumes" in text, text[-4000:]
    assert [a.status for a in standin.power_actions(w2_id)] == ["error", "error", "success"]
    assert not w2.is_running
    found = node(server, w2.name)
    assert found["metadata"]["annotations"][FENCE_ANNOTATION] == recorded
    assert OUT_OF_SERVICE in found["spec"]["taints"]
    assert len(standin.power_actions(cluster.ids[cluster.w1.name])) == 1  # fh-w1's fence stays done


def test_lifting_the_fences_rejoins_the_workers_rebooting_one_not_booted_since(cluster: Cluster) -> None:
    server, w1, w2, w3, standin = cluster.server, cluster.w1, cluster.w2, cluster.w3, cluster.standin
    boots = w3.boots
    # As the operator would in Hetzner's console: a fenced worker the fence powered off is powered on
    # before its entry goes (the run's access check of the recorded nodes needs it to answer).
    w1.power_on(wait=True)
    started = time.monotonic()
    output = cluster.fence({w2.name: {}})
    elapsed = time.monotonic() - started
    if output:
        pytest.fail(output[-8000:])
    text = cluster.stack.text()
    print(f"lift up: {elapsed:.1f} s\n" + "\n".join(line for line in text.splitlines() if f"[{w1.name}]" in line))
    assert f"[{w1.name}] fence lifted: rejoined" in text, text[-4000:]
    assert w1.is_running and not (w1.root / DROP_IN).exists()
    found = node(server, w1.name)
    assert ready(server, w1.name)["status"] == "True"
    assert FENCE_ANNOTATION not in (found["metadata"].get("annotations") or {})
    assert not {t["key"] for t in found["spec"].get("taints") or []} & {OUT_OF_SERVICE["key"], "hk3s.dev/validating"}
    # fh-w1 was power-cycled since its fence; fh-w3 was still in the boot its fence recorded.
    assert f"[{w1.name}] it has booted since the fence: no reboot needed" in text, text[-4000:]
    assert f"[{w3.name}] it has not booted since the fence" in text, text[-4000:]
    assert w3.boots > boots and f"[{w3.name}] fence lifted: rejoined" in text, text[-4000:]
    assert ready(server, w3.name)["status"] == "True" and not (w3.root / DROP_IN).exists()
    for worker in (w1, w3):
        assert FENCE_BOOT_ANNOTATION not in (node(server, worker.name)["metadata"].get("annotations") or {})
    # fh-w2 stays fenced and off.
    assert not w2.is_running and standin.power_actions(cluster.ids[w2.name], "start_server") == []


def test_a_finished_fence_blocks_no_reboot_and_the_nodes_record_and_a_resume_are_checked(cluster: Cluster) -> None:
    """fh-w2 fenced and off (NotReady by design, tainted out of service): fh-w1 is rebooted through
    the API all the same (a finished fence is not a node down; the yearly reboot the certificates
    need stays possible). fh-w3 with a fence recorded on its Node that the stack file does not name
    (as a fence whose entry is gone leaves it until the lift runs) is refused, nothing changed. A
    `node reboot fh-w3` killed at its drain is not resumed while fh-w1 is cordoned (never two nodes
    down at once, checked again on the resume): fh-w3 stays cordoned and recorded, not rebooted;
    with fh-w1 uncordoned the next `node reboot` resumes it and finishes."""
    server, w1, w2, w3 = cluster.server, cluster.w1, cluster.w2, cluster.w3
    fenced = node(server, w2.name)
    assert FENCE_ANNOTATION in fenced["metadata"]["annotations"] and OUT_OF_SERVICE in fenced["spec"]["taints"]
    assert ready(server, w2.name)["status"] != "True"

    boots = w1.boots
    lines: list[str] = []
    report = cluster.stack.api().reboot_worker(w1.name, on_output=lines.append)
    assert w1.boots > boots, "\n".join(lines)
    assert report.node == w1.name and not report.resumed, report
    assert ready(server, w1.name)["status"] == "True" and not node(server, w1.name)["spec"].get("unschedulable")

    # The fence's record on fh-w3's Node, not in the stack file: the record is what the reboot reads.
    recorded = "2026-12-04T23:00:00Z"
    kubectl(server, "annotate", "node", w3.name, f"{FENCE_ANNOTATION}={recorded}")
    with pytest.raises(MaintenanceError) as refused:
        cluster.stack.api().reboot_worker(w3.name)
    message = str(refused.value)
    assert refused.value.put_back, message
    assert f"{w3.name} has a fence recorded on its Node ({FENCE_ANNOTATION}={recorded})" in message, message
    assert f"hk3s:fences.{w3.name}" in message, message
    found = node(server, w3.name)
    assert not found["spec"].get("unschedulable") and REBOOT_ANNOTATION not in found["metadata"]["annotations"]
    kubectl(server, "annotate", "node", w3.name, f"{FENCE_ANNOTATION}-")

    # Killed at its drain: cordoned and recorded, its host not rebooted yet.
    boots = w3.boots
    killed = cluster.stack.hk3s("node", "reboot", w3.name, kill_when=f"[{w3.name}] draining:")
    assert killed.killed, killed.stderr[-4000:]
    assert REBOOT_ANNOTATION in node(server, w3.name)["metadata"]["annotations"]
    # Another node goes into maintenance meanwhile.
    kubectl(server, "cordon", w1.name)
    held = cluster.stack.hk3s("node", "reboot", w3.name)
    assert held.returncode == 1, held.stderr[-4000:]
    assert "the reboot recorded on its Node is not resumed" in held.stderr, held.stderr[-4000:]
    assert f"{w1.name} is cordoned (draining or in maintenance): never two nodes down at once" in held.stderr
    assert f"reboot {w3.name} again to finish" in held.stderr, held.stderr[-4000:]
    found = node(server, w3.name)
    assert found["spec"].get("unschedulable") and REBOOT_ANNOTATION in found["metadata"]["annotations"]
    assert w3.boots == boots, "the reboot went on with another node in maintenance"
    # fh-w1 back in service: the same command resumes and finishes.
    kubectl(server, "uncordon", w1.name)
    done = cluster.stack.hk3s("node", "reboot", w3.name)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"[{w3.name}] resuming the reboot recorded on its Node" in done.stderr, done.stderr[-4000:]
    assert w3.boots > boots
    found = node(server, w3.name)
    assert not found["spec"].get("unschedulable") and REBOOT_ANNOTATION not in found["metadata"]["annotations"]
    assert ready(server, w3.name)["status"] == "True"


def test_another_worker_down_after_the_drain_stops_the_reboot(cluster: Cluster) -> None:
    """fh-w3's agent stops while fh-w1 drains for its reboot (its Node still reads Ready for the
    node monitor's grace period): right before the host is rebooted, every other node is read
    again, its kubelet itself included, so fh-w3 is seen down and the reboot stops naming it;
    fh-w1 is uncordoned again, its reboot record gone, its host not rebooted."""
    server, w1, w3 = cluster.server, cluster.w1, cluster.w3
    assert ready(server, w3.name)["status"] == "True"
    boots = w1.boots
    lines: list[str] = []

    def stop_w3_at_the_drain(line: str) -> None:
        lines.append(line)
        if f"[{w1.name}] draining:" in line:
            w3.run(["systemctl", "stop", "k3s-agent"])

    try:
        with pytest.raises(MaintenanceError) as stopped:
            cluster.stack.api().reboot_worker(w1.name, on_output=stop_w3_at_the_drain)
        message = str(stopped.value)
        assert stopped.value.put_back, message
        assert f"{w3.name}'s kubelet does not answer" in message, message
        assert "never two nodes down at once" in message and f"{w1.name} is uncordoned again" in message, message
        assert w1.boots == boots, "fh-w1 was rebooted with fh-w3 down"
        found = node(server, w1.name)
        assert not found["spec"].get("unschedulable") and REBOOT_ANNOTATION not in found["metadata"]["annotations"]
    finally:
        w3.run(["systemctl", "start", "--no-block", "k3s-agent"])
    healthz = f"/api/v1/nodes/{w3.name}/proxy/healthz"
    wait(
        f"{w3.name}'s kubelet answering again",
        lambda: server.run([K3S, "kubectl", "get", "--raw", healthz], check=False).returncode == 0,
        90,
    )
    wait(f"{w3.name} Ready again", lambda: ready(server, w3.name)["status"] == "True", 90)


def test_unfence_through_the_api_powers_a_hetzner_worker_on_before_it_rejoins(cluster: Cluster) -> None:
    """`ClusterStack.unfence` of fh-w2, fenced and powered off through the Hetzner API: the API
    powers its server on through the same API, waits for SSH, then the run lifts the fence."""
    server, w2, standin = cluster.server, cluster.w2, cluster.standin
    w2_id = cluster.ids[w2.name]
    assert not w2.is_running
    # A real server's power cycle drops the nftables rules set at run time (the SSH block); the lab
    # keeps a host's network namespace while it is off, so the block goes as its boot would take it.
    w2.netns_run(["nft", "delete", "table", "inet", "labblock"])
    lines: list[str] = []
    cluster.stack.api().unfence(w2.name, on_output=lines.append)
    text = "\n".join(lines)
    assert [a.status for a in standin.power_actions(w2_id, "start_server")] == ["success"], text[-4000:]
    assert f"hk3s: {w2.name}: Hetzner server lab-{w2.name} powered on" in text, text[-4000:]
    assert f"hk3s: {w2.name} answers over SSH" in text, text[-4000:]
    assert f"[{w2.name}] fence lifted: rejoined" in text, text[-4000:]
    assert w2.is_running and ready(server, w2.name)["status"] == "True"
    found = node(server, w2.name)
    assert FENCE_ANNOTATION not in (found["metadata"].get("annotations") or {})
    assert not {t["key"] for t in found["spec"].get("taints") or []} & {OUT_OF_SERVICE["key"], "hk3s.dev/validating"}
    # The token is a secret of the stack: nowhere in what the API said.
    assert standin.token not in text
