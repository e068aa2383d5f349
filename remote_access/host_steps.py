"""Several steps on one host in one command: one round trip where each step would cost one.

At 50 ms between the program and a host, every command costs at least a round trip, and a
join's steps on one host follow each other with nothing to decide in between (the reads of
its preflight, the journal entry and the preparation, the files and the install). So they go
as one `bash -s` program whose steps run one after the other, each exactly as it would run
alone: its own `bash -c` with its arguments quoted (a host script's text, or one command
line), its own stdin (none, or the text given), its stderr kept apart, its exit status
reported. A checked step that fails ends the batch there (the steps after it do not run)
and raises the same RemoteCommandError it would raise alone; an unchecked one's result is
returned like the others'.

Values that must not show in the host's process list (a join token) go in as environment
variables of the one step that needs them, written into the program on stdin, never on a
command line.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from remote_access.ssh import CommandResult, LineCallback, RemoteCommandError, SshError, SshSession


@dataclass(frozen=True)
class HostStep:
    """One step of a batch: a bash program (a host script's text, or one quoted command line)."""

    what: str  # as errors name it: "script node_prepare.sh", or the command line
    body: str
    args: tuple[str, ...] = ()
    check: bool = True
    on_line: LineCallback | None = None
    stdin: str | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def script(
        cls, path: Path, args: Sequence[str] = (), *, check: bool = True, on_line: LineCallback | None = None
    ) -> HostStep:
        """A host script run with its arguments, as SshSession.run_script runs it."""
        return cls(f"script {path.name}", path.read_text(), tuple(args), check, on_line)

    @classmethod
    def command(
        cls,
        argv: Sequence[str],
        *,
        check: bool = True,
        what: str | None = None,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> HostStep:
        """One command, each argument quoted, as SshSession.run runs it."""
        line = shlex.join(argv)
        return cls(what or line, line, (), check, None, stdin, dict(env or {}))


# Runs one step: its program in a fresh bash with its arguments, stdin from the caller, its
# stderr into a file printed after a marker on stderr, its status on a marker line on stdout.
# The newline before each marker puts the marker at the start of a line whatever the step
# printed last; the parser takes it off again.
_RUNNER = """\
__hk3s_err=$(mktemp) || exit 1
trap 'rm -f "$__hk3s_err"' EXIT
__hk3s_step() {
  local index=$1 check=$2 body=$3 status
  shift 3
  bash -c "$body" bash "$@" 2>"$__hk3s_err"
  status=$?
  printf '\\n%s %s %s\\n' "$__hk3s_mark" "$index" "$status"
  { printf '\\n%s %s\\n' "$__hk3s_mark" "$index"; cat "$__hk3s_err"; } >&2
  if [ "$status" -ne 0 ] && [ "$check" = check ]; then exit 0; fi
}
"""


def _valid_env_name(name: str) -> bool:
    return name.isidentifier() and name.isascii()


def batch_program(steps: Sequence[HostStep], mark: str) -> str:
    """The bash program that runs `steps` in order (see the module docstring)."""
    lines = [f"__hk3s_mark={shlex.quote(mark)}", _RUNNER]
    for index, step in enumerate(steps):
        delimiter = f"HK3S_STEP_{mark}_{index}"
        if any(line == delimiter for line in (step.body + "\n" + (step.stdin or "")).splitlines()):
            raise ValueError(f"step {step.what} holds its own delimiter")
        bad = [name for name in step.env if not _valid_env_name(name)]
        if bad:
            raise ValueError(f"invalid environment variable name(s) {bad} in step {step.what}")
        lines.append(f"IFS= read -r -d '' __hk3s_body <<'{delimiter}'")
        lines.append(step.body.rstrip("\n"))
        lines.append(delimiter)
        assignments = "".join(f"{name}={shlex.quote(value)} " for name, value in step.env.items())
        call = f'{assignments}__hk3s_step {index} {"check" if step.check else "any"} "$__hk3s_body"'
        call += "".join(f" {shlex.quote(arg)}" for arg in step.args)
        if step.stdin is None:
            lines.append(f"{call} </dev/null")
        else:
            lines.append(f"{call} <<'{delimiter}'")
            lines.append(step.stdin.rstrip("\n"))
            lines.append(delimiter)
    return "\n".join(lines) + "\n"


class _StepLines:
    """Hands each stdout line to the step it belongs to, and notes each step's status."""

    def __init__(self, steps: Sequence[HostStep], mark: str) -> None:
        self.steps = steps
        self.marker = re.compile(rf"^{re.escape(mark)} (\d+) (-?\d+)$")
        self.index = 0
        self.lines: list[list[str]] = [[] for _ in steps]
        self.statuses: list[int] = []
        self._held: str | None = None  # an empty line that may be the one before a marker

    def __call__(self, line: str) -> None:
        found = self.marker.match(line)
        if found is not None:
            self._held = None
            self.statuses.append(int(found.group(2)))
            self.index += 1
            return
        if self.index >= len(self.steps):
            return
        if self._held is not None:
            self._deliver(self._held)
            self._held = None
        if line == "":
            self._held = line
        else:
            self._deliver(line)

    def _deliver(self, line: str) -> None:
        self.lines[self.index].append(line)
        callback = self.steps[self.index].on_line
        if callback is not None:
            callback(line)


def _stderr_by_step(stderr: str, mark: str, count: int) -> list[str]:
    parts = re.split(rf"\n{re.escape(mark)} (\d+)\n", "\n" + stderr)
    found: dict[int, str] = {}
    for position in range(1, len(parts) - 1, 2):
        found[int(parts[position])] = parts[position + 1]
    return [found.get(index, "") for index in range(count)]


def _tail(stderr: str, lines: int = 5) -> str:
    return " | ".join(stderr.strip().splitlines()[-lines:])


async def run_steps(session: SshSession, steps: Sequence[HostStep], *, deadline: float) -> list[CommandResult]:
    """Run `steps` on the session's host in one command; the result of each step that ran.

    A checked step that fails raises its RemoteCommandError (the steps after it did not run)."""
    mark = f"@@hk3s-step-{secrets.token_hex(8)}"
    router = _StepLines(steps, mark)
    what = ", then ".join(step.what for step in steps)
    batch = await session.run(
        ["bash", "-s", "--"],
        stdin=batch_program(steps, mark),
        deadline=deadline,
        on_line=router,
        check=False,
        what=what,
    )
    stderr = _stderr_by_step(batch.stderr, mark, len(router.statuses))
    results = [
        CommandResult(status, "".join(f"{line}\n" for line in router.lines[index]), stderr[index])
        for index, status in enumerate(router.statuses)
    ]
    for step, result in zip(steps, results, strict=False):
        if step.check and result.exit_status != 0:
            raise RemoteCommandError(session.target.node, step.what, result.exit_status, _tail(result.stderr))
    if batch.exit_status != 0 or (len(results) < len(steps) and all(r.exit_status == 0 for r in results)):
        raise SshError(
            session.target.node,
            f"{what} stopped after {len(results)} of {len(steps)} step(s) with exit status {batch.exit_status}"
            + (f": {_tail(batch.stderr)}" if batch.stderr.strip() else ""),
        )
    return results
