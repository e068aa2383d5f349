"""Public mode: a worker whose address changed while it was fenced is not rejoined there, through
the real Pulumi engine on lab hosts (real SSH, the real API server, the k3s stand-in).

One cluster for the module: a server and fpu-w1 in public mode, fpu-w1's agent stopped and
fenced over SSH. Its public address then moves on the host (the old one gone from it), and
hk3s:workers gets the new one: that `up` stores the new address in the fence and leaves the join
as it is (a fenced worker's join changes nothing on its host). With the fence entry removed the
lift is refused, naming the node IP it joined with, the host's address now and the fix, and
nothing changed: the fence record, the out-of-service taint, the agent's configuration and the
drop-in all stay. Then the host gets its address back and the worker is fenced across an upgrade:
after its lift, the next `up` moves it to the server's release. Last, the worker's host is powered
off while an upgrade and a label wait in its join: it is fenced all the same, the change kept
pending and said so, and applied by the first `up` after the lift."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.hosts import Host, Lab
from lab.stack_harness import k3s_release, skip_without_lab_binaries, up_or_fail, wait_until
from tests.lab.fenced_worker import K3S, OUT_OF_SERVICE, FencedCluster, fenced_cluster

pytestmark = pytest.mark.lab

LABEL = "example.com/tier"


def logs_in(host: Host, key: Path) -> bool:
    """A real `ssh` login to the host with `key` only (host key checked)."""
    argv = host.ssh_argv("true")
    argv[argv.index("-i") + 1] = str(key)
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0


def fingerprint(key: Path) -> str:
    """The SHA256 fingerprint of a key pair's public half, as ssh-keygen prints it."""
    listed = subprocess.run(["ssh-keygen", "-l", "-f", f"{key}.pub"], capture_output=True, text=True, check=True)
    return listed.stdout.split()[1]


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> FencedCluster:
    return fenced_cluster(lab, tmp_path_factory, "fpu", mode="public")


def test_a_new_address_in_public_mode_is_refused_at_the_lift_and_nothing_changes(cluster: FencedCluster) -> None:
    worker = cluster.worker
    recorded_at = cluster.fence_record()
    config_before = cluster.agent_config()
    new = cluster.new_public_address()
    old = cluster.move_public_address(new)
    assert f"node-ip: {old}" in config_before.decode(), config_before

    _, recorded_up = cluster.timed_up()
    text = cluster.stack.text()
    # The join waits, naming what: the host is not touched.
    assert (
        f"[{worker.name}] fenced (recorded {recorded_at}): its join changes nothing on the host while it is fenced; "
        f"pending until the first up after the fence is lifted: address {old} -> {new}" in text
    ), text[-4000:]
    assert f"[{worker.name}] fenced: its address is now {new} (was {old}); lifting the fence logs in there" in text
    assert cluster.agent_config() == config_before and cluster.drop_in() and not cluster.agent_active()
    assert cluster.fence_record() == recorded_at

    # The entry removed: the lift logs in at the new address and refuses it.
    cluster.config["fences"] = {}
    output, lift_up = cluster.timed_up(succeed=False)
    assert f"{worker.name}: lifting the fence is refused: {worker.name}'s address changed while it was fenced" in (
        output
    ), output[-6000:]
    assert f"it joined with node IP {old} (/etc/rancher/k3s/config.yaml), and the host now has {new}/" in output
    assert f"Give the host {old} back" in output and f"node remove {worker.name} --force" in output, output[-6000:]
    assert "Nothing was changed" in output and "[refused: fence]" in output, output[-6000:]
    # Nothing changed: the record, the taint, the agent's configuration, the drop-in, the agent down.
    assert cluster.fence_record() == recorded_at
    assert OUT_OF_SERVICE in cluster.taints() and "hk3s.dev/validating" not in cluster.taints()
    assert cluster.agent_config() == config_before
    assert cluster.drop_in() and not cluster.agent_active()
    print(next(line for line in output.splitlines() if "lifting the fence is refused" in line))
    print(f"timings: up with the new address {recorded_up:.1f} s, refused lift {lift_up:.1f} s")


def kubelet_version(node: dict[str, Any]) -> str:
    return str(node["status"]["nodeInfo"]["kubeletVersion"])


