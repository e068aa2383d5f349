"""Runs ON THE HOST as root (python3 reads it on stdin): dial a TCP port and say who answered.

    python3 - ADDRESS PORT SECONDS

A TCP connection to ADDRESS:PORT, given up after SECONDS, while a raw ICMP socket watches for
the ICMP errors about that very connection (matched by the packet they quote: TCP, to ADDRESS
and PORT, from the dial's own port). A connection's error says only "no route to host"; the
error's sender says whether the machine at ADDRESS answered (its own address) or a router on
the way did for it (Linux's arp_error_report -> dst_link_failure sends "host unreachable" from
the router whose ARP for the address got no answer).

Prints one JSON object: {"outcome": "connected" | "no answer" | the errno's name (ECONNREFUSED,
EHOSTUNREACH, ...), "icmp": [{"from": address, "type": n, "code": n}, ...]}.
Exit 2 with a message on stderr when the raw socket cannot be opened (not root, no CAP_NET_RAW).

Written for every Python 3 a supported host has (3.6 on RHEL 8's platform-python).
"""

import errno
import json
import select
import socket
import struct
import sys
import time

# ICMP types that quote the packet they are about (RFC 792): destination unreachable, time
# exceeded, parameter problem.
QUOTING_TYPES = (3, 11, 12)
# After the connection's outcome, the ICMP that caused it is already queued (raw sockets get a
# packet before the protocol's error handler runs); a moment more catches a late duplicate.
DRAIN_SECONDS = 0.3


def about_the_dial(packet: bytes, address: str, port: int, local_port: int) -> "tuple[str, int, int] | None":
    """(sender, type, code) when `packet` (an IPv4 packet with its header) is an ICMP error
    quoting our dial; else None."""
    if len(packet) < 20:
        return None
    header = (packet[0] & 0x0F) * 4
    icmp = packet[header:]
    if len(icmp) < 8 + 20 or icmp[0] not in QUOTING_TYPES:
        return None
    quoted = icmp[8:]
    quoted_header = (quoted[0] & 0x0F) * 4
    if len(quoted) < quoted_header + 4 or quoted[9] != socket.IPPROTO_TCP:
        return None
    source_port, destination_port = struct.unpack("!HH", quoted[quoted_header : quoted_header + 4])
    if socket.inet_ntoa(quoted[16:20]) != address or destination_port != port or source_port != local_port:
        return None
    return socket.inet_ntoa(packet[12:16]), icmp[0], icmp[1]


def main() -> int:
    address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    try:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    except OSError as error:
        sys.stderr.write(f"cannot open a raw ICMP socket: {error}\n")
        return 2
    raw.setblocking(False)
    dial = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    dial.setblocking(False)
    started = dial.connect_ex((address, port))
    local_port = dial.getsockname()[1]
    outcome = None
    if started not in (0, errno.EINPROGRESS):
        outcome = errno.errorcode.get(started, str(started))
    answers = []  # type: list
    deadline = time.monotonic() + seconds
    drain_until = None
    while True:
        now = time.monotonic()
        if outcome is not None and drain_until is None:
            drain_until = now + DRAIN_SECONDS
        end = drain_until if drain_until is not None else deadline
        if now >= end:
            break
        writable = [dial] if outcome is None else []
        ready, done, _ = select.select([raw], writable, [], end - now)
        if raw in ready:
            while True:
                try:
                    packet = raw.recv(65535)
                except (BlockingIOError, InterruptedError):
                    break
                seen = about_the_dial(packet, address, port, local_port)
                if seen is not None:
                    answers.append({"from": seen[0], "type": seen[1], "code": seen[2]})
        if dial in done:
            failed = dial.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            outcome = "connected" if failed == 0 else errno.errorcode.get(failed, str(failed))
    dial.close()
    print(json.dumps({"outcome": outcome or "no answer", "icmp": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
