"""How long a peer change takes on host firewalls, and how many rules it leaves.

    sudo venv/bin/python -m bench.firewall_peers --out bench/results/firewall_peers.json
    sudo venv/bin/python -m bench.firewall_peers --nodes 6 --peers 50 --out /tmp/f.json

* fleet: N lab nodes (a third each with plain nftables, UFW and firewalld), one
  of them the server. First the cluster's plan is applied (cold: UFW gets
  enabled, firewalld gets its zones), then one peer joins (an address added
  to every node's rules), then the same plan again (a no-op). Each step is one
  `apply_firewalls` call: one atomic change per node, all nodes in parallel,
  over real SSH. Per-node times are measured to the node's last progress line.
* peer set: one node of each backend with a simulated cluster of P peers
  (addresses only, no hosts behind them): the time to go from a small
  cluster to P peers, then to add one more, and the rule count at P peers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab.hosts import DEFAULT_CACHE_DIR, Host, HostSpec, Lab, missing_prerequisites
from node_operations.firewall_plan import inbound_rules
from node_operations.host_firewall.fleet import FleetFirewallResult, NodeFirewallJob, apply_firewalls
from node_operations.host_firewall.inspection import FirewallBackend
from node_operations.host_firewall.plan import NodeFirewallPlan
from remote_access.ssh import SshTarget

BACKEND_PACKAGES: dict[FirewallBackend, tuple[str, ...]] = {
    "nftables": (),
    "ufw": ("ufw",),
    # debootstrap does not resolve polkitd's virtual "logind"; libpam-systemd provides it.
    "firewalld": ("firewalld", "libpam-systemd"),
}
BACKENDS: tuple[FirewallBackend, ...] = ("nftables", "ufw", "firewalld")


def target(lab: Lab, host: Host) -> SshTarget:
    return SshTarget(
        node=host.name,
        address=host.ssh_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=host.ssh_host_public_key,
    )


def plan(node: str, server: str, peers: dict[str, str]) -> NodeFirewallPlan:
    role = "server" if node == server else "worker"
    rules = inbound_rules(role=role, node=node, peers=peers, server=server, pod_network="wireguard")  # type: ignore[arg-type]
    return NodeFirewallPlan(node, role, tuple(rules))  # type: ignore[arg-type]


def simulated_peers(count: int) -> dict[str, str]:
    """`count` peer addresses in a range no lab host uses."""
    return {f"sim{index}": f"10.250.{index // 250}.{1 + index % 250}" for index in range(count)}


def wait_for_firewalld(hosts: list[Host]) -> None:
    for host in hosts:
        host.run("for i in $(seq 150); do firewall-cmd --state && exit 0; sleep 0.2; done; exit 1", timeout=60)


def timed_apply(jobs: list[NodeFirewallJob]) -> tuple[float, dict[str, float], FleetFirewallResult]:
    started = time.monotonic()
    finished: dict[str, float] = {}

    def progress(node: str, message: str) -> None:
        finished[node] = time.monotonic() - started

    result = asyncio.run(apply_firewalls(jobs, progress=progress))
    return time.monotonic() - started, finished, result


def step_summary(
    name: str, wall: float, per_node: dict[str, float], result: FleetFirewallResult, backends: Mapping[str, str]
) -> dict[str, Any]:
    nodes: dict[str, Any] = {}
    for node, outcome in sorted(result.applied.items()):
        nodes[node] = {
            "backend": outcome.backend,
            "seconds": round(per_node.get(node, wall), 3),
            "rule_count": outcome.rule_count,
            "changed": outcome.changed,
        }
    by_backend: dict[str, Any] = {}
    for backend in BACKENDS:
        times = [info["seconds"] for node, info in nodes.items() if backends[node] == backend]
        counts = [info["rule_count"] for node, info in nodes.items() if backends[node] == backend]
        if times:
            by_backend[backend] = {
                "nodes": len(times),
                "median_s": round(statistics.median(times), 3),
                "max_s": round(max(times), 3),
                "rule_count_min": min(counts),
                "rule_count_max": max(counts),
            }
    return {"step": name, "wall_s": round(wall, 3), "failed": result.failed, "by_backend": by_backend, "nodes": nodes}


def fleet(lab: Lab, count: int) -> list[dict[str, Any]]:
    specs = [
        HostSpec(f"bench-fw{index + 1}", extra_packages=BACKEND_PACKAGES[BACKENDS[index % 3]]) for index in range(count)
    ]
    hosts = [lab.add_host(spec) for spec in specs]
    lab.wait_ssh_ready(hosts, timeout=300)
    wait_for_firewalld([host for host in hosts if "firewalld" in host.spec.extra_packages])
    server = hosts[0].name
    peers = {host.name: str(host.private_ip) for host in hosts}
    backends = {host.name: BACKENDS[index % 3] for index, host in enumerate(hosts)}

    def jobs(cluster: dict[str, str]) -> list[NodeFirewallJob]:
        return [NodeFirewallJob(target(lab, host), plan(host.name, server, cluster)) for host in hosts]

    steps = []
    for name, cluster in (
        ("first apply (cold)", peers),
        ("one peer joins", {**peers, "joiner": "10.251.0.1"}),
        ("same plan again (no-op)", {**peers, "joiner": "10.251.0.1"}),
        ("the peer leaves", peers),
    ):
        wall, per_node, result = timed_apply(jobs(cluster))
        steps.append(step_summary(name, wall, per_node, result, backends))
    return steps


def peer_set(lab: Lab, peers: int) -> list[dict[str, Any]]:
    hosts = [
        lab.add_host(HostSpec(f"bench-big-{backend}", extra_packages=BACKEND_PACKAGES[backend])) for backend in BACKENDS
    ]
    lab.wait_ssh_ready(hosts, timeout=300)
    wait_for_firewalld([host for host in hosts if "firewalld" in host.spec.extra_packages])
    results = []
    for host, backend in zip(hosts, BACKENDS, strict=True):
        small = {"server": "10.250.255.1", host.name: str(host.private_ip), **simulated_peers(3)}
        large = {"server": "10.250.255.1", host.name: str(host.private_ip), **simulated_peers(peers)}
        larger = {**large, "one-more": "10.251.0.2"}
        row: dict[str, Any] = {"backend": backend, "peers": peers}
        for name, cluster in (("small", small), ("to_peers", large), ("one_more", larger), ("again", larger)):
            wall, _, result = timed_apply([NodeFirewallJob(target(lab, host), plan(host.name, "server", cluster))])
            if result.failed:
                row[f"{name}_error"] = result.failed[host.name]
                break
            row[f"{name}_s"] = round(wall, 3)
            row[f"{name}_rule_count"] = result.applied[host.name].rule_count
        results.append(row)
    return results


def print_tables(report: dict[str, Any]) -> None:
    print(f"\nFleet of {report['fleet_nodes']} lab nodes, one atomic change per node, all in parallel")
    print(f"{'step':<26} {'wall s':>7}  {'backend':<10} {'nodes':>5} {'median s':>9} {'max s':>7} {'rules':>9}")
    for step in report["fleet"]:
        first = True
        for backend, info in step["by_backend"].items():
            label = step["step"] if first else ""
            wall = f"{step['wall_s']:.2f}" if first else ""
            rules = f"{info['rule_count_min']}-{info['rule_count_max']}"
            print(
                f"{label:<26} {wall:>7}  {backend:<10} {info['nodes']:>5} {info['median_s']:>9.2f} "
                f"{info['max_s']:>7.2f} {rules:>9}"
            )
            first = False
        if step["failed"]:
            print(f"  failed: {step['failed']}")
    print(f"\nOne node, simulated peer set of {report['peer_set_size']} addresses")
    print(f"{'backend':<10} {'to N peers s':>13} {'rules':>6} {'one more s':>11} {'rules':>6} {'again s':>8}")
    for row in report["peer_set"]:
        if any(key.endswith("_error") for key in row):
            print(f"{row['backend']:<10} error: {next(v for k, v in row.items() if k.endswith('_error'))}")
            continue
        print(
            f"{row['backend']:<10} {row['to_peers_s']:>13.2f} {row['to_peers_rule_count']:>6} "
            f"{row['one_more_s']:>11.2f} {row['one_more_rule_count']:>6} {row['again_s']:>8.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--peers", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    missing = missing_prerequisites()
    if missing:
        print("cannot run the lab here: " + "; ".join(missing), file=sys.stderr)
        return 2
    report: dict[str, Any] = {"fleet_nodes": args.nodes, "peer_set_size": args.peers}
    # A lab per part: every booted host's systemd holds inotify instances, and the
    # machine's per-user limit (fs.inotify.max_user_instances, 128 by default) is shared.
    for part, run in (
        ("fleet", lambda lab: fleet(lab, args.nodes)),
        ("peer_set", lambda lab: peer_set(lab, args.peers)),
    ):
        lab = Lab(cache_dir=DEFAULT_CACHE_DIR)
        try:
            for packages in BACKEND_PACKAGES.values():
                lab.ensure_base(packages)
            report[part] = run(lab)
        finally:
            lab.teardown()
    print_tables(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
