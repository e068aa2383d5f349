"""Public mode: a worker whose address changed while it was fenced is not rejoined there, through
the real Pulumi engine on lab hosts (real SSH, the real API server, the k3s stand-in).

One cluster for the module: a server and fpu-w1 in public mode, fpu-w1's agent stopped and
fenced over SSH. Its public address then moves on the host (the old one gone from it), and
hk3s:workers gets the new one: that `up` stores the new address in the fence and leaves the join
as it is (a fenced worker's join changes nothing on its host). With the fence entry removed the
lift is refused, naming the node IP it joined with, the host's address now and the fix, and
nothing changed: the fence record, the out-of-service taint, the agent's configuration and the
drop-in all stay."""

from __future__ import annotations

import pytest

from lab.hosts import Lab
from tests.lab.fenced_worker import OUT_OF_SERVICE, FencedCluster, fenced_cluster

pytestmark = pytest.mark.lab


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
