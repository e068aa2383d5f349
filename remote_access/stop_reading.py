"""Reading a command's output until the caller has what it waits for.

A watch (`kubectl get --watch`) does not end by itself: the caller reads until the line it
waits for, or for a while, then stops it. What it printed so far is the result.

Stopping it must end it on the host at once. Closing the channel alone would leave it running
until its next write (SIGPIPE), and sshd keeps a session whose command still runs, which counts
against the connection's MaxSessions (10 by default) that the logins shared by a provider
process's joins draw on. sshd takes no signal for a root login's session either ("session
signalling requires privilege separation"). So the command runs under a small bash wrapper that
ends it when its stdin ends: this side keeps stdin open while it reads, and closes it to stop.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncssh  # loaded on first use, as in remote_access.ssh


LineCallback = Callable[[str], None]

# Runs "$@" with stdin from /dev/null; ends it (SIGTERM) when this shell's own stdin ends, which
# is how the program stops it; exits with its status when it ends first.
_STOPPABLE = """\
"$@" </dev/null &
command=$!
exec 3<&0
{ while read -r -u 3 _; do :; done; kill "$command"; } </dev/null >/dev/null 2>&1 &
stopper=$!
wait "$command"
status=$?
kill "$stopper" 2>/dev/null
exit "$status"
"""


def stoppable(argv: Sequence[str]) -> str:
    """The command line running `argv` so that closing its stdin ends it on the host."""
    return shlex.join(["bash", "-c", _STOPPABLE, "-", *argv])


@dataclass(frozen=True)
class StopWhen:
    """For a command that does not end by itself (a watch): stop reading it after the first
    line `line` accepts, or after `seconds`; it is then ended on the host, and what it printed
    so far is its result, with exit status 0."""

    line: Callable[[str], bool]
    seconds: float


async def read_stdout(
    process: asyncssh.SSHClientProcess[str], lines: list[str], on_line: LineCallback | None, until: StopWhen | None
) -> bool:
    """Read the command's stdout into `lines` to its end; True when `until` stopped it first."""
    try:
        async with asyncio.timeout(until.seconds if until is not None else None):
            async for line in process.stdout:
                if not line:  # end of stream, not an empty line (that would be "\n")
                    continue
                text = line.rstrip("\n")
                lines.append(text)
                if on_line is not None:
                    on_line(text)
                if until is not None and until.line(text):
                    return True
    except TimeoutError:
        return True
    return False
