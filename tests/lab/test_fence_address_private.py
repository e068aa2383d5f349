"""Private mode: a worker whose public (SSH) address changed while it was fenced is rejoined at
the new address and then publishes it, through the real Pulumi engine on lab hosts (real SSH, the
real API server, the k3s stand-in; the cluster talks over the lab's private bridge).

One cluster for the module: a server and fpr-w1 in private mode, fpr-w1's agent stopped and
fenced over SSH. Its public address then moves on the host (the old one gone from it):
- the `up` with the new address in hk3s:workers stores it in the fence and leaves the join as it
  is, naming what waits; nothing on the host changes;
- the `up` that removes the fence entry lifts the fence at the new address (the private path
  unchanged, so the peers still reach it): Ready, no fence record, no taint, no drop-in; the
  join still waits (it ran before the lift), and the lift's last line says to run up again;
- that next `up` runs the join's pending change: the Node publishes the new address as its
  ExternalIP (node-external-ip), its InternalIP still the private one; then nothing is left.
Then fpr-w1's agent stops, and hk3s:workers names as its Hetzner server (hcloud_server) a bystander
in another Hetzner network holding fpr-w1's private address (the cluster's address of it): the
fence is refused before any power action, naming the bystander and its network; the bystander
keeps running. Last, a pod volume mount whose device stopped answering (the lab's slow disk, frozen) is on
fpr-w1 when it is fenced again: the fence takes it off within its deadline and names it. Its
client certificate then expires while it is fenced: the lift brings it back with a fresh token."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from pulumi import automation as auto

from lab import slow_disk
from lab.hcloud_standin import SwitchedMachine, running_standin
from lab.hosts import DEFAULT_CACHE_DIR, Lab
from lab.stack_harness import up_or_fail, wait_until
from node_operations.fence import FENCE_SCRIPT_DEADLINE_SECONDS
from tests.lab.agent_certificate import AGENT_DIR, expire_client_certificate
from tests.lab.fenced_worker import K3S, OUT_OF_SERVICE, FencedCluster, fenced_cluster

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> FencedCluster:
    cluster = fenced_cluster(lab, tmp_path_factory, "fpr", mode="auto")
    nodes = {node["name"]: node for node in cluster.stack.stack().outputs()["nodes"].value}
    assert nodes[cluster.worker.name]["network_mode"] == "private", nodes
    return cluster


@pytest.fixture(scope="module")
def moved(cluster: FencedCluster) -> dict[str, str]:
    new = cluster.new_public_address()
    old = cluster.move_public_address(new)
    return {"old": old, "new": new}


def test_the_new_address_is_recorded_and_the_join_waits(cluster: FencedCluster, moved: dict[str, str]) -> None:
    worker, old, new = cluster.worker, moved["old"], moved["new"]
    assert cluster.addresses() == {"InternalIP": worker.private_ip, "ExternalIP": old, "Hostname": worker.name}
    recorded_at, config_before = cluster.fence_record(), cluster.agent_config()
    cluster.timed_up()
    text = cluster.stack.text()
    assert (
        f"[{worker.name}] fenced (recorded {recorded_at}): its join changes nothing on the host while it is fenced; "
        f"pending until the first up after the fence is lifted: address {old} -> {new}, node_external_ip {old} -> {new}"
        in text
    ), text[-4000:]
    assert f"[{worker.name}] fenced: its address is now {new} (was {old}); lifting the fence logs in there" in text
    assert cluster.agent_config() == config_before and cluster.drop_in() and not cluster.agent_active()
    assert cluster.fence_record() == recorded_at and OUT_OF_SERVICE in cluster.taints()


def test_the_lift_rejoins_at_the_new_address_and_says_to_run_up_again(
    cluster: FencedCluster, moved: dict[str, str]
) -> None:
    worker, old, new = cluster.worker, moved["old"], moved["new"]
    cluster.config["fences"] = {}
    _, elapsed = cluster.timed_up()
    text = cluster.stack.text()
    lines = [line for line in text.splitlines() if f"[{worker.name}]" in line]
    print(f"lift up: {elapsed:.1f} s\n" + "\n".join(lines))
    # The join ran before the lift (the engine runs the fence's delete last) and left the worker alone.
    waiting = text.find(f"[{worker.name}] fenced (recorded")
    lifting = text.find(f"[{worker.name}] lifting the fence: hk3s.dev/validating=true:NoSchedule on")
    assert 0 <= waiting < lifting, text[-4000:]
    last = next(line for line in reversed(lines) if "fence lifted: rejoined" in line)
    assert (
        f"Its Node still publishes {old} as its external address (the agent's /etc/rancher/k3s/config.yaml) and its "
        f"join now has {new}: run up again, which joins it again so its Node publishes {new}" in last
    ), last
    # Lifted: Ready over the private network, no record, no taint, no drop-in, the agent running.
    assert cluster.ready() and cluster.fence_record() is None
    assert not cluster.taints() & {OUT_OF_SERVICE, "hk3s.dev/validating"}, cluster.taints()
    assert not cluster.drop_in() and cluster.agent_active()
    assert cluster.addresses()["InternalIP"] == worker.private_ip
    assert cluster.addresses()["ExternalIP"] == old


def test_the_next_up_publishes_the_new_address(cluster: FencedCluster, moved: dict[str, str]) -> None:
    worker, new = cluster.worker, moved["new"]
    _, elapsed = cluster.timed_up()
    text = cluster.stack.text()
    print(f"join up: {elapsed:.1f} s")
    assert f"[{worker.name}] joined and released" in text, text[-4000:]
    assert f"[{worker.name}] fenced (recorded" not in text
    assert f"node-external-ip: {new}" in cluster.agent_config().decode()
    assert cluster.ready()
    assert cluster.addresses() == {"InternalIP": worker.private_ip, "ExternalIP": new, "Hostname": worker.name}
    result = up_or_fail(cluster.stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert set(changes) == {"same"}, changes


# Another Hetzner network than any of the cluster's: a bystander's (every project's networks start at
# 10.0.0.0/16 by default, so a private address repeats across networks).
BYSTANDER_NETWORK = 990001


def test_a_server_in_another_network_with_the_workers_private_address_is_not_powered_off(
    cluster: FencedCluster,
) -> None:
    """fpr-w1 is down (its agent stopped) and its hcloud_server names a bystander: a Hetzner server
    (the lab's Hetzner API stand-in; a machine that is only its power switch) in another network
    whose private_net holds fpr-w1's private address, the address the cluster knows fpr-w1 by (its
    Node's InternalIP, its kubelet's address). A private address is unique only within its network,
    so it proves nothing about a server in another: the fence is refused before any power action,
    naming the bystander, its network and the fix; the bystander runs on, nothing is recorded.
    fpr-w1 is left down and unfenced for the next test's fence."""
    worker = cluster.worker
    assert worker.private_ip and cluster.addresses()["InternalIP"] == worker.private_ip
    with running_standin() as standin:
        bystander = SwitchedMachine()
        bystander_id = standin.add_server(
            "lab-bystander", bystander, public_ipv4=None, private_ips=(worker.private_ip,), network=BYSTANDER_NETWORK
        )
        worker.run(["systemctl", "stop", "k3s-agent"])
        wait_until(f"{worker.name} NotReady", lambda: not cluster.ready(), 90, cluster.diagnose)
        ready = next(c for c in cluster.node()["status"]["conditions"] if c["type"] == "Ready")
        since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()
        time.sleep(max(0.0, since + 62 - float(cluster.server.run(["date", "+%s"]).stdout)))
        cluster.config["workers"][0]["hcloud_server"] = "lab-bystander"
        cluster.config["fences"] = {worker.name: {}}
        cluster.write()
        cluster.stack.stack().set_all_config(
            {
                "hcloud:token": auto.ConfigValue(standin.token, secret=True),
                "hcloud:endpoint": auto.ConfigValue(standin.url),
            }
        )
        output = cluster.stack.up_output()
        assert bystander.is_running and standin.power_actions(bystander_id) == [], output[-6000:]
    assert output, "the fence went on with a bystander's server"
    print("\n".join(line for line in output.splitlines() if "fencing is refused" in line)[-3000:])
    assert f"{worker.name}: fencing is refused: Hetzner server lab-bystander (id {bystander_id}" in output, output[
        -6000:
    ]
    assert f"{worker.private_ip} only in Hetzner network {BYSTANDER_NETWORK}" in output, output[-6000:]
    assert "nothing was powered off" in output, output[-6000:]
    assert cluster.fence_record() is None and OUT_OF_SERVICE not in cluster.taints()
    # The worker stays down and unfenced, its own entry back to what it was.
    del cluster.config["workers"][0]["hcloud_server"]
    cluster.config["fences"] = {}


