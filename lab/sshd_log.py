"""What a lab host's sshd log says about connection set-up under load.

Read from `Host.sshd_log()` lines (journalctl short-unix). With `LogLevel
VERBOSE`, OpenSSH logs "Connection from A port P on B port 22" when it accepts
a connection, "Accepted publickey for U from A port P" when it authenticates,
"Connection closed by A port P [preauth]" (or reset, disconnected) when one ends before that, and "drop connection #N
from [A]:P ... past MaxStartups" when it sheds one (at INFO level).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_TIME = re.compile(r"^(\d+\.\d+) ")
_PEER = re.compile(r"(\d+\.\d+\.\d+\.\d+) port (\d+)")
# "Accepted publickey for root from A port P": authenticated ("Accepted key ... found at" is not).
_AUTHENTICATED = re.compile(r"\bAccepted \S+ for \S+ from ")
# A connection that ended before authenticating. Other "[preauth]" lines ("Postponed
# publickey ...") are steps of a set-up still under way.
_ENDED = (
    "Connection closed by ",
    "Connection reset by ",
    "Disconnected from ",
    "Received disconnect from ",
    "Timeout before authentication",
)


@dataclass(frozen=True)
class HandshakeLoad:
    """Connection set-ups one sshd saw."""

    accepted: int  # connections taken into set-up
    authenticated: int
    dropped: int  # shed past MaxStartups
    most_in_flight: int  # the most set-ups (accepted, not yet authenticated or ended) at one time


def handshake_load(lines: Iterable[str]) -> HandshakeLoad:
    """Count set-ups, drops and the most in flight at once from sshd's log lines."""
    events: list[tuple[float, int]] = []
    open_since: dict[tuple[str, str], float] = {}
    accepted = authenticated = dropped = 0
    for line in lines:
        when = _TIME.match(line)
        if when is None:
            continue
        at = float(when.group(1))
        if "past MaxStartups" in line:
            dropped += 1
            continue
        peer = _PEER.search(line)
        if peer is None:
            continue
        key = (peer.group(1), peer.group(2))
        if "Connection from " in line:
            accepted += 1
            open_since[key] = at
            events.append((at, 1))
        elif key in open_since and (_AUTHENTICATED.search(line) or any(end in line for end in _ENDED)):
            del open_since[key]
            authenticated += _AUTHENTICATED.search(line) is not None
            events.append((at, -1))
    in_flight = most = 0
    # At equal times, an end before a start: the log's order within a microsecond is not telling.
    for _, change in sorted(events, key=lambda event: (event[0], event[1])):
        in_flight += change
        most = max(most, in_flight)
    return HandshakeLoad(accepted, authenticated, dropped, most)
