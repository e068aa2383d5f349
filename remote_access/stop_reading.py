"""Reading a command's output until the caller has what it waits for.

A watch (`kubectl get --watch`) does not end by itself: the caller reads until the line it
waits for, or for a while, then closes the channel. What it printed so far is the result.
The command itself ends at its next write (SIGPIPE), so a watch must also bound itself
(kubectl's --request-timeout): sshd takes no signal for a root login's session, whose
privileges it does not separate ("session signalling requires privilege separation").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import asyncssh

LineCallback = Callable[[str], None]


@dataclass(frozen=True)
class StopWhen:
    """For a command that does not end by itself (a watch): stop reading it after the first
    line `line` accepts, or after `seconds`; the channel is then closed, and what the command
    printed so far is its result, with exit status 0."""

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
