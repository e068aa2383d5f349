"""What fencing a dead worker costs, from the command to its workloads running elsewhere.

    venv/bin/python -m bench.fence --out bench/results/fence.json
    venv/bin/python -m bench.fence --runs 1

One lab: a server and two pod-capable workers (a real containerd, runc and kubelet under the
k3s stand-in, the real kube-controller-manager) joined by `pulumi up` through the real engine,
running a Deployment of two web pods, one per worker. Per run, the first worker "dies": its
agent is stopped (its containers keep running, as on k3s when the agent crashes or the node
loses its network), and the operator fences it through the API (`ClusterStack.fence`) once its
Node has been NotReady for the minute the fence asks for. A run ends when every web pod is
Ready on the other worker; then the fence is lifted (`unfence`) for the next run.

Each run's time is split, from the lines the run prints as they arrive and a watcher of the API:

* the waits the fence's rules prescribe, before the command: Kubernetes marking the Node
  NotReady after the agent stopped (the controller manager's node-monitor grace period), and
  the minute a Node must be NotReady before it may be fenced;
* the program's own steps, after the command: the engine and program starting until the fence
  begins, judging the worker and recording the fence, stopping the host over SSH (drop-in,
  killall, the check that nothing is left), the taint;
* Kubernetes' work the fence waits for: deleting the worker's pods once tainted (the taint
  manager and the pod garbage collector), then, after the fence, the replacement pods becoming
  Ready elsewhere (scheduling, the container starting, the readiness).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab import pod_hosts
from lab.hosts import DEFAULT_CACHE_DIR, Host, Lab
from lab.stack_harness import (
    STACK_BINARIES,
    LabStack,
    base_config,
    lab_binaries_missing,
    server_spec,
    wait_until,
    worker_spec,
)
from node_operations.fence import MIN_DOWN_SECONDS

K3S = "/usr/local/bin/k3s"
DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
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
          readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"""
# The lines of the fence's progress that end each of its steps (node_operations/fence.py).
STEP_ENDS = {
    "judged_and_recorded": "fence recorded on the Node",
    "stopped_over_ssh": "no container, shim, Longhorn process or pod mount is left on the host",
    "tainted": "tainted node.kubernetes.io/out-of-service",
    "pods_deleted": "] fenced (recorded",
}
POLL_SECONDS = 0.3


def _kubectl_json(server: Host, *args: str) -> Any:
    return json.loads(server.run([K3S, "kubectl", *args, "-o", "json"]).stdout)


def _ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))


def _web_ready_on(server: Host) -> list[str]:
    """The nodes of the web pods that are Ready (and not terminating)."""
    pods = _kubectl_json(server, "get", "pods", "-l", "app=web")["items"]
    return sorted(
        p["spec"].get("nodeName", "")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    )


def _seconds_down(server: Host, name: str) -> float:
    """How long the Node has been NotReady, by its Ready condition's transition time (the server's clock)."""
    node = _kubectl_json(server, "get", "node", name)
    if _ready(node):
        return 0.0
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    since = server.run(["date", "-u", "-d", ready["lastTransitionTime"], "+%s"]).stdout.strip()
    now = server.run(["date", "-u", "+%s"]).stdout.strip()
    return float(int(now) - int(since))


