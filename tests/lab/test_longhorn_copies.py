"""Who holds copies of data, through the real engine: the disk probe's verdict written on Longhorn's
node objects (tags and scheduling flag), and Longhorn's placement following it.

Lab hosts whose Longhorn disk is a FUSE filesystem with a real sync delay (lab/slow_disk.py): a fast
worker and a slow one; the server's disk is such a filesystem too, with no delay (a plain lab host's
disk is this machine's, which may be fuller than Longhorn's minimal-available rule allows). Longhorn
is the lab's stand-in: its chart installed through the product's air-gapped path and its manager
(lab/longhorn_standin/manager.py) started beside the stack, reached by the product only through the
Kubernetes API. Volumes are made as Longhorn's CSI provisioner makes them from a claim: a Longhorn
Volume with the storage class's parameters, made directly: these tests run no pod (the CSI path from a
claim to a pod is tests/lab/test_longhorn_csi.py).

The tests of this module share one cluster and run in order."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import yaml
from pulumi import automation as auto

from lab import slow_disk
from lab.hosts import Host, Lab
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    LabStack,
    base_config,
    server_spec,
    skip_without_kubernetes_provider,
    up_or_fail,
    worker_spec,
)

pytestmark = pytest.mark.lab
SLOW_MS = 25.0  # over the 10 ms threshold
MiB = 1 << 20
T = TypeVar("T")


@dataclass
class Cluster:
    lab: Lab
    server: Host
    fast: Host
    slow: Host
    stack: LabStack

    def kubectl(self, *args: str) -> str:
        return self.server.run(["/usr/local/bin/k3s", "kubectl", *args]).stdout

    def longhorn(self, kind: str, name: str | None = None) -> Any:
        return json.loads(self.kubectl("-n", "longhorn-system", "get", kind, *([name] if name else []), "-o", "json"))

    def node_spec(self, name: str) -> dict[str, Any]:
        return dict(self.longhorn("nodes.longhorn.io", name)["spec"])

    def placed(self, volume: str) -> list[str]:
        items = self.longhorn("replicas.longhorn.io")["items"]
        return sorted(r["spec"]["nodeID"] for r in items if r["spec"]["volumeName"] == volume and r["spec"]["nodeID"])

    def replicas(self, volume: str) -> int:
        return len([r for r in self.longhorn("replicas.longhorn.io")["items"] if r["spec"]["volumeName"] == volume])

    def volume_from_class(self, name: str, storage_class: str) -> None:
        """A Longhorn volume as Longhorn's CSI provisioner makes it for a claim of `storage_class`."""
        parameters = json.loads(self.kubectl("get", "storageclass", storage_class, "-o", "json"))["parameters"]
        volume = {
            "apiVersion": "longhorn.io/v1beta2",
            "kind": "Volume",
            "metadata": {"name": name, "namespace": "longhorn-system"},
            "spec": {
                "size": str(16 * MiB),  # the lab hosts' Longhorn disks are 256 MiB tmpfs-backed
                "numberOfReplicas": int(parameters["numberOfReplicas"]),
                "nodeSelector": parameters["nodeSelector"].split(","),
            },
        }
        self.server.run(f"echo {shlex.quote(json.dumps(volume))} | /usr/local/bin/k3s kubectl apply -f -")


def pair(nodes: list[str]) -> list[str] | None:
    """`nodes` once it names two."""
    return nodes if len(nodes) == 2 else None


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_kubernetes_provider()
    server = lab.add_host(server_spec("lc-server", disk_sync_delay_ms=0))
    fast = lab.add_host(worker_spec("lc-fast", disk_sync_delay_ms=0))
    slow = lab.add_host(worker_spec("lc-slow", disk_sync_delay_ms=SLOW_MS))
    lab.wait_ssh_ready([server, fast, slow])
    storage = {"install_longhorn": True, "longhorn_chart": str(LONGHORN_STANDIN_CHART), "max_copies": 2}
    config = base_config(lab, server, [fast, slow], storage=storage)
    for worker in config["workers"]:
        worker["holds_copies"] = True
    stack = LabStack(tmp_path_factory.mktemp("longhorn-copies-stack"))
    stack.write_config(config)
    up_or_fail(stack)
    yield Cluster(lab, server, fast, slow, stack)


