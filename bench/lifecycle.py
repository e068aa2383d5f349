"""What a worker's maintenance costs beside the host's own work, on lab hosts.

    venv/bin/python -m bench.lifecycle --out bench/results/lifecycle.json
    venv/bin/python -m bench.lifecycle --workers 2 --restarts 2

One lab: a server and `--workers` workers joined by `pulumi up` through the real engine
(the k3s stand-in at the lab's release). A watcher polls every Node three times a
second. Measured, one after the other:

* the agent's own restart-to-Ready: `systemctl restart k3s-agent` on a worker until its
  Node is Ready with a lease renewed by the new agent (`--restarts` times per worker);
  the floor under any upgrade, which restarts the agent on the new binary;
* a patch upgrade (`up` with the stand-in stamped as the next patch release): the run's
  wall time, the server's part (until it is Ready at the release), and per worker the
  time from the previous node Ready at the release to this one (in place, no drain);
* a minor upgrade (the stand-in stamped as the next minor release): the same, each
  worker cordoned and drained first;
* a reboot through the API (`ClusterStack.reboot_worker`): its wall time beside the
  time the Node was seen NotReady (the host's own boot and agent start);
* a removal (the worker dropped from `hk3s:workers`, `up`) of a worker holding `--copies`
  single-copy Longhorn volumes of 1 GiB: the run's wall time beside the time its copies took
  to leave it (from the eviction the program asks for until the worker holds none, read by a
  watcher of Longhorn's replicas three times a second).

The stack installs Longhorn's lab stand-in (lab/longhorn_standin: its chart through the
product's air-gapped path, and its manager), whose copies are rebuilt in no time: the copies'
figure is the floor the program waits on (Longhorn's scheduling passes and the API's
latency), not the time a real Longhorn spends copying data.

Reported as ratios to the agent's restart-to-Ready and as seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.hosts.errors import LabError
from lab.node_watch import NodeWatcher, node_ready
from lab.stack_harness import (
    LONGHORN_STANDIN_CHART,
    STACK_BINARIES,
    LabStack,
    base_config,
    k3s_release,
    kubernetes_plugins,
    lab_binaries_missing,
    server_spec,
    worker_spec,
)

K3S = "/usr/local/bin/k3s"
BACK_READY_SECONDS = 120.0


def _kubectl_json(server: Host, *args: str) -> Any:
    return json.loads(server.run([K3S, "kubectl", *args, "-o", "json"]).stdout)


def _lease_renewed(server: Host, name: str) -> dt.datetime:
    lease = _kubectl_json(server, "get", "lease", "-n", "kube-node-lease", name)
    return dt.datetime.fromisoformat(lease["spec"]["renewTime"])


def _main_pid(worker: Host) -> str:
    return worker.run(["systemctl", "show", "k3s-agent", "-p", "MainPID", "--value"]).stdout.strip()


def agent_restart(server: Host, worker: Host) -> float:
    """Seconds from `systemctl restart k3s-agent` until the Node is Ready with a lease the
    new agent renewed."""
    before = _main_pid(worker)
    started = time.monotonic()
    worker.run(["systemctl", "restart", "--no-block", "k3s-agent"])
    while _main_pid(worker) in (before, "0"):
        if time.monotonic() - started > 60:
            raise RuntimeError(f"{worker.name}: k3s-agent did not restart")
        time.sleep(0.05)
    old_gone = dt.datetime.now(dt.UTC)
    while time.monotonic() - started < BACK_READY_SECONDS:
        if node_ready(_kubectl_json(server, "get", "node", worker.name)) and (
            _lease_renewed(server, worker.name) > old_gone
        ):
            return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"{worker.name}: not Ready again within {BACK_READY_SECONDS:.0f} s")


def upgrade(stack: LabStack, config: dict[str, Any], server: Host, workers: list[Host], stamp: str) -> dict[str, Any]:
    """One `up` to the stand-in stamped `stamp`: wall time, the server's part, and each worker's
    time after the node before it (the program moves one node at a time)."""
    release = k3s_release(stamp)
    stack.write_config({**config, "cluster": {**config["cluster"], **release}})
    with NodeWatcher(server) as watcher:
        started = time.monotonic()
        stack.up()
        wall = time.monotonic() - started
    version = release["k3s_version"]
    reached = {host.name: watcher.first_at(host.name, version) for host in (server, *workers)}
    missing = [name for name, at in reached.items() if at is None]
    if missing:
        raise RuntimeError(f"not seen Ready at {version}: {', '.join(missing)}")
    order = sorted(reached.items(), key=lambda item: float(item[1] or 0))
    steps = [round(float(b[1] or 0) - float(a[1] or 0), 2) for a, b in itertools.pairwise(order)]
    return {
        "to": version,
        "wall_seconds": round(wall, 2),
        "server_seconds": round(float(reached[server.name] or 0), 2),
        "order": [name for name, _ in order],
        "per_worker_seconds": steps,
        "per_worker_median_seconds": round(statistics.median(steps), 2),
    }


def reboot(stack: LabStack, server: Host, worker: Host) -> dict[str, Any]:
    with NodeWatcher(server) as watcher:
        started = time.monotonic()
        stack.api().reboot_worker(worker.name)
        wall = time.monotonic() - started
    down = watcher.not_ready(worker.name)
    return {
        "worker": worker.name,
        "wall_seconds": round(wall, 2),
        "seen_not_ready_seconds": round(max(down) - min(down), 2) if down else 0.0,
    }


# The lab's disks are this machine's: shares low enough that a 1 GiB copy fits.
STORAGE = {
    "install_longhorn": True,
    "longhorn_chart": str(LONGHORN_STANDIN_CHART),
    "reserved_percent": 5,
    "minimal_available_percent": 5,
}


def _longhorn(server: Host, kind: str) -> list[dict[str, Any]]:
    return list(_kubectl_json(server, "get", kind, "-n", "longhorn-system")["items"])


def place_copies(server: Host, worker: Host, count: int) -> None:
    """`count` single-copy volumes of 1 GiB with their copy on `worker` (the other nodes take no
    copies while they are made), each healthy."""
    nodes = [n["metadata"]["name"] for n in _longhorn(server, "nodes.longhorn.io")]
    scheduling = ["-n", "longhorn-system", "--type", "merge", "-p"]
    for name in nodes:
        body = json.dumps({"spec": {"allowScheduling": name == worker.name}})
        server.run([K3S, "kubectl", "patch", "nodes.longhorn.io", name, *scheduling, body])
    for index in range(count):
        manifest = {
            "apiVersion": "longhorn.io/v1beta2",
            "kind": "Volume",
            "metadata": {"name": f"bench-{index}", "namespace": "longhorn-system"},
            "spec": {"numberOfReplicas": 1, "size": str(1024**3)},
        }
        (server.root / f"root/bench-{index}.json").write_text(json.dumps(manifest))
        server.run([K3S, "kubectl", "apply", "-f", f"/root/bench-{index}.json"])
    deadline = time.monotonic() + 120
    while (
        len(
            [
                r
                for r in _longhorn(server, "replicas.longhorn.io")
                if r["spec"].get("nodeID") == worker.name and r["spec"].get("healthyAt")
            ]
        )
        < count
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the bench's copies were not placed on {worker.name}")
        time.sleep(1)
    for name in nodes:
        server.run(
            [K3S, "kubectl", "patch", "nodes.longhorn.io", name, *scheduling, '{"spec":{"allowScheduling":true}}']
        )


def removal(stack: LabStack, config: dict[str, Any], server: Host, leaving: Host, copies: int) -> dict[str, Any]:
    """The removal's wall time beside the time its copies took to leave (see the module docstring)."""
    place_copies(server, leaving, copies)
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                node = next(
                    (n for n in _longhorn(server, "nodes.longhorn.io") if n["metadata"]["name"] == leaving.name), None
                )
                here = [r for r in _longhorn(server, "replicas.longhorn.io") if r["spec"].get("nodeID") == leaving.name]
            except (LabError, ValueError):  # a read cut by the run; the next one counts
                time.sleep(0.33)
                continue
            if node is not None and node["spec"].get("evictionRequested"):
                seen.setdefault("evicting", time.monotonic())
            if "evicting" in seen and not here:
                seen.setdefault("empty", time.monotonic())
            time.sleep(0.33)

    stack.write_config({**config, "workers": [w for w in config["workers"] if w["name"] != leaving.name]})
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    stack.up()
    wall = time.monotonic() - started
    stop.set()
    watcher.join(5)
    gone = leaving.name not in {n["metadata"]["name"] for n in _kubectl_json(server, "get", "nodes")["items"]}
    if not gone:
        raise RuntimeError(f"{leaving.name} still has a Node after its removal")
    moved = seen["empty"] - seen["evicting"] if {"empty", "evicting"} <= set(seen) else None
    return {
        "worker": leaving.name,
        "wall_seconds": round(wall, 2),
        "copies": copies,
        "copies_moved_seconds": round(moved, 2) if moved is not None else None,
        "copies_note": "the lab's Longhorn stand-in rebuilds a copy in no time: the floor the program waits on",
    }


