"""What a lab host's sshd log says about connection set-up under load, and how
many SSH connections a run opened to the host.

Read from `Host.sshd_log()` lines (journalctl short-unix). With `LogLevel
VERBOSE`, OpenSSH logs "Connection from A port P on B port 22" when it accepts
a connection, "Accepted publickey for U from A port P" when it authenticates,
"Connection closed by A port P [preauth]" (or reset, disconnected) when one ends before that, and "drop connection #N
from [A]:P ... past MaxStartups" when it sheds one (at INFO level).
"""

from __future__ import annotations

import dataclasses
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


@dataclass(frozen=True)
class SshConnection:
    """One TCP connection to sshd, as its log tells it."""

    client: str  # "address:port" of the client end
    opened: float  # UNIX time sshd took it (or shed it, or, without a "Connection from" line, authenticated it)
    authenticated: bool
    dropped: bool  # shed past MaxStartups before any set-up


@dataclass(frozen=True)
class ConnectionCount:
    """The connections one host's sshd saw in a time window."""

    opened: int  # every connection: authenticated, ended before authenticating, or dropped
    authenticated: int
    dropped: int
    clients: tuple[str, ...]  # "address:port" of each, in the order they were opened


_DROPPED_PEER = re.compile(r"from \[(\d+\.\d+\.\d+\.\d+)\]:(\d+)")


def ssh_connections(
    lines: Iterable[str], since: float | None = None, until: float | None = None
) -> list[SshConnection]:
    """Every connection sshd's log shows opened in [`since`, `until`), oldest first.

    A connection is known by its client's address and port while it is open: its
    "Connection from" line (LogLevel VERBOSE) opens it, an "Accepted ... for U from" line
    authenticates it (and opens it, when sshd logs at INFO and wrote no "Connection from"),
    and a close or disconnect line ends it, so a client port used again later is a new
    connection. A "past MaxStartups" line is one shed before any set-up. A connection that
    ends before authenticating counts, unauthenticated: it still cost the host a handshake.
    """
    found: list[SshConnection] = []
    open_at: dict[tuple[str, str], int] = {}  # client -> its open connection's index in `found`
    for line in lines:
        when = _TIME.match(line)
        if when is None:
            continue
        at = float(when.group(1))
        if "past MaxStartups" in line:
            shed = _DROPPED_PEER.search(line)
            if shed is not None:
                found.append(SshConnection(f"{shed.group(1)}:{shed.group(2)}", at, authenticated=False, dropped=True))
            continue
        peer = _PEER.search(line)
        if peer is None:
            continue
        key = (peer.group(1), peer.group(2))
        client = f"{key[0]}:{key[1]}"
        if "Connection from " in line:
            open_at[key] = len(found)
            found.append(SshConnection(client, at, authenticated=False, dropped=False))
        elif _AUTHENTICATED.search(line):
            index = open_at.get(key)
            if index is None:
                open_at[key] = len(found)
                found.append(SshConnection(client, at, authenticated=True, dropped=False))
            else:
                found[index] = dataclasses.replace(found[index], authenticated=True)
        elif any(end in line for end in _ENDED):
            open_at.pop(key, None)
    return [
        connection
        for connection in found
        if (since is None or connection.opened >= since) and (until is None or connection.opened < until)
    ]


def connection_count(lines: Iterable[str], since: float | None = None, until: float | None = None) -> ConnectionCount:
    """How many connections the host's sshd saw opened in [`since`, `until`) (see `ssh_connections`)."""
    found = ssh_connections(lines, since, until)
    return ConnectionCount(
        opened=len(found),
        authenticated=sum(connection.authenticated for connection in found),
        dropped=sum(connection.dropped for connection in found),
        clients=tuple(connection.client for connection in found),
    )
