"""The operator CLI: `scripts/hk3s [--stack ENV] [--json] COMMAND`.

Commands: `node add|list|check-disk|reboot|fence|unfence|remove`, `workload start`, `status`,
`preview`, `up`, `unlock`, `state list|restore`. Tables for people by default, `--json` for
programs (on stdout; progress and messages go to stderr).

Exit codes: 0 done; 1 failed part-way (fix the cause and run again: it continues);
2 usage; 3 refused, nothing changed (bad input, a backend that cannot be used, a capability this
release lacks, a failed preflight, or a confirmation not given); 4 the stack is busy with another run.

Actions that restart the Kubernetes API or release data (`node remove`, `node fence
--accept-stale-data`, `workload start --accept-stale-data`, an `up` whose plan restarts the
server or deletes resources) need `--yes`; without it the command shows the plan and asks, or
refuses when stdin is not a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from pulumi.automation import events as auto_events

from node_operations.reboot import DRAIN_TIMEOUT_SECONDS
from operator_api import (
    REPO,
    ClusterStack,
    DiskCheck,
    HostCheck,
    MaintenanceError,
    Node,
    PlannedChange,
    Preview,
    RefusedError,
    ResourceFailedError,
    RunFailedError,
    RunResult,
    SettingsRejectedError,
    StackBusyError,
    StackDocument,
    StackError,
    TeardownNotConfirmedError,
    WorkloadStartRefusedError,
)
from operator_api.events import PROGRESS_LINE, UNCHANGED_OPS
from operator_api.s3_backend import BackendError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_BUSY = 4


class ConfirmationMissingError(Exception):
    """The action needs --yes (or a 'y' on the terminal) and did not get it."""


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--stack", default=argparse.SUPPRESS, help="environment: Pulumi.<ENV>.yaml (default dev)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")

    parser = argparse.ArgumentParser(
        prog="hk3s",
        description="Operate the k3s cluster of one stack (Pulumi.<env>.yaml).",
        epilog="Exit codes: 0 done, 1 failed, 2 usage, 3 refused (nothing changed), 4 stack busy.",
    )
    parser.add_argument("--stack", default="dev", help="environment: Pulumi.<ENV>.yaml (default dev)")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    parser.add_argument("--project-dir", type=Path, default=REPO, help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    node = commands.add_parser("node", help="add, list, fence, unfence or remove workers")
    node_commands = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    add = node_commands.add_parser(
        "add", parents=[common], help="add a worker (an existing host, or a Hetzner server to create) and join it"
    )
    add.add_argument("name")
    add.add_argument("--address", help="an existing host's public IPv4 address")
    add.add_argument("--hetzner", action="store_true", help="create a Hetzner Cloud server for the worker")
    add.add_argument("--server-type", help="with --hetzner: the server type (default hk3s:cluster.server_type)")
    add.add_argument("--location", help="with --hetzner: the location (default hk3s:cluster.location)")
    add.add_argument("--ssh-port", type=int, default=22)
    add.add_argument("--ssh-address", help="where SSH reaches the host, if not at --address")
    add.add_argument("--private-address", help="the host's address on the private network")
    add.add_argument("--no-copies", action="store_true", help="the worker holds no volume copies")
    add.add_argument("--label", type=_label, action="append", default=[], metavar="KEY=VALUE")
    node_commands.add_parser(
        "list", parents=[common], help="every node, from the stack outputs, with its state in the cluster now"
    )
    fence = node_commands.add_parser("fence", parents=[common], help="fence a dead worker")
    fence.add_argument("name")
    fence.add_argument("--powered-off", action="store_true", help="the host is off and stays off")
    fence.add_argument("--accept-stale-data", action="store_true", help="let services start from older copies")
    fence.add_argument("--yes", action="store_true", help="no question (needed with --accept-stale-data)")
    unfence = node_commands.add_parser("unfence", parents=[common], help="lift a worker's fence")
    unfence.add_argument("name")
    check_disk = node_commands.add_parser(
        "check-disk", parents=[common], help="probe a worker's Longhorn disk again: may it hold volume copies?"
    )
    check_disk.add_argument("name")
    reboot = node_commands.add_parser(
        "reboot", parents=[common], help="cordon, drain, reboot a worker; uncordon once Ready; wait for its workloads"
    )
    reboot.add_argument("name")
    reboot.add_argument(
        "--drain-timeout", type=float, default=DRAIN_TIMEOUT_SECONDS, metavar="SECONDS", help="give up the drain after"
    )
    remove = node_commands.add_parser("remove", parents=[common], help="remove a worker (releases its data)")
    remove.add_argument("name")
    remove.add_argument("--yes", action="store_true", help="no question")
    remove.add_argument(
        "--force", action="store_true", help="give up a fenced worker: deregister it without a drain (host off or gone)"
    )

    workload = commands.add_parser("workload", help="start a workload a fence stopped")
    workload_commands = workload.add_subparsers(dest="workload_command", required=True, metavar="ACTION")
    start = workload_commands.add_parser(
        "start",
        parents=[common],
        help="start one workload a fence stopped, judged by its volumes' copies as the fence judges",
    )
    start.add_argument("workload", metavar="NAMESPACE/KIND/NAME", help="e.g. default/Deployment/db")
    start.add_argument(
        "--accept-stale-data", action="store_true", help="start it from copies that may be older than the lost one"
    )
    start.add_argument("--yes", action="store_true", help="no question (needed with --accept-stale-data)")

    init = commands.add_parser(
        "init", parents=[common], help="make the stack in its backend, with the secrets provider you choose"
    )
    init.add_argument(
        "--secrets-provider",
        metavar="URL",
        default=None,
        help="passphrase, default (Pulumi Cloud's) or a key service: awskms://KEY?region=R, gcpkms://..., "
        "azurekeyvault://..., hashivault://... (default: the passphrase for a file:// or s3:// backend)",
    )
    status = commands.add_parser("status", parents=[common], help="endpoint, version, nodes, last run, locks")
    status.add_argument(
        "--check", action="store_true", help="also check every node over SSH (k3s, disk, clock, certificate)"
    )
    commands.add_parser("preview", parents=[common], help="what up would change, per resource")
    commands.add_parser(
        "refresh",
        parents=[common],
        help="read every node's drift into the state (a rebuilt host, a firewall edited by hand); changes no host",
    )
    up = commands.add_parser("up", parents=[common], help="bring the cluster to the stack file")
    up.add_argument("--yes", action="store_true", help="no question when the plan restarts the API or deletes")
    destroy = commands.add_parser(
        "destroy",
        parents=[common],
        help="tear the stack down: every host wiped, its data not kept (see docs/teardown.md)",
    )
    destroy.add_argument("--confirm", metavar="STACK", default="", help="the stack's name, to say you mean it")
    unlock = commands.add_parser(
        "unlock",
        parents=[common],
        help="show who holds the stack's lock and how long; remove it (a run that died elsewhere) on confirmation",
    )
    unlock.add_argument("--yes", action="store_true", help="remove the lock(s) shown without a question")
    state = commands.add_parser("state", help="the states the backend kept after each run; restore one")
    state_commands = state.add_subparsers(dest="state_command", required=True, metavar="STATE_COMMAND")
    state_commands.add_parser("list", parents=[common], help="the kept states, newest first")
    restore = state_commands.add_parser(
        "restore", parents=[common], help="make a kept state the stack's state again (changes no host)"
    )
    restore.add_argument("checkpoint", help="a CHECKPOINT from `state list`")
    restore.add_argument("--confirm", metavar="STACK", default="", help="the stack's name, to say you mean it")
    return parser


class Console:
    """Where results, progress and questions go."""

    def __init__(self, *, as_json: bool, out: TextIO, err: TextIO, stdin: TextIO) -> None:
        self.as_json = as_json
        self.out = out
        self.err = err
        self.stdin = stdin
        self._seen: set[str] = set()

    def say(self, message: str) -> None:
        print(message, file=self.err, flush=True)

    def output_line(self, line: str) -> None:
        """Engine output: show node progress lines (`[node] message`) and this API's notes as they come."""
        text = line.rstrip()
        match = PROGRESS_LINE.search(text)
        if match:
            shown = f"  [{match['node']}] {match['message']}"
        elif text.startswith("hk3s: "):
            shown = text
        else:
            return
        if shown not in self._seen:
            self._seen.add(shown)
            self.say(shown)

    def event(self, event: auto_events.EngineEvent) -> None:
        """Each resource step as it starts and each failure."""
        if event.resource_pre_event is not None:
            metadata = event.resource_pre_event.metadata
            op = str(getattr(metadata.op, "value", metadata.op))
            if op not in UNCHANGED_OPS and not metadata.type.startswith("pulumi:providers:"):
                self.say(f"{op:>8} {_short_type(metadata.type)} {metadata.urn.split('::')[-1]}")
        if event.res_op_failed_event is not None:
            metadata = event.res_op_failed_event.metadata
            self.say(f"  failed {_short_type(metadata.type)} {metadata.urn.split('::')[-1]}")

    def confirm(self, question: str, *, yes: bool) -> None:
        if yes:
            return
        if not self.stdin.isatty():
            raise ConfirmationMissingError(f"{question}: stdin is not a terminal, so nothing was done; pass --yes")
        self.err.write(f"{question} [y/N] ")
        self.err.flush()
        if self.stdin.readline().strip().lower() not in ("y", "yes"):
            raise ConfirmationMissingError("not confirmed; nothing was changed")

    def result(self, data: Any, human: str) -> None:
        if self.as_json:
            print(json.dumps(data, indent=2, sort_keys=False), file=self.out)
        else:
            print(human, file=self.out)