def _ratio(upgraded: dict[str, Any], restart: float) -> float:
    return round(float(upgraded["per_worker_median_seconds"]) / restart, 2)


def run(workers: int, restarts: int, copies: int, scratch: Path) -> dict[str, Any]:
    with Lab(DEFAULT_CACHE_DIR) as lab:
        server = lab.add_host(server_spec("lc-server"))
        hosts = [lab.add_host(worker_spec(f"lc-worker-{i + 1}")) for i in range(workers)]
        lab.wait_ssh_ready([server, *hosts])
        stack = LabStack(scratch / "lifecycle")
        config = base_config(lab, server, hosts, storage=STORAGE)
        stack.write_config(config)
        started = time.monotonic()
        stack.up()
        join_wall = time.monotonic() - started

        restart_times = [agent_restart(server, host) for host in hosts for _ in range(restarts)]
        restart = statistics.median(restart_times)
        patch = upgrade(stack, config, server, hosts, "k3s-patch")
        minor = upgrade(stack, config, server, hosts, "k3s-minor")
        config = {**config, "cluster": {**config["cluster"], **k3s_release("k3s-minor")}}
        rebooted = reboot(stack, server, hosts[0])

        removed = removal(stack, config, server, hosts[-1], copies)
    return {
        "workers": workers,
        "join_wall_seconds": round(join_wall, 2),
        "agent_restart_to_ready_seconds": {
            "median": round(restart, 2),
            "min": round(min(restart_times), 2),
            "max": round(max(restart_times), 2),
            "runs": len(restart_times),
        },
        "patch_upgrade": {
            **patch,
            "per_worker_to_agent_restart": round(patch["per_worker_median_seconds"] / restart, 2),
        },
        "minor_upgrade": {
            **minor,
            "per_worker_to_agent_restart": round(minor["per_worker_median_seconds"] / restart, 2),
        },
        "reboot": rebooted,
        "removal": removed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--restarts", type=int, default=3, help="agent restarts per worker")
    parser.add_argument("--copies", type=int, default=3, help="1 GiB copies on the worker removed")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    missing = lab_binaries_missing([*STACK_BINARIES, "k3s-patch", "k3s-minor"])
    if missing or not kubernetes_plugins():
        print(
            f"lab binaries missing ({', '.join(missing) or 'the Kubernetes provider'}); run lab/setup.sh",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as scratch:
        result = run(args.workers, args.restarts, args.copies, Path(scratch))
    result["machine"] = {"cores": os.cpu_count()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
