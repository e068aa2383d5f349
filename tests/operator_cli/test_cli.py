"""The operator CLI's arguments, output and exit codes. Every case here ends before a Pulumi
command would run (bad input, a busy stack, a refused confirmation), so the real CLI code
runs end to end; the lab tests (tests/lab/test_automation.py) cover the runs themselves."""

from __future__ import annotations

import io
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from lab.stack_harness import lab_binaries_missing
from operator_api import DiskCheck, Node
from operator_cli.cli import (
    EXIT_BUSY,
    EXIT_REFUSED,
    ConfirmationMissingError,
    Console,
    build_parser,
    disk_check_text,
    disk_notes,
    main,
    nodes_table,
    parse_arguments,
)
from tests.operator_api.test_locks import write_lock

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, backend: Path) -> None:
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend.as_uri())
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "unit-test")


def run(project: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["--project-dir", str(project), *args], stdin=io.StringIO(""))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_arguments_parse_as_documented() -> None:
    parser = build_parser()
    argv = "--stack staging node add metal-2 --address 198.51.100.21 --ssh-port 2222 --no-copies"
    args = parser.parse_args([*argv.split(), "--label", "tier=batch", "--label", "zone=a"])
    assert (args.stack, args.command, args.node_command, args.name) == ("staging", "node", "add", "metal-2")
    assert (args.address, args.ssh_port, args.no_copies, args.label) == (
        "198.51.100.21",
        2222,
        True,
        [("tier", "batch"), ("zone", "a")],
    )
    # --stack and --json also work after the command, as CI writes them.
    late = parser.parse_args(["node", "list", "--stack", "staging", "--json"])
    assert late.stack == "staging" and late.json is True
    assert parser.parse_args(["up"]).stack == "dev" and parser.parse_args(["up"]).yes is False
    assert parser.parse_args(["refresh", "--stack", "staging"]).command == "refresh"
    cloud = parse_arguments(["node", "add", "cloud-3", "--hetzner", "--server-type", "cx23", "--location", "hel1"])
    assert (cloud.hetzner, cloud.server_type, cloud.location, cloud.address) == (True, "cx23", "hel1", None)
    fence = parser.parse_args(["node", "fence", "w", "--powered-off", "--accept-stale-data", "--yes"])
    assert (fence.powered_off, fence.accept_stale_data, fence.yes) == (True, True, True)


