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
  ExternalIP (node-external-ip), its InternalIP still the private one; then nothing is left."""

from __future__ import annotations

import pytest

from lab.hosts import Lab
from lab.stack_harness import up_or_fail
from tests.lab.fenced_worker import OUT_OF_SERVICE, FencedCluster, fenced_cluster

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