def _short_type(type_: str) -> str:
    return type_.rsplit(":", 1)[-1]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [headers, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def copies_cell(node: Node) -> str:
    """COPIES: may the node hold volume copies, and why not or on whose word."""
    disk = node.disk
    if disk is None or node.role == "server":
        return "yes" if node.holds_copies else "no"
    if disk.override:
        return "yes(override)"
    return "yes" if disk.eligible else "no(slow-disk)"


def disk_sync_cell(disk: DiskCheck | None) -> str:
    """DISK_SYNC: p99/worst sync time of a worker's Longhorn disk at its last probe."""
    if disk is None or disk.sync_p99_ms is None or disk.sync_worst_ms is None:
        return "-"
    return f"{disk.sync_p99_ms:.1f}/{disk.sync_worst_ms:.1f}ms"


def nodes_table(nodes: Sequence[Node]) -> str:
    if not nodes:
        return "No nodes yet: the stack has not been deployed (run up)."
    rows = [
        [
            node.name,
            node.role,
            node.state,
            node.address or "-",
            node.ssh_address or "-",
            node.private_address or "-",
            node.network_mode or "-",
            copies_cell(node),
            disk_sync_cell(node.disk),
            "yes" if node.fenced else "no",
            node.k3s_version or "-",
        ]
        for node in nodes
    ]
    headers = ["NAME", "ROLE", "STATE", "ADDRESS", "SSH", "PRIVATE", "NETWORK", "COPIES", "DISK_SYNC", "FENCED", "K3S"]
    return table(headers, rows)


def disk_notes(nodes: Sequence[Node]) -> list[str]:
    """One line per worker whose disk was refused or accepted by an override: the probe's verdict."""
    return [
        f"{node.name}: {'override' if node.disk.override else 'no copies'}: {node.disk.verdict}"
        for node in nodes
        if node.disk is not None and node.disk.verdict and (node.disk.override or not node.disk.eligible)
    ]


def disk_check_text(name: str, disk: DiskCheck) -> str:
    state = "may hold volume copies" if disk.eligible else "holds no volume copies"
    if disk.override:
        state += " (ignore_slow_disk override)"
    return f"{name} {state}\n{disk.verdict or ''}".rstrip()


def changes_table(changes: Sequence[PlannedChange]) -> str:
    if not changes:
        return "No changes."
    return table(["OP", "TYPE", "NAME"], [[c.op, _short_type(c.type), c.name] for c in changes])


def preview_text(preview: Preview) -> str:
    counts = ", ".join(f"{op} {count}" for op, count in sorted(preview.summary.items()))
    return changes_table(preview.changes) + (f"\n\nSummary: {counts}" if counts else "")


def preview_data(preview: Preview) -> dict[str, Any]:
    return {
        "changes": [asdict(change) for change in preview.changes],
        "summary": preview.summary,
        "restarts_api": preview.restarts_api,
    }


def run_data(result: RunResult) -> dict[str, Any]:
    return {
        "command": result.command,
        "result": "succeeded",
        "summary": result.summary,
        "changes": [asdict(change) for change in result.changes],
        "recovery": asdict(result.recovery),
        "host_keys_recorded": dict(result.host_keys_recorded),
    }


def run_text(result: RunResult) -> str:
    counts = ", ".join(f"{op} {count}" for op, count in sorted(result.summary.items())) or "nothing to report"
    notes = ""
    if result.recovery.needed:
        notes = (
            f"\nRecovered from an interrupted run: {len(result.recovery.stale_locks)} stale lock(s) removed, "
            f"{len(result.recovery.cleared_pending)} pending operation(s) cleared."
        )
    for node, key in sorted(result.host_keys_recorded.items()):
        notes += (
            f"\nSSH host key of {node} recorded on first use (hk3s:ssh.trust_on_first_use): {key}; compare it with "
            f"the host's own (its console), then pin it with hk3s:ssh.host_keys.{node}."
        )
    return f"{result.command} succeeded: {counts}{notes}"


def status_text(stack: ClusterStack, *, check_hosts: bool = False) -> tuple[dict[str, Any], str]:
    status = stack.status(check_hosts=check_hosts)
    last = status.last_run
    lines = [
        f"Stack:        {status.stack}",
        f"API endpoint: {status.api_endpoint or '-'}",
        f"k3s version:  {status.k3s_version or '-'}",
        f"Storage:      {', '.join(status.storage_classes) or '-'}",
        f"Last run:     {f'{last.kind} {last.result} at {last.ended or last.started}' if last else 'never'}",
        f"Pending ops:  {len(status.pending_operations)}",
        f"Locked by:    {', '.join(status.locked_by) or 'nobody'}",
        "",
        nodes_table(status.nodes),
    ]
    if status.live_error:
        lines.append(f"STATE is the last run's: the cluster could not be asked ({status.live_error})")
    notes = disk_notes(status.nodes)
    if notes:
        lines += ["", "Disks (COPIES, DISK_SYNC: p99/worst sync time at the last probe):", *notes]
    for worker in status.down_workers:
        # Workloads on a NotReady worker wait there: say where their data could start from, and how.
        lines += ["", worker.advice]
        lines += [f"  stranded: {item.line}" for item in worker.stranded] or [
            f"  stranded: no workload with Longhorn volumes on {worker.name}"
        ]
    if status.held_running:
        # A workload a fence holds stopped that runs anyway may be writing on older copies.
        lines += ["", "Held stopped by a fence, but running:", *(f"  {line}" for line in status.held_running)]
    if check_hosts:
        lines += ["", host_checks_table(status.host_checks)]
        lines += ["", *(f"warning: {w}" for w in status.warnings)] if status.warnings else ["", "No warnings."]
    return status.to_dict(), "\n".join(lines)


def host_checks_table(checks: Sequence[HostCheck]) -> str:
    def yes_no(value: bool | None) -> str:
        return "-" if value is None else "yes" if value else "no"

    rows = [
        [
            check.node,
            "yes" if check.reachable else "no",
            f"{check.k3s_unit} {yes_no(check.k3s_active)}" if check.k3s_unit else "-",
            " ".join(f"{mount}:{free}%" for mount, free in sorted(check.disk_free_percent.items())) or "-",
            yes_no(check.time_synced),
            "-" if check.cert_expires_in_days is None else f"{check.cert_expires_in_days}d",
        ]
        for check in checks
    ]
    return table(["NODE", "REACHED", "K3S ACTIVE", "DISK FREE", "CLOCK SYNCED", "CERT EXPIRES"], rows)


def _confirm_plan(console: Console, stack: ClusterStack, proposed: StackDocument, question: str, yes: bool) -> None:
    if yes:
        return
    try:
        plan = preview_text(stack.preview(proposed=proposed))
    except RunFailedError as error:
        plan = f"(the plan could not be previewed: {error})"
    console.say("The plan:")
    console.say(plan)
    console.confirm(question, yes=yes)


def _confirm_disruptive_up(console: Console, stack: ClusterStack) -> None:
    """Ask before an up whose plan restarts the Kubernetes API or deletes, or cannot be previewed."""
    try:
        preview = stack.preview(on_output=console.output_line)
    except RunFailedError as error:
        console.say(f"The plan could not be previewed: {error}")
        console.confirm("Run up without knowing whether it restarts the API or deletes?", yes=False)
        return
    if preview.restarts_api or preview.deletes:
        what = "restarts the Kubernetes API" if preview.restarts_api else "deletes resources"
        console.say("The plan:")
        console.say(preview_text(preview))
        console.confirm(f"This up {what}. Go ahead?", yes=False)


def run_command(args: argparse.Namespace, console: Console, stack: ClusterStack) -> int:
    runs: dict[str, Callable[[], RunResult]] = {}
    if args.command == "init":
        provider = stack.init()
        data = {"stack": stack.env, "backend": stack.backend_url, "secrets_provider": provider}
        console.result(
            data,
            f"stack {stack.env} in {stack.backend_url}, secrets encrypted by "
            f"{provider or 'the backend service'} ({stack.backend_choice.source})",
        )
        return EXIT_OK
    if args.command == "status":
        data, human = status_text(stack, check_hosts=args.check)
        console.result(data, human)
        return EXIT_OK
    if args.command == "unlock":
        return _unlock(console, stack, yes=args.yes)
    if args.command == "state":
        return _state(console, stack, args)
    if args.command == "workload":
        if args.accept_stale_data:
            console.confirm(f"Start {args.workload} from copies that may be older than the lost one?", yes=args.yes)
        line = stack.start_workload(
            args.workload, accept_stale_data=args.accept_stale_data, on_output=console.output_line
        )
        console.result({"workload": args.workload, "started": line}, line)
        return EXIT_OK
    if args.command == "preview":
        preview = stack.preview(on_output=console.output_line)
        console.result(preview_data(preview), preview_text(preview))
        return EXIT_OK
    if args.command == "up":
        if not args.yes:
            _confirm_disruptive_up(console, stack)
        runs["up"] = lambda: stack.up(on_event=console.event, on_output=console.output_line)
    elif args.command == "refresh":
        runs["up"] = lambda: stack.refresh(on_event=console.event, on_output=console.output_line)
    elif args.command == "destroy":
        runs["up"] = lambda: stack.destroy_stack(
            confirm=args.confirm, on_event=console.event, on_output=console.output_line
        )
    elif args.command == "node":
        if args.node_command == "list":
            nodes = stack.nodes(live=True)
            notes = disk_notes(nodes)
            if nodes and nodes[0].live_error:
                notes.append(f"STATE is the last run's: the cluster could not be asked ({nodes[0].live_error})")
            console.result([node.to_dict() for node in nodes], "\n".join([nodes_table(nodes), *notes]))
            return EXIT_OK
        if args.node_command == "reboot":
            report = stack.reboot_worker(args.name, drain_timeout=args.drain_timeout, on_output=console.output_line)
            console.result(asdict(report), report.summary())
            return EXIT_OK if not report.not_ready else EXIT_FAILED
        if args.node_command == "check-disk":
            disk = stack.check_disk(args.name, on_event=console.event, on_output=console.output_line)
            console.result({"name": args.name, **asdict(disk)}, disk_check_text(args.name, disk))
            return EXIT_OK
        name = args.name
        if args.node_command == "add":
            runs["up"] = lambda: stack.add_worker(
                name,
                kind="hetzner" if args.hetzner else "existing",
                server_type=args.server_type,
                location=args.location,
                address=args.address,
                ssh_port=args.ssh_port,
                ssh_address=args.ssh_address,
                private_address=args.private_address,
                holds_copies=not args.no_copies,
                labels=dict(args.label),
                on_event=console.event,
                on_output=console.output_line,
            )
        elif args.node_command == "remove":
            runs["up"] = _removal(console, stack, name, force=bool(args.force), yes=args.yes)
        elif args.node_command == "fence":
            if args.accept_stale_data:

                def edit(doc: StackDocument) -> None:
                    doc.set_fence(name, powered_off=args.powered_off, accept_stale_data=True)

                proposed = stack.propose(edit, f"fencing {name}")
                question = f"Fence {name} and let services start from copies that may be stale?"
                _confirm_plan(console, stack, proposed, question, args.yes)
            runs["up"] = lambda: stack.fence(
                name,
                powered_off=args.powered_off,
                accept_stale_data=args.accept_stale_data,
                on_event=console.event,
                on_output=console.output_line,
            )
        elif args.node_command == "unfence":
            runs["up"] = lambda: stack.unfence(name, on_event=console.event, on_output=console.output_line)
    result = runs["up"]()
    console.result(run_data(result), run_text(result))
    return EXIT_OK


def _unlock(console: Console, stack: ClusterStack, *, yes: bool) -> int:
    """`unlock`: the holders and their ages; removed only when confirmed (a 'y' or --yes), and
    only those shown (a run that locked the stack since is left alone)."""
    report = stack.unlock()
    if report.holders:
        for line in report.lines():
            console.say(line)
        console.confirm(
            "Remove the lock? Only when its run is dead (that machine or CI job is gone): a live run would "
            "go on beside the next one",
            yes=yes,
        )
        report = stack.unlock(confirm=True, only=report.holders)
    data = {"stack": report.stack, "holders": [asdict(h) for h in report.holders], "ages": report.ages}
    data["removed"] = [asdict(h) for h in report.removed]
    human = "\n".join(report.lines())
    if report.removed:
        human += f"\nRun `scripts/hk3s --stack {report.stack} up` to continue: it clears the interrupted run first."
    console.result(data, human)
    return EXIT_OK


def _state(console: Console, stack: ClusterStack, args: argparse.Namespace) -> int:
    """`state list` and `state restore CHECKPOINT --confirm STACK`."""
    checkpoints = stack.checkpoints()
    if args.state_command == "list":
        rows = [[c.key, c.taken, c.kind or "-", c.result or "-"] for c in checkpoints]
        human = table(["CHECKPOINT", "TAKEN", "RUN", "RESULT"], rows) if rows else "No state kept yet."
        console.result([asdict(c) for c in checkpoints], human)
        return EXIT_OK
    chosen = next((c for c in checkpoints if c.key == args.checkpoint), None)
    if chosen is None:
        raise ConfirmationMissingError(
            f"{args.checkpoint} is not one of `state list`'s checkpoints; nothing was changed"
        )
    if args.confirm != stack.env:
        raise ConfirmationMissingError(
            f"restoring stack {stack.env} replaces its state: pass --confirm {stack.env}; nothing was changed"
        )
    stack.restore(chosen, confirm=args.confirm)
    console.result(
        asdict(chosen),
        f"stack {stack.env} restored to the state of {chosen.taken}; `preview` shows what differs from the hosts",
    )
    return EXIT_OK


def _removal(console: Console, stack: ClusterStack, name: str, *, force: bool, yes: bool) -> Callable[[], RunResult]:
    """`node remove NAME [--force]`: the plan shown and confirmed, then the run that removes it
    (with `force`, gives a fenced worker up)."""
    proposed = stack.propose(lambda doc: doc.remove_worker(name, force=force), f"removing worker {name}")
    question = (
        f"Give {name} up (no drain, its host left as it is)?" if force else f"Remove {name} and release its data?"
    )
    _confirm_plan(console, stack, proposed, question, yes)
    return lambda: stack.remove_worker(name, force=force, on_event=console.event, on_output=console.output_line)


def _error_data(error: Exception) -> dict[str, Any]:
    data: dict[str, Any] = {"error": type(error).__name__, "message": str(error)}
    if isinstance(error, SettingsRejectedError):
        data["problems"] = [{"key": p.key, "message": p.message} for p in error.problems]
    if isinstance(error, RunFailedError):
        data["problems"] = [asdict(p) for p in error.problems]
        data["config_restored"] = error.config_restored
    if isinstance(error, RefusedError):
        data["reason"] = error.reason
    if isinstance(error, StackBusyError):
        data["holders"] = [asdict(h) for h in error.holders]
    return data


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, with the rules argparse cannot say (usage errors exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "node_command", None) == "add" and bool(args.address) == bool(args.hetzner):
        parser.error("node add: give --address (an existing host) or --hetzner (a server the program creates)")
    return args


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None) -> int:
    args = parse_arguments(argv)
    console = Console(as_json=args.json, out=sys.stdout, err=sys.stderr, stdin=stdin or sys.stdin)
    try:
        stack = ClusterStack(
            args.stack,
            project_dir=args.project_dir,
            parallel=int(os.environ.get("HK3S_PARALLEL", "32")),
            secrets_provider=getattr(args, "secrets_provider", None),
        )
        if stack.backend_choice.first_use:
            console.say(f"hk3s: {stack.backend_choice.notice()}")
        return run_command(args, console, stack)
    except ConfirmationMissingError as error:
        return _fail(console, error, EXIT_REFUSED)
    except (
        BackendError,
        SettingsRejectedError,
        RefusedError,
        TeardownNotConfirmedError,
        WorkloadStartRefusedError,
    ) as error:
        return _fail(console, error, EXIT_REFUSED)
    except MaintenanceError as error:
        return _fail(console, error, EXIT_REFUSED if error.put_back else EXIT_FAILED)
    except StackBusyError as error:
        return _fail(console, error, EXIT_BUSY)
    except ResourceFailedError as error:
        # The stack file keeps the change (`node add`'s worker, `node remove`'s absence), so the
        # same command again would be refused by its own change: `up` continues towards the file.
        return _fail(
            console,
            error,
            EXIT_FAILED,
            f"Fix the cause above and run `scripts/hk3s --stack {args.stack} up --yes`: the stack file keeps "
            "the change, and the run continues where it stopped.",
        )
    except StackError as error:
        return _fail(console, error, EXIT_FAILED)
    except KeyboardInterrupt:
        console.say("interrupted; the next run recovers the stack and continues")
        return 130


def _fail(console: Console, error: Exception, code: int, hint: str = "") -> int:
    if console.as_json:
        print(json.dumps({**_error_data(error), "exit_code": code}, indent=2), file=console.out)
    console.say(f"hk3s: {error}" + (f"\n{hint}" if hint else ""))
    return code