@pytest.mark.parametrize(
    "argv",
    [
        ["node", "add", "w"],
        ["node", "add", "w", "--address", "1.2.3.4", "--hetzner"],
        ["node", "add", "w", "--address", "1.2.3.4", "--label", "novalue"],
        ["bogus"],
        [],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_arguments(argv)
    assert caught.value.code == 2


def test_bad_input_exits_3_with_the_setting_named(
    project: Path, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (project / "Pulumi.dev.yaml").read_bytes()
    code, out, err = run(project, capsys, "node", "add", "metal-2", "--address", "198.51.100.300")
    assert code == EXIT_REFUSED and out == ""
    assert "hk3s:workers[2].address" in err and "not an IPv4 address" in err
    code, out, _ = run(project, capsys, "--json", "node", "add", "dev-worker-1", "--address", "198.51.100.21")
    data = json.loads(out)
    assert code == EXIT_REFUSED and data["error"] == "DuplicateWorkerError" and data["exit_code"] == 3
    assert data["problems"] == [
        {
            "key": "hk3s:workers[0].name",
            "message": "'dev-worker-1' is already a node of this stack; choose another worker name",
        }
    ]
    # A Hetzner worker: its settings reach the same validation (here a location that does not exist).
    code, out, err = run(
        project, capsys, "node", "add", "cloud-3", "--hetzner", "--server-type", "cx23", "--location", "mars"
    )
    assert code == EXIT_REFUSED and "hk3s:workers[2].location" in err and "not a Hetzner Cloud location" in err
    code, out, _ = run(project, capsys, "--json", "node", "fence", "nobody")
    assert code == EXIT_REFUSED and json.loads(out)["problems"][0]["key"] == "hk3s:fences.nobody"
    assert (project / "Pulumi.dev.yaml").read_bytes() == before


def test_a_busy_stack_exits_4_naming_the_holder(
    project: Path,
    backend: Path,
    cli_env: None,
    capsys: pytest.CaptureFixture[str],
    running_pulumi: subprocess.Popen[bytes],
) -> None:
    write_lock(backend, "dev", running_pulumi.pid)
    code, out, err = run(project, capsys, "--json", "up", "--yes")
    data = json.loads(out)
    assert code == EXIT_BUSY and data["error"] == "StackBusyError", (code, data, err)
    assert data["holders"][0]["pid"] == running_pulumi.pid and data["holders"][0]["hostname"] == socket.gethostname()
    assert "is busy" in err


def test_confirmation_needs_yes_or_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = io.StringIO()
    piped = Console(as_json=False, out=io.StringIO(), err=err, stdin=io.StringIO("y\n"))
    with pytest.raises(ConfirmationMissingError, match="pass --yes"):
        piped.confirm("Remove w?", yes=False)
    piped.confirm("Remove w?", yes=True)  # --yes: no question
    Console(as_json=False, out=io.StringIO(), err=err, stdin=Terminal("y\n")).confirm("Remove w?", yes=False)
    assert "Remove w? [y/N]" in err.getvalue()
    with pytest.raises(ConfirmationMissingError, match="not confirmed"):
        Console(as_json=False, out=io.StringIO(), err=err, stdin=Terminal("n\n")).confirm("Remove w?", yes=False)


def test_progress_shows_each_node_line_once() -> None:
    err = io.StringIO()
    console = Console(as_json=False, out=io.StringIO(), err=err, stdin=io.StringIO())
    for line in [
        "    pulumi-python:dynamic/hk3s:NodeJoin (w1-join):",
        "      [w1] preflight (at 0.4s)",
        "      [w1] preflight (at 0.4s)",
        "@ updating....",
        "      [w2] preparing the host (at 1.2s)",
        "hk3s: removed the lock of an interrupted run: ops@host (pid 7) is no longer running",
    ]:
        console.output_line(line)
    assert err.getvalue().splitlines() == [
        "  [w1] preflight (at 0.4s)",
        "  [w2] preparing the host (at 1.2s)",
        "hk3s: removed the lock of an interrupted run: ops@host (pid 7) is no longer running",
    ]


def test_node_table_and_json_come_from_the_same_nodes() -> None:
    output = [
        {
            "name": "s",
            "role": "server",
            "address": "198.51.100.2",
            "private_address": None,
            "ssh_address": "198.51.100.2",
        }
        | {"holds_copies": True, "state": "server"},
        {
            "name": "w1",
            "role": "worker",
            "address": "198.51.100.3",
            "private_address": None,
            "ssh_address": "198.51.100.3",
        }
        | {"network_mode": "public", "k3s_version": "v1.31.4+k3s1", "holds_copies": False, "fenced": False}
        | {"state": "ready"},
    ]
    nodes = [Node.from_output(item) for item in output]
    assert nodes[1].to_dict() == {
        "name": "w1",
        "role": "worker",
        "state": "ready",
        "address": "198.51.100.3",
        "private_address": None,
        "ssh_address": "198.51.100.3",
        "network_mode": "public",
        "k3s_version": "v1.31.4+k3s1",
        "holds_copies": False,
        "fenced": False,
        "disk": None,
        "recorded_state": None,
        "live_error": None,
    }
    lines = nodes_table(nodes).splitlines()
    assert lines[0].split() == [
        "NAME",
        "ROLE",
        "STATE",
        "ADDRESS",
        "SSH",
        "PRIVATE",
        "NETWORK",
        "COPIES",
        "DISK_SYNC",
        "FENCED",
        "K3S",
    ]
    assert lines[2].split() == [
        "w1",
        "worker",
        "ready",
        "198.51.100.3",
        "198.51.100.3",
        "-",
        "public",
        "no",
        "-",
        "no",
        "v1.31.4+k3s1",
    ]


def _worker_with_disk(name: str, eligible: bool, override: bool, p99: float, worst: float) -> dict:
    return {
        "name": name,
        "role": "worker",
        "state": "ready",
        "holds_copies": eligible,
        "disk": {
            "eligible": eligible,
            "override": override,
            "sync_p99_ms": p99,
            "sync_worst_ms": worst,
            "writes": 300,
            "threshold_ms": 10.0,
            "verdict": f"{name}: the disk at /var/lib/longhorn ... p99 {p99} ms",
            "probe_seconds": 0.4,
            "filesystem": "/dev/sda1 (ext4 on /)",
        },
    }


def test_node_table_shows_who_may_hold_copies_the_disk_figures_and_overrides() -> None:
    output = [
        {"name": "s", "role": "server", "state": "server", "holds_copies": True},
        _worker_with_disk("fast", True, False, 0.42, 1.3),
        _worker_with_disk("slow", False, False, 25.0, 31.5),
        _worker_with_disk("accepted", True, True, 24.0, 30.0),
        {"name": "opted-out", "role": "worker", "state": "ready", "holds_copies": False, "disk": None},
    ]
    nodes = [Node.from_output(item) for item in output]
    assert nodes[1].disk is not None and nodes[1].disk.to_dict() == {
        "eligible": True,
        "override": False,
        "sync_p99_ms": 0.42,
        "sync_worst_ms": 1.3,
        "writes": 300,
        "threshold_ms": 10.0,
        "verdict": "fast: the disk at /var/lib/longhorn ... p99 0.42 ms",
        "probe_seconds": 0.4,
    }
    rows = {line.split()[0]: line.split() for line in nodes_table(nodes).splitlines()[1:]}
    copies = {name: (row[7], row[8]) for name, row in rows.items()}
    assert copies == {
        "s": ("yes", "-"),
        "fast": ("yes", "0.4/1.3ms"),
        "slow": ("no(slow-disk)", "25.0/31.5ms"),
        "accepted": ("yes(override)", "24.0/30.0ms"),
        "opted-out": ("no", "-"),
    }
    # The refused and the overridden disk get their verdict under the table; the others do not.
    assert disk_notes(nodes) == [
        "slow: no copies: slow: the disk at /var/lib/longhorn ... p99 25.0 ms",
        "accepted: override: accepted: the disk at /var/lib/longhorn ... p99 24.0 ms",
    ]


def test_the_wrapper_script_runs_the_cli(tmp_path: Path) -> None:
    """scripts/hk3s as CI calls it; --help needs no stack, so it ends before Pulumi runs."""
    # The wrapper takes the lab's Pulumi CLI where no other is installed.
    if shutil.which("pulumi") is None and lab_binaries_missing(["pulumi"]):
        pytest.skip("no Pulumi CLI here (the wrapper refuses without one)")
    result = subprocess.run([str(REPO / "scripts" / "hk3s"), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "Exit codes: 0 done, 1 failed, 2 usage, 3 refused" in result.stdout
    bad = subprocess.run([str(REPO / "scripts" / "hk3s"), "bogus"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2


def test_destroy_needs_the_stack_named(project: Path, cli_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --confirm naming the stack, nothing runs (no Pulumi command, no state read)."""
    before = (project / "Pulumi.dev.yaml").read_bytes()
    for confirm in ([], ["--confirm", "prod"]):
        code, out, err = run(project, capsys, "--json", "destroy", *confirm)
        data = json.loads(out)
        assert code == EXIT_REFUSED and data["error"] == "TeardownNotConfirmedError", data
        assert "destroying stack dev needs confirm='dev'" in err and "nothing was changed" in err
    assert (project / "Pulumi.dev.yaml").read_bytes() == before


def test_check_disk_is_a_node_command_and_says_the_verdict() -> None:
    args = parse_arguments(["--stack", "staging", "node", "check-disk", "metal-1"])
    assert (args.command, args.node_command, args.name) == ("node", "check-disk", "metal-1")
    with pytest.raises(SystemExit) as usage:
        parse_arguments(["node", "check-disk"])
    assert usage.value.code == 2
    refused = DiskCheck(False, False, 31.0, 40.5, 300, 10.0, "metal-1: the disk ... syncs too slowly", 7.9)
    assert disk_check_text("metal-1", refused).splitlines() == [
        "metal-1 holds no volume copies",
        "metal-1: the disk ... syncs too slowly",
    ]
    accepted = DiskCheck(True, True, 31.0, 40.5, 300, 10.0, "metal-1: the disk ... override recorded", 7.9)
    assert disk_check_text("metal-1", accepted).startswith("metal-1 may hold volume copies (ignore_slow_disk override)")


def test_workload_start_refuses_a_bad_name_and_stale_data_without_yes(
    project: Path, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before the cluster is asked (exit 3): a workload not named NAMESPACE/KIND/NAME, and
    consent to stale copies without --yes from a stdin that is not a terminal."""
    before = (project / "Pulumi.dev.yaml").read_bytes()
    code, out, _ = run(project, capsys, "--json", "workload", "start", "default/db")
    data = json.loads(out)
    assert code == EXIT_REFUSED and data["problems"][0]["key"] == "workload", data
    assert "is not NAMESPACE/KIND/NAME" in data["problems"][0]["message"]
    code, _, err = run(project, capsys, "workload", "start", "default/Deployment/db", "--accept-stale-data")
    assert code == EXIT_REFUSED and "pass --yes" in err, err
    args = build_parser().parse_args(["workload", "start", "ns/Job/j", "--accept-stale-data", "--yes"])
    assert (args.command, args.workload_command, args.workload, args.accept_stale_data) == (
        "workload",
        "start",
        "ns/Job/j",
        True,
    )
    assert (project / "Pulumi.dev.yaml").read_bytes() == before


def test_a_change_that_failed_part_way_names_up_as_the_way_on(
    project: Path, cli_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`node add` (or `node remove`) that fails part-way keeps its change in the stack file, so the
    same command again is refused ("already a node of this stack", "there is no worker named"):
    the way on is `up`, which continues towards the file. The run itself is replaced here by its
    failure (no Pulumi CLI in the unit tests); on the lab, the fault campaign's `documented_retry`
    invariant (bench/campaign.py) runs the same command again after such a failure."""
    from operator_api import ResourceFailedError  # noqa: PLC0415
    from operator_cli import cli  # noqa: PLC0415

    def failing(*_args: object, **_kwargs: object) -> int:
        raise ResourceFailedError("up failed")

    monkeypatch.setattr(cli, "run_command", failing)
    code, _, err = run(project, capsys, "--stack", "dev", "node", "add", "w9", "--address", "10.0.0.9")
    assert code == 1, err
    assert "run `scripts/hk3s --stack dev up --yes`" in err and "same command" not in err, err


def test_the_cli_starts_without_the_cloud_sdks_it_does_not_use() -> None:
    """Every `scripts/hk3s` line is a new Python process: it imports the operator API, not the
    program's components with the Hetzner and Kubernetes SDKs (a third of a second), and botocore
    (a quarter) only for an `s3://` backend. Read in a fresh interpreter, as the CLI starts."""
    script = (
        "import sys, operator_cli.cli, operator_api; "
        "print(sorted({name.split('.')[0] for name in sys.modules} "
        "& {'pulumi_hcloud', 'pulumi_kubernetes', 'botocore', 'boto3'}))"
    )
    completed = subprocess.run(
        [str(REPO / "venv" / "bin" / "python"), "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "[]", completed.stdout