def fence_run(stack: LabStack, server: Host, dead: Host, alive: Host) -> dict[str, Any]:
    """One fence of `dead`, timed (see the module docstring)."""
    stopped = time.monotonic()
    dead.run(["systemctl", "stop", "k3s-agent"])
    wait_until(f"{dead.name} NotReady", lambda: not _ready(_kubectl_json(server, "get", "node", dead.name)), 120)
    not_ready = time.monotonic()
    # The fence's own rule: a minute NotReady by the Node's record (the bench waits no longer).
    wait_until(f"{dead.name} down a minute", lambda: _seconds_down(server, dead.name) >= MIN_DOWN_SECONDS, 150)
    waited = time.monotonic()

    seen: dict[str, float] = {}

    def on_output(line: str) -> None:
        for step, text in STEP_ENDS.items():
            if step not in seen and text in line and f"[{dead.name}]" in line:
                seen[step] = time.monotonic()

    command = time.monotonic()
    stack.api().fence(dead.name, on_output=on_output)
    returned = time.monotonic()
    wait_until("the web pods Ready elsewhere", lambda: _web_ready_on(server) == [alive.name] * 2, 180)
    running = time.monotonic()
    missing = [step for step in STEP_ENDS if step not in seen]
    if missing:
        raise RuntimeError(f"the run printed no line for {missing}")
    steps = {
        "engine_and_judge_and_record": seen["judged_and_recorded"] - command,
        "stop_over_ssh": seen["stopped_over_ssh"] - seen["judged_and_recorded"],
        "taint": seen["tainted"] - seen["stopped_over_ssh"],
    }
    kubernetes = {
        "pods_deleted_after_taint": seen["pods_deleted"] - seen["tainted"],
        "replacements_ready_after_fence": running - seen["pods_deleted"],
    }
    return {
        "prescribed_waits_seconds": {
            "not_ready_after_agent_stop": round(not_ready - stopped, 2),
            "down_a_minute": round(waited - not_ready, 2),
        },
        "program_seconds": {key: round(value, 2) for key, value in steps.items()},
        "program_after_pods_deleted_seconds": round(returned - seen["pods_deleted"], 2),
        "kubernetes_seconds": {key: round(value, 2) for key, value in kubernetes.items()},
        "command_to_running_elsewhere_seconds": round(running - command, 2),
    }


def lift(stack: LabStack, server: Host, dead: Host) -> None:
    """Lift the fence (the worker rejoins) and spread the web pods over both workers again."""
    stack.api().unfence(dead.name)
    # Scaled down and up again, so the spread places one on each (a rolling restart may not).
    server.run([K3S, "kubectl", "scale", "deployment/web", "--replicas=0"])
    wait_until("no web pod left", lambda: not _kubectl_json(server, "get", "pods", "-l", "app=web")["items"], 120)
    server.run([K3S, "kubectl", "scale", "deployment/web", "--replicas=2"])
    wait_until("a web pod Ready on each worker", lambda: len(set(_web_ready_on(server))) == 2, 180)


def run(runs: int, scratch: Path) -> dict[str, Any]:
    with Lab(DEFAULT_CACHE_DIR) as lab:
        server = lab.add_host(server_spec("fb-server"))
        workers = [lab.add_host(worker_spec(f"fb-worker-{i}", pods=True)) for i in (1, 2)]
        lab.wait_ssh_ready([server, *workers])
        for worker in workers:  # before k3s is installed, as k3s's air-gap instructions say
            pod_hosts.place_airgap_images(worker.root, DEFAULT_CACHE_DIR)
        stack = LabStack(scratch / "fence")
        stack.write_config(base_config(lab, server, workers))
        stack.up()
        image = pod_hosts.busybox_image()
        for worker in workers:
            wait_until(
                f"{worker.name} imports the air-gap images",
                lambda w=worker: image in w.run([K3S, "ctr", "images", "ls", "-q"]).stdout,  # type: ignore[misc]
                60,
            )
        (server.root / "root/web.yaml").write_text(DEPLOYMENT.replace("IMAGE", image))
        server.run([K3S, "kubectl", "apply", "-f", "/root/web.yaml"])
        wait_until("a web pod Ready on each worker", lambda: len(set(_web_ready_on(server))) == 2, 180)
        results = []
        for index in range(runs):
            results.append(fence_run(stack, server, workers[0], workers[1]))
            if index < runs - 1:
                lift(stack, server, workers[0])
    total = [r["command_to_running_elsewhere_seconds"] for r in results]
    own = [sum(r["program_seconds"].values()) + r["program_after_pods_deleted_seconds"] for r in results]
    return {
        "runs": results,
        "command_to_running_elsewhere_median_seconds": round(statistics.median(total), 2),
        "program_share_of_it": round(statistics.median(o / t for o, t in zip(own, total, strict=True)), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fences of the same worker (lifted in between)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    missing = lab_binaries_missing(list(STACK_BINARIES)) or [
        reason for reason in [pod_hosts.runtime_missing(DEFAULT_CACHE_DIR)] if reason
    ]
    if missing:
        print(f"lab binaries missing ({', '.join(missing)}); run lab/setup.sh", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-fence-") as scratch:
        result = run(args.runs, Path(scratch))
    result["machine"] = {"cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