# Where Kubernetes mounts a pod's CSI volume (Longhorn's block device, bound from its staging mount).
POD_VOLUME = "/var/lib/kubelet/pods/5d0b8c1e-0000-4000-8000-000000000001/volumes/kubernetes.io~csi/pvc-frozen/mount"


def test_a_fence_takes_off_a_mount_whose_device_stopped_answering_within_its_deadline(cluster: FencedCluster) -> None:
    """A pod's volume mount whose device stopped answering (a Longhorn volume whose iSCSI target
    went with its instance manager) cannot hold the fence past its deadline: the lab's slow disk
    (a FUSE filesystem) is bound into fpr-w1 at a pod's CSI volume path and frozen, so a stat of it,
    or a plain `umount` (which resolves the path first), waits for an answer that never comes. The
    fence of fpr-w1 finishes well within its deadline, takes the mount off without a flush, and says
    which mount that was."""
    worker = cluster.worker
    # The test before left fpr-w1 down (its agent stopped) and unfenced: this fence takes it from there.
    assert not cluster.fence_record(), cluster.diagnose()
    # Under the lab's run directory: the lab's teardown ends its daemon and its mounts.
    disk = slow_disk.SlowDisk(cluster.lab.run_dir / f"{worker.name}-frozen-volume")
    disk.start(DEFAULT_CACHE_DIR, 0)
    leader = worker.leader_pid
    assert leader is not None
    slow_disk.attach(disk, leader, POD_VOLUME)
    (disk.mount_point / "data").write_text("written before the device went\n")
    assert f" {POD_VOLUME} fuse.slow-disk " in worker.run(["cat", "/proc/self/mounts"]).stdout
    slow_disk.freeze(disk)
    try:
        stat = worker.run(["timeout", "3", "stat", POD_VOLUME], check=False)
        assert stat.returncode == 124, stat  # no answer: timed out after its 3 s
        started = time.monotonic()
        cluster.fence()  # fails the test with the run's output when the fence does not finish
        elapsed = time.monotonic() - started
    finally:
        slow_disk.thaw(disk)
    text = cluster.stack.text()
    print("\n".join(line for line in text.splitlines() if f"[{worker.name}]" in line))
    assert f"[{worker.name}] unmounted without a flush, their filesystem not answering within the" in text, text[-4000:]
    assert POD_VOLUME in next(line for line in text.splitlines() if "unmounted without a flush" in line)
    assert "no container, shim, Longhorn process or pod mount is left on the host" in text, text[-4000:]
    assert POD_VOLUME not in worker.run(["cat", "/proc/self/mounts"]).stdout
    # The stop, the minute's wait and the fence's `up` together, far from the script's own deadline
    # added to them (a hung unmount would have held the fence there, and then failed it).
    assert elapsed < FENCE_SCRIPT_DEADLINE_SECONDS + 62, elapsed
    print(f"timings: fence with a frozen volume mount {elapsed:.1f} s (stop, a minute's wait, up)")


