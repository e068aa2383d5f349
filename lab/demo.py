"""The program doing its job without a Hetzner account: `scripts/demo.sh up|down`.

LAB ONLY. `up` boots three lab hosts (a server and two workers: real Debian
machines with real SSH, the k3s stand-in on a real Kubernetes API server), writes
a stack for them with their SSH host keys pinned, and runs the operator CLI on
it: `up` with its progress, then `node list` and `status`. `down` tears the hosts
and the demo's state down again. What it does is exactly what an operator does
on existing hosts; only the machines and the k3s binary are the lab's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab.hosts import DEFAULT_CACHE_DIR, DEFAULT_RUN_ROOT, Host, Lab, LabError, missing_prerequisites
from lab.stack_harness import BIN, LabStack, base_config, lab_binaries_missing, server_spec, worker_spec

DEMO_DIR = Path(os.environ.get("HK3S_DEMO_DIR") or DEFAULT_RUN_ROOT.with_name(DEFAULT_RUN_ROOT.name + "-demo"))
STACK = "demo"
HOSTS = ("demo-server", "demo-worker-1", "demo-worker-2")


def _pinned_key(host: Host) -> str:
    # "ssh-ed25519 AAAA..." without the comment, as hk3s:ssh.host_keys takes it.
    return " ".join(host.ssh_host_public_key.split()[:2])


def demo_config(lab: Lab, server: Host, workers: list[Host]) -> dict[str, Any]:
    """The demo's stack: the lab's defaults, host keys pinned, host firewalls run by the
    program, the network mode decided from the hosts (the lab's private bridge)."""
    config = base_config(lab, server, workers, firewall={"managed": True}, network={"mode": "auto"})
    config["ssh"]["host_keys"] = {host.name: _pinned_key(host) for host in (server, *workers)}
    return config


def _hk3s(stack: LabStack, *args: str) -> int:
    """The operator CLI on the demo's stack, its progress on the terminal."""
    env = {**os.environ, **stack.env, "PULUMI_HOME": str(stack.directory / "pulumi-home")}
    argv = [str(stack.project / "scripts" / "hk3s"), "--stack", STACK, *args]
    print(f"$ scripts/hk3s --stack {STACK} {' '.join(args)}", flush=True)
    return subprocess.run(argv, cwd=stack.project, env=env, stdin=subprocess.DEVNULL, check=False).returncode


def up() -> int:
    """Boot the hosts, write the stack, run the CLI's up, node list and status."""
    if (DEMO_DIR / "demo.json").exists():
        print("a demo is already up: run `scripts/demo.sh down` first", file=sys.stderr)
        return 1
    missing = lab_binaries_missing()
    if missing:
        print(f"lab binaries missing ({', '.join(missing)}): run bash lab/setup.sh", file=sys.stderr)
        return 2
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    lab = Lab(cache_dir=DEFAULT_CACHE_DIR)
    lab.created_by_cli = True  # kept until `down`, whatever test runs reap
    (DEMO_DIR / "demo.json").write_text(json.dumps({"lab_id": lab.lab_id, "run_dir": str(lab.run_dir)}))
    print(f"booting {', '.join(HOSTS)} (lab {lab.lab_id})", flush=True)
    server = lab.add_host(server_spec(HOSTS[0]))
    workers = [lab.add_host(worker_spec(name)) for name in HOSTS[1:]]
    lab.wait_ssh_ready([server, *workers])
    stack = LabStack(DEMO_DIR / "stack", name=STACK)
    stack.write_config(demo_config(lab, server, workers))
    print(f"stack file: {stack.project / f'Pulumi.{STACK}.yaml'} (Pulumi CLI from {BIN})", flush=True)
    for args in (("up", "--yes"), ("node", "list"), ("status",)):
        if _hk3s(stack, *args) != 0:
            print(f"`scripts/hk3s {' '.join(args)}` failed; `scripts/demo.sh down` removes the demo", file=sys.stderr)
            return 1
    print("the demo is up; `scripts/demo.sh down` removes it", flush=True)
    return 0


def down() -> int:
    """Tear the demo's hosts and state down."""
    state_file = DEMO_DIR / "demo.json"
    if not state_file.exists():
        print("no demo is up")
        return 0
    state = json.loads(state_file.read_text())
    run_dir = Path(state["run_dir"])
    try:
        if (run_dir / "state.json").exists():
            Lab.attach(run_dir).teardown()
    except LabError as error:
        print(f"tearing down lab {state['lab_id']} failed: {error}", file=sys.stderr)
        return 1
    shutil.rmtree(DEMO_DIR)
    print(f"demo removed (lab {state['lab_id']} torn down)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo.sh", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down"))
    args = parser.parse_args(argv)
    missing = missing_prerequisites()
    if missing:
        print("the demo needs lab hosts, which cannot run here: " + "; ".join(missing), file=sys.stderr)
        return 2
    return up() if args.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
