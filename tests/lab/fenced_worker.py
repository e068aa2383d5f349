"""A lab cluster (a server and one worker) whose worker is fenced over SSH through the real engine,
for the tests of a fenced worker whose address changes (test_fence_address_public.py,
test_fence_address_private.py). LAB ONLY."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from ipaddress import IPv4Address
from typing import Any

import pytest

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, wait_until
from lab.stack_harness import worker_spec as plain_worker
from node_operations.fence import FENCE_ANNOTATION

K3S = "/usr/local/bin/k3s"
CONFIG = "etc/rancher/k3s/config.yaml"
DROP_IN = "etc/systemd/system/k3s-agent.service.d/hk3s-fence.conf"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
# Far above the addresses the lab gives its hosts (the public network's base + 10 + index, index <= 80).
NEW_ADDRESS_OFFSET = 200


@dataclass
class FencedCluster:
    lab: Lab
    stack: LabStack
    server: Host
    worker: Host
    config: dict[str, Any]

    def node(self) -> dict[str, Any]:
        out = self.server.run([K3S, "kubectl", "get", "node", self.worker.name, "-o", "json"], timeout=60).stdout
        found: dict[str, Any] = json.loads(out)
        return found

    def ready(self) -> bool:
        conditions = self.node()["status"]["conditions"]
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def addresses(self) -> dict[str, str]:
        return {a["type"]: a["address"] for a in self.node()["status"]["addresses"]}

    def fence_record(self) -> str | None:
        return (self.node()["metadata"].get("annotations") or {}).get(FENCE_ANNOTATION)

    def taints(self) -> set[str]:
        return {t["key"] for t in self.node()["spec"].get("taints") or []}

    def agent_config(self) -> bytes:
        return (self.worker.root / CONFIG).read_bytes()

    def drop_in(self) -> bool:
        return (self.worker.root / DROP_IN).is_file()

    def agent_active(self) -> bool:
        return self.worker.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip() == "active"

    def write(self) -> None:
        self.stack.write_config(self.config)

    def up_output(self) -> str:
        """`up`: "" when it succeeded, else its output and error (its output is in stack.text() either way)."""
        self.write()
        return self.stack.up_output()

    def timed_up(self, succeed: bool = True) -> tuple[str, float]:
        """`up` and how long it took: its output ("" when it succeeded). With `succeed`, a failed
        `up` fails the test with its output; without it, one that succeeded does."""
        started = time.monotonic()
        output = self.up_output()
        elapsed = time.monotonic() - started
        if succeed and output:
            pytest.fail(output[-6000:])
        if not succeed and not output:
            pytest.fail(f"up succeeded where it must fail: {self.stack.text()[-4000:]}")
        return output, elapsed

    def diagnose(self) -> str:
        nodes = self.server.run([K3S, "kubectl", "get", "nodes", "-o", "wide"], check=False).stdout
        return nodes + self.stack.text()[-4000:]

    def fence(self) -> None:
        """Stop the worker's agent, wait the minute a fence needs, fence it (`up`)."""
        self.worker.run(["systemctl", "stop", "k3s-agent"])
        wait_until(f"{self.worker.name} NotReady", lambda: not self.ready(), 90, self.diagnose)
        ready = next(c for c in self.node()["status"]["conditions"] if c["type"] == "Ready")
        since = datetime.fromisoformat(ready["lastTransitionTime"]).timestamp()
        time.sleep(max(0.0, since + 62 - float(self.server.run(["date", "+%s"]).stdout)))
        self.config["fences"] = {self.worker.name: {}}
        self.timed_up()
        assert self.fence_record() and OUT_OF_SERVICE in self.taints() and self.drop_in()

    def new_public_address(self) -> str:
        """An address of the lab's public network no host of the lab has."""
        plan = self.lab.setup_network()
        return str(IPv4Address(int(plan.public_net.network_address) + NEW_ADDRESS_OFFSET))

    def move_public_address(self, new: str, old: str | None = None) -> str:
        """Give the worker's public NIC `new` in place of `old` (by default the address it was made
        with; as when a cloud assigns a new public IP): the old one is gone from the host. Returns
        the old one."""
        old = old or self.worker.public_ip
        assert old is not None
        plan = self.lab.setup_network()
        prefix = plan.public_net.prefixlen

        def ip(*args: str) -> None:
            subprocess.run(["ip", "-n", self.worker.netns, *args], check=True, capture_output=True, text=True)

        subprocess.run(
            ["ip", "netns", "exec", self.worker.netns, "sysctl", "-qw", "net.ipv4.conf.eth0.promote_secondaries=1"],
            check=True,
        )
        ip("addr", "add", f"{new}/{prefix}", "dev", "eth0")
        ip("addr", "del", f"{old}/{prefix}", "dev", "eth0")
        if not self.worker.spec.private_default_route:
            ip("route", "replace", "default", "via", plan.public_gateway, "dev", "eth0")
        self.config["workers"][0]["address"] = new
        return old


def fenced_cluster(lab: Lab, tmp: pytest.TempPathFactory, prefix: str, **network: Any) -> FencedCluster:
    """A server and a worker joined (with hk3s:network `network`), the worker then fenced over SSH."""
    skip_without_lab_binaries()
    server = lab.add_host(server_spec(f"{prefix}-srv"))
    worker = lab.add_host(plain_worker(f"{prefix}-w1"))
    lab.wait_ssh_ready([server, worker])
    stack = LabStack(tmp.mktemp(f"{prefix}-stack"))
    config = base_config(lab, server, [worker], network=network)
    cluster = FencedCluster(lab, stack, server, worker, config)
    cluster.write()
    up_or_fail(stack)
    cluster.fence()
    return cluster