def test_a_worker_whose_certificate_expired_while_fenced_is_lifted_with_a_fresh_token(cluster: FencedCluster) -> None:
    """fpr-w1, fenced by the test before, has its kubelet client certificate expire while it is
    fenced (tests/lab/agent_certificate.py): its join token was spent at the join, so the agent has
    nothing left to authenticate with. The lift writes a fresh one-time token before the agent
    starts, waits until the agent holds a new certificate, deletes the token, and the worker is Ready
    and unfenced; no bootstrap token is left on the server."""
    worker = cluster.worker
    assert cluster.fence_record() and not cluster.agent_active(), cluster.diagnose()
    expire_client_certificate(cluster.server, worker)
    # The API server caches a token it accepted for 10 s (kube-apiserver's token cache).
    time.sleep(11)
    cluster.config["fences"] = {}
    cluster.stack.log.clear()
    _, lift_up = cluster.timed_up()
    text = cluster.stack.text()
    expired = f"[{worker.name}] its agent's client certificate /{AGENT_DIR}/client-kubelet.crt expired at"
    assert expired in text and "a fresh join token brings it a new certificate" in text, text[-4000:]
    assert f"[{worker.name}] the agent holds a new client certificate" in text, text[-4000:]
    assert f"[{worker.name}] fence lifted: rejoined" in text, text[-4000:]
    assert cluster.ready() and cluster.fence_record() is None and not cluster.drop_in()
    cert = x509.load_pem_x509_certificate(worker.run(["cat", f"/{AGENT_DIR}/client-kubelet.crt"]).stdout.encode())
    assert cert.not_valid_after_utc > datetime.now(UTC) + timedelta(days=300), cert.not_valid_after_utc
    types = cluster.server.run(
        [K3S, "kubectl", "get", "secrets", "-n", "kube-system", "-o", "jsonpath={.items[*].type}"]
    ).stdout
    assert "bootstrap.kubernetes.io/token" not in types, types
    print(f"timings: lift of a worker whose certificate expired while fenced {lift_up:.1f} s")