def test_the_server_and_a_passing_worker_hold_copies_a_failing_one_none(cluster: Cluster) -> None:
    server, fast, slow = (cluster.node_spec(h.name) for h in (cluster.server, cluster.fast, cluster.slow))
    assert sorted(server["tags"]) == ["hk3s-copies", "hk3s-server"] and server["allowScheduling"] is True
    assert fast["tags"] == ["hk3s-copies"] and fast["allowScheduling"] is True
    # Failed the probe: no tag, and scheduling disabled on its Longhorn node.
    assert slow["tags"] == [] and slow["allowScheduling"] is False
    # A two-copy volume lands on the two nodes that may hold copies, never on the slow worker.
    cluster.volume_from_class("two", "hk3s-two-copies")
    placed = wait_for("both copies placed", lambda: pair(cluster.placed("two")))
    assert placed == sorted(["lc-server", "lc-fast"])
    # A one-copy volume is pinned to the server.
    cluster.volume_from_class("one", "hk3s-one-copy")
    assert wait_for("the copy placed", lambda: cluster.placed("one")) == ["lc-server"]


def test_the_on_demand_check_moves_the_tag_with_the_verdict(cluster: Cluster) -> None:
    # The fast worker's disk gets slow: its re-check takes its tag away and disables scheduling.
    slow_disk.of_host_dir(cluster.fast.dir).set_delay(SLOW_MS)
    result = cluster.stack.api().check_disk("lc-fast")
    assert not result.eligible
    fast = cluster.node_spec("lc-fast")
    assert fast["tags"] == [] and fast["allowScheduling"] is False

    # Only the server may hold copies now: a new two-copy volume gets one, the other waits.
    cluster.volume_from_class("waits", "hk3s-two-copies")
    wait_for("one copy placed", lambda: cluster.placed("waits") == ["lc-server"])
    time.sleep(3)
    assert cluster.placed("waits") == ["lc-server"] and cluster.replicas("waits") == 2
    # Attached on the server (as Longhorn's attachment controller does for a pod there), Longhorn's
    # Scheduled condition says the copy could not be placed, and status --check passes that on.
    patch = json.dumps({"spec": {"nodeID": "lc-server"}})
    cluster.kubectl("-n", "longhorn-system", "patch", "volumes.longhorn.io", "waits", "--type", "merge", "-p", patch)
    wait_for(
        "Longhorn's Scheduled condition",
        lambda: (
            "False"
            in cluster.kubectl(
                "-n",
                "longhorn-system",
                "get",
                "volumes.longhorn.io",
                "waits",
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Scheduled')].status}",
            )
        ),
    )
    warnings = [w for w in cluster.stack.api().status(check_hosts=True).warnings if "volume waits" in w]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("lc-server: volume waits keeps 1 of its 2 copies (on lc-server)"), warnings
    assert "Scheduled condition: False (ReplicaSchedulingFailure): replica scheduling failed" in warnings[0]
    assert "(tags hk3s-copies, scheduling allowed): lc-server;" in warnings[0]

    # The slow worker's disk gets fast: its re-check gives it the tag, and the waiting copy lands there.
    slow_disk.of_host_dir(cluster.slow.dir).set_delay(0)
    assert cluster.stack.api().check_disk("lc-slow").eligible
    slow = cluster.node_spec("lc-slow")
    assert slow["tags"] == ["hk3s-copies"] and slow["allowScheduling"] is True
    assert wait_for("the waiting copy placed", lambda: pair(cluster.placed("waits"))) == ["lc-server", "lc-slow"]


def test_lowering_the_offer_below_a_volumes_copies_is_refused_and_changes_nothing(cluster: Cluster) -> None:
    """Two-copy volumes exist ("two", "waits"): max_copies 2 -> 1 is refused at preview, naming them
    and the setting, and an up refuses alike, leaving the two-copy storage class in place."""
    config = yaml.safe_load((cluster.stack.project / f"Pulumi.{cluster.stack.name}.yaml").read_text())
    config["config"]["hk3s:storage"]["max_copies"] = 1
    (cluster.stack.project / f"Pulumi.{cluster.stack.name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = cluster.kubectl("get", "storageclass", "-o", "name").split()
    for run in (cluster.stack.preview, cluster.stack.up):
        with pytest.raises(auto.CommandError) as refused:
            run()
        text = str(refused.value)
        assert "hk3s:storage.max_copies cannot go down to 1 while Longhorn volumes keep more copies" in text, text[
            -3000:
        ]
        assert "two (2 copies), waits (2 copies)" in text
    assert cluster.kubectl("get", "storageclass", "-o", "name").split() == before
    assert "storageclass.storage.k8s.io/hk3s-two-copies" in before