def test_a_worker_fenced_across_an_upgrade_reaches_the_release_after_its_lift(cluster: FencedCluster) -> None:
    """A worker fenced across an upgrade is never left behind the server after its lift. fpu-w1,
    still fenced (the lift of the test before was refused), gets its address back, its fence entry
    back, and the cluster moves to the stand-in's patch release: the server moves, fpu-w1 is left
    alone at its release (its agent held down). With the entry removed the lift rejoins it at the
    release its host has and its last line says to run up again; that `up` moves it to the
    server's release in place (as an upgrade moves a worker: no rejoin) and its Node is Ready at it."""
    skip_without_lab_binaries("k3s-patch")
    worker = cluster.worker
    joined_at = str(yaml.safe_load(cluster.agent_config())["node-ip"])
    if cluster.config["workers"][0]["address"] != joined_at:
        cluster.move_public_address(joined_at, old=cluster.config["workers"][0]["address"])
    old = kubelet_version(cluster.node())
    release = k3s_release("k3s-patch")
    new = release["k3s_version"]
    assert old != new
    cluster.config["fences"] = {worker.name: {}}
    cluster.config["cluster"].update(release)
    cluster.stack.log.clear()
    _, upgrade_up = cluster.timed_up()
    text = cluster.stack.text()
    assert f"fenced, left alone at their release: {worker.name}" in text, text[-4000:]
    server = json.loads(cluster.server.run([K3S, "kubectl", "get", "node", cluster.server.name, "-o", "json"]).stdout)
    assert kubelet_version(server) == new and kubelet_version(cluster.node()) == old
    assert cluster.fence_record() and cluster.drop_in()

    # The lift: rejoined at the release its host has, and told to run up again.
    cluster.config["fences"] = {}
    cluster.stack.log.clear()
    _, lift_up = cluster.timed_up()
    text = cluster.stack.text()
    assert f"[{worker.name}] fence lifted: rejoined" in text, text[-4000:]
    assert f"It runs k3s {old} and the server {new} (an upgrade left it alone while it was fenced): run up again" in (
        text
    ), text[-4000:]
    assert cluster.ready() and not cluster.fence_record()

    # The next up shows the move and makes it.
    cluster.stack.log.clear()
    _, move_up = cluster.timed_up()
    text = cluster.stack.text()
    assert f"plan: {worker.name} left at an older release while fenced, unfenced now: moved to k3s {new}" in text
    assert f"[{worker.name}] upgrading k3s {old} -> {new}" in text, text[-4000:]
    assert f"[{worker.name}] runs {new} (upgraded in place, no rejoin)" in text, text[-4000:]
    assert f"[{worker.name}] preflight" not in text
    assert kubelet_version(cluster.node()) == new and cluster.ready()
    # Done: the next up changes nothing.
    result = up_or_fail(cluster.stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert set(changes) == {"same"}, changes
    print(f"timings: upgrade while fenced {upgrade_up:.1f} s, lift {lift_up:.1f} s, move {move_up:.1f} s")


def test_a_dead_worker_with_a_pending_change_to_its_join_is_fenced_and_the_change_waits(
    cluster: FencedCluster, tmp_path: Path
) -> None:
    """The fence of a worker never waits on that worker's own pending change. fpu-w1 (Ready and
    unfenced after the test before) is powered off; the cluster moves to the next minor release,
    fpu-w1 gets a new label and the login key rotates (hk3s:ssh.private_key_file): that `up` stops
    (the server moved, the worker cannot), leaving the join's change and fpu-w1's rotation pending.
    `scripts/hk3s node fence fpu-w1 --powered-off` then fences it: the fence completes, the run
    succeeds, and it says the join's change waits for the first up after the lift and fpu-w1's key
    rotation waits until its host answers again (the host untouched; the server takes the new key).
    Powered on and unfenced (`node unfence`), the lift's run rotates fpu-w1's key first (the lift
    then logs in with the new key, the previous one removed), still leaves the join's change pending
    and says to run up again; that next `up` applies it: the release and the label."""
    skip_without_lab_binaries("k3s-minor")
    worker = cluster.worker
    assert cluster.ready() and not cluster.fence_record(), cluster.diagnose()
    old = kubelet_version(cluster.node())
    release = k3s_release("k3s-minor")
    new = release["k3s_version"]
    assert old != new
    worker.power_off()
    wait_until(f"{worker.name} NotReady", lambda: not cluster.ready(), 90, cluster.diagnose)
    ready = next(c for c in cluster.node()["status"]["conditions"] if c["type"] == "Ready")
    since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()

    # The change: an upgrade, a label and a new login key. The worker is down, so the run stops and
    # they stay pending.
    previous_key = Path(cluster.config["ssh"]["private_key_file"])
    new_key = tmp_path / "rotated"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rotated", "-f", str(new_key)], check=True)
    cluster.config["ssh"] = {**cluster.config["ssh"], "private_key_file": str(new_key)}
    cluster.config["cluster"].update(release)
    cluster.config["workers"][0]["labels"] = {LABEL: "edge"}
    output, _ = cluster.timed_up(succeed=False)
    assert worker.name in output, output[-6000:]
    assert LABEL not in (cluster.node()["metadata"].get("labels") or {})
    assert not cluster.fence_record()

    # The user's fence command, once the worker was down for the minute a fence needs.
    time.sleep(max(0.0, since + 62 - float(cluster.server.run(["date", "+%s"]).stdout)))
    started = time.monotonic()
    fenced = cluster.stack.hk3s("node", "fence", worker.name, "--powered-off")
    fence_up = time.monotonic() - started
    said = fenced.output + fenced.stderr
    assert fenced.returncode == 0, said[-6000:]
    cluster.config["fences"] = {worker.name: {"powered_off": True}}
    recorded_at = cluster.fence_record()
    assert recorded_at and OUT_OF_SERVICE in cluster.taints(), cluster.diagnose()
    assert f"[{worker.name}] fenced (recorded {recorded_at}" in said and "confirmed powered off" in said, said[-6000:]
    pending = (
        f"[{worker.name}] fenced (recorded {recorded_at}): its join changes nothing on the host while it is fenced; "
        f"pending until the first up after the fence is lifted: "
    )
    line = next((text for text in said.splitlines() if pending in text), "")
    assert f"k3s_version {old} -> {new}" in line and "labels" in line, said[-6000:]
    assert LABEL not in (cluster.node()["metadata"].get("labels") or {})
    assert kubelet_version(cluster.node()) == old
    # The rotation waits for fpu-w1 (its state keeps the previous key); the server took the new key.
    rotation = f"[{worker.name}] fenced: its login key rotation {fingerprint(previous_key)} -> {fingerprint(new_key)} "
    line = next((text for text in said.splitlines() if rotation in text), "")
    assert "waits until its host answers over SSH again" in line, said[-6000:]
    assert logs_in(cluster.server, new_key) and not logs_in(cluster.server, previous_key)

    # The host back (no drop-in holds it: the fence confirmed it off), then the lift.
    worker.power_on(wait=True)
    started = time.monotonic()
    lifted = cluster.stack.hk3s("node", "unfence", worker.name)
    lift_up = time.monotonic() - started
    said = lifted.output + lifted.stderr
    assert lifted.returncode == 0, said[-6000:]
    cluster.config["fences"] = {}
    assert f"[{worker.name}] fence lifted: rejoined" in said, said[-6000:]
    assert "run up again" in said, said[-6000:]
    assert not cluster.fence_record() and OUT_OF_SERVICE not in cluster.taints()
    assert LABEL not in (cluster.node()["metadata"].get("labels") or {})
    # The rotation ran before the lift: fpu-w1 takes the new key only.
    assert f"[{worker.name}] the new login key {fingerprint(new_key)} logs in" in said, said[-6000:]
    assert logs_in(worker, new_key) and not logs_in(worker, previous_key)

    # The next up applies the pending change: the release and the label.
    cluster.stack.log.clear()
    _, change_up = cluster.timed_up()
    text = cluster.stack.text()
    assert f"[{worker.name}] upgrading k3s {old} -> {new}" in text, text[-4000:]
    found = cluster.node()
    assert kubelet_version(found) == new and found["metadata"]["labels"].get(LABEL) == "edge", found["metadata"]
    assert cluster.ready()
    result = up_or_fail(cluster.stack)
    changes = {str(getattr(op, "value", op)): n for op, n in (result.summary.resource_changes or {}).items()}
    assert set(changes) == {"same"}, changes
    print(f"timings: fence {fence_up:.1f} s, lift {lift_up:.1f} s, pending change applied {change_up:.1f} s")
