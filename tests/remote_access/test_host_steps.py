"""Several steps in one command, and commands stopped once they said enough, against a real
sshd on loopback (tests/loopback_sshd.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from remote_access.host_steps import HostStep, run_steps
from remote_access.ssh import CommandResult, RemoteCommandError, SshTarget, StopWhen, open_session
from tests.loopback_sshd import LoopbackSshd

# Prints the token, then how many processes on the host carry it on their command line.
LEAKS = (
    'echo "token=$JOIN_TOKEN"; n=0; for f in /proc/[0-9]*/cmdline; do c=$(tr "\\0" " " <"$f" 2>/dev/null); '
    'case "$c" in *"$JOIN_TOKEN"*) n=$((n + 1)) ;; esac; done; echo "leaks=$n"'
)


def _target(sshd: LoopbackSshd) -> SshTarget:
    return SshTarget(
        node="worker-1", address="127.0.0.1", port=sshd.port, private_key=sshd.client_private_key, connect_timeout=5
    )


def test_steps_run_in_order_as_one_command_each_with_its_own_output(sshd: LoopbackSshd, tmp_path: Path) -> None:
    script = tmp_path / "args.sh"
    script.write_text(
        "set -euo pipefail\n"
        'for arg in "$@"; do printf "arg=%s\\n" "$arg"; done\n'
        'echo "secret seen: ${JOIN_TOKEN:-no}"\n'
        "echo to-stderr >&2\n"
        "printf 'no newline at the end'\n"
    )
    tricky = ["a b", "$(touch /tmp/hk3s-step-injected)", "it's", ";rm -rf /"]
    secret = "K10abc::tok.en$secret"
    relayed: list[str] = []

    async def scenario() -> tuple[list[CommandResult], int]:
        async with open_session(_target(sshd)) as session:
            results = await run_steps(
                session,
                [
                    HostStep.script(script, tricky, on_line=relayed.append),
                    HostStep.command(["sh", "-c", 'echo "$1"; exit 3', "-", "first"], check=False),
                    HostStep.command(["cat"], stdin="line 1\n\nline 3\n"),
                    HostStep.command(
                        # The secret reaches its step, and no command line the host can see.
                        ["bash", "-c", LEAKS],
                        env={"JOIN_TOKEN": secret},
                    ),
                    HostStep.command(["sh", "-c", "echo; echo"]),
                ],
                deadline=20,
            )
            return results, session.commands

    results, commands = asyncio.run(scenario())
    assert commands == 1
    assert [r.exit_status for r in results] == [0, 3, 0, 0, 0]
    printed = [*(f"arg={arg}" for arg in tricky), "secret seen: no", "no newline at the end"]
    assert results[0].stdout.splitlines() == printed
    assert results[0].stderr.strip() == "to-stderr" and results[1].stderr == ""
    assert relayed == results[0].stdout.splitlines()
    assert results[1].stdout == "first\n"
    assert results[2].stdout == "line 1\n\nline 3\n"
    assert results[3].stdout.splitlines() == [f"token={secret}", "leaks=0"]
    assert results[4].stdout == "\n\n"
    assert not Path("/tmp/hk3s-step-injected").exists()


def test_a_failed_checked_step_ends_the_batch_with_its_own_error(sshd: LoopbackSshd, tmp_path: Path) -> None:
    never = tmp_path / "never-written"

    async def scenario() -> None:
        async with open_session(_target(sshd)) as session:
            await run_steps(
                session,
                [
                    HostStep.command(["true"]),
                    HostStep.command(["sh", "-c", "echo disk full >&2; exit 4"], what="writing the config"),
                    HostStep.command(["touch", str(never)]),
                ],
                deadline=20,
            )

    with pytest.raises(RemoteCommandError, match="worker-1: writing the config failed with exit status 4: disk full"):
        asyncio.run(scenario())
    assert not never.exists()


def test_a_watch_is_stopped_at_the_line_awaited_and_ended_on_the_host(sshd: LoopbackSshd) -> None:
    # Prints its pid and what is awaited, then would go on for half a minute.
    program = "echo $$; echo ready; sleep 30; echo more"

    async def scenario() -> CommandResult:
        async with open_session(_target(sshd)) as session:
            return await session.run(
                ["bash", "-c", program], deadline=60, until=StopWhen(lambda line: line == "ready", 20)
            )

    result = asyncio.run(scenario())
    pid, awaited = result.stdout.splitlines()
    assert result.exit_status == 0 and awaited == "ready"
    # The loopback host is this machine: the command is gone, not left waiting for its next write.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the command went on running on the host"


def test_a_watch_that_ends_by_itself_returns_its_output_and_status(sshd: LoopbackSshd) -> None:
    async def scenario() -> CommandResult:
        async with open_session(_target(sshd)) as session:
            return await session.run(
                ["sh", "-c", "echo one; echo two; exit 3"],
                deadline=20,
                check=False,
                until=StopWhen(lambda _l: False, 15),
            )

    result = asyncio.run(scenario())
    assert result.exit_status == 3 and result.stdout == "one\ntwo\n"


def test_a_watch_that_sees_nothing_is_stopped_after_its_time(sshd: LoopbackSshd) -> None:
    async def scenario() -> CommandResult:
        async with open_session(_target(sshd)) as session:
            return await session.run(["sleep", "30"], deadline=60, until=StopWhen(lambda _line: True, 0.5))

    started = time.monotonic()
    result = asyncio.run(scenario())
    assert time.monotonic() - started < 25  # stopped, not waited out (30 s)
    assert result.exit_status == 0 and result.stdout == ""
