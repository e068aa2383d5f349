"""The lab's command line: ``python -m lab.hosts up --hosts 3 [--variety]`` /
``python -m lab.hosts list`` / ``python -m lab.hosts down [--lab ID | --all]``."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from lab.hosts.errors import LabError
from lab.hosts.host import HostSpec
from lab.hosts.lab import DEFAULT_CACHE_DIR, DEFAULT_RUN_ROOT, Lab, all_lab_dirs, missing_prerequisites


def _cli_up(args: argparse.Namespace) -> int:
    lab = Lab(cache_dir=args.cache_dir)
    lab.created_by_cli = True
    try:
        lab.ensure_base()
        hosts = []
        for i in range(args.hosts):
            name = f"{args.name_prefix}{i + 1}"
            if i == 0:
                spec = HostSpec(name=name)
            elif args.variety and i == 1:
                spec = HostSpec(name=name, private_default_route=True)
            elif args.variety and i == 2:
                spec = HostSpec(name=name, private_nic=False)
            elif args.variety and i == 3:
                spec = HostSpec(name=name, behind_nat=True)
            else:
                spec = HostSpec(name=name)
            hosts.append(lab.add_host(spec))
        times = lab.wait_ssh_ready(hosts, timeout=args.timeout)
    except BaseException:
        lab.teardown()
        raise
    print(lab.describe())
    print("SSH-ready after: " + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in times.items()))
    print(f"tear down with: {shlex.join([sys.executable, '-m', 'lab.hosts', 'down', '--lab', lab.lab_id])}")
    return 0


def _cli_down(args: argparse.Namespace) -> int:
    dirs = all_lab_dirs(args.run_root)
    chosen: list[Path] = []
    for directory in dirs:
        state = json.loads((directory / "state.json").read_text())
        if args.lab:
            if directory.name in args.lab:
                chosen.append(directory)
        elif args.all or state.get("created_by_cli"):
            chosen.append(directory)
    if args.lab:
        for lab_id in args.lab:
            if lab_id not in {d.name for d in chosen}:
                # No state: tear down by name alone.
                chosen.append(args.run_root / lab_id)
    if not chosen:
        print("no lab to tear down (labs made by tests need --lab ID or --all)")
        return 0
    status = 0
    for directory in chosen:
        try:
            if (directory / "state.json").exists():
                lab = Lab.attach(directory)
            else:
                lab = Lab(args.cache_dir, directory, lab_id=directory.name)
            lab.teardown()
            print(f"lab {directory.name} torn down")
        except LabError as err:
            print(f"lab {directory.name}: {err}", file=sys.stderr)
            status = 1
    return status


def _cli_list(args: argparse.Namespace) -> int:
    for directory in all_lab_dirs(args.run_root):
        lab = Lab.attach(directory)
        print(lab.describe())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.hosts", description="Boot real Debian hosts for the lab.")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--run-root", type=Path, default=DEFAULT_RUN_ROOT)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="boot hosts and print how to reach them")
    up.add_argument("--hosts", type=int, default=3)
    up.add_argument("--name-prefix", default="node")
    up.add_argument(
        "--variety", action="store_true", help="host 2 routes via private, 3 has no private NIC, 4 is behind NAT"
    )
    up.add_argument("--timeout", type=float, default=180)
    down = sub.add_parser("down", help="tear down labs made by 'up' (or --lab ID, or --all)")
    down.add_argument("--lab", action="append", default=[])
    down.add_argument("--all", action="store_true")
    sub.add_parser("list", help="show the labs on this machine")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    missing = missing_prerequisites()
    if missing:
        print("cannot run the lab here: " + "; ".join(missing), file=sys.stderr)
        return 2
    if args.command == "up":
        return _cli_up(args)
    if args.command == "down":
        return _cli_down(args)
    return _cli_list(args)


if __name__ == "__main__":
    sys.exit(main())
