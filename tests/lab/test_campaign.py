"""The fault campaign (bench/campaign.py), short, on a fixed seed, as CI runs it: a server (its
kube-apiserver auditing), two plain workers and a spare host (no pod runtime, no Longhorn: what the
CI budget allows; the benchmark's cluster adds pod-capable workers, Longhorn's stand-in and
workloads on volumes); seed 1's schedule of two faults (a plain `pulumi up` of a label change
SIGKILLed mid-run and recovered with `scripts/hk3s unlock` and `up`; a `node add` during which the
k3s server restarts), every invariant checked after each step. Then a pod bound to a worker that is
not fenced is force-deleted by hand: the force-deletion invariant, read from the real API server's
audit log, names it (the check can fail).

The long run is the benchmark: `venv/bin/python -m bench.campaign --faults 200 --seed N`."""

from __future__ import annotations

import json
import time

import pytest

from bench.campaign import CI_FAULTS, CI_OPERATIONS, Campaign, Violation, make_schedule
from lab.hosts import Lab
from lab.stack_harness import skip_without_lab_binaries

pytestmark = pytest.mark.lab

SEED = 1


@pytest.fixture(scope="module")
def campaign(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    skip_without_lab_binaries()
    return Campaign(lab, tmp_path_factory.mktemp("campaign"), workers=2, spares=1, pods=False)


def test_a_short_seeded_campaign_keeps_every_promise(campaign: Campaign) -> None:
    schedule = make_schedule(SEED, 2, CI_OPERATIONS, CI_FAULTS)
    assert [(s.op, s.fault, s.heal) for s in schedule] == [
        ("labels", "kill_run", "unlock"),
        ("add", "server_restart", "unlock"),
    ]
    started = time.monotonic()
    reports, violation = campaign.run(schedule)
    lines = "\n".join(report.line() for report in reports)
    print(f"{lines}\ncampaign of {len(schedule)} steps: {time.monotonic() - started:.0f} s")
    assert violation is None, f"seed {SEED}: {violation}\n{lines}"
    assert all(report.fault_fired for report in reports), lines
    assert reports[0].runs[0]["killed"], lines
    assert campaign.cluster.workers() == ["fc-w1", "fc-w2", "fc-w3"], lines


def test_a_pod_force_deleted_on_a_node_that_is_not_fenced_is_named(campaign: Campaign) -> None:
    cluster = campaign.cluster
    cluster.check_force_deletes()  # nothing before
    node = cluster.workers()[0]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forced", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "none"}]},
    }
    (cluster.server.root / "root/forced.json").write_text(json.dumps(pod))
    cluster.kubectl("apply", "-f", "/root/forced.json")
    cluster.kubectl("delete", "pod", "forced", "-n", "default", "--grace-period=0", "--force")
    with pytest.raises(Violation) as found:
        for _ in range(30):  # the audit log is written as each request completes
            cluster.check_force_deletes()
            time.sleep(1)
    assert found.value.invariant == "force_delete"
    assert f"pod default/forced on {node} deleted with grace 0 by system:admin" in found.value.detail, found.value
