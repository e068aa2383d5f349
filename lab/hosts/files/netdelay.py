"""Userspace packet delay for kernels without sch_netem.

Binds an nfnetlink queue (filled by an iptables NFQUEUE rule), holds each
packet for a fixed time, then accepts it.  Standard library only, so it can
run from any Python on the machine inside a network namespace.

Usage: netdelay.py QUEUE_NUM DELAY_MS [TAG]

TAG is not used; it names the daemon's owner in its command line (the lab
finds and stops its daemons by it).
"""

from __future__ import annotations

import collections
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")
NFGENMSG = struct.Struct("=BBH")  # family, version, res_id (big endian, packed by hand)


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (_align(length) - length)


def _message(msg_type: int, flags: int, seq: int, queue: int, attrs: bytes) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", queue) + attrs
    header = NLMSG_HDR.pack(NLMSG_HDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0)
    return header + body


def _iter_messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    offset = 0
    while offset + NLMSG_HDR.size <= len(data):
        length, msg_type, _flags, seq, _pid = NLMSG_HDR.unpack_from(data, offset)
        if length < NLMSG_HDR.size:
            break
        yield msg_type, seq, data[offset + NLMSG_HDR.size : offset + length]
        offset += _align(length)


def _iter_attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        yield kind & 0x3FFF, data[offset + 4 : offset + length]
        offset += _align(length)


class Queue:
    def __init__(self, queue_num: int) -> None:
        self.queue_num = queue_num
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 * 1024 * 1024)  # SO_RCVBUFFORCE
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024 * 1024)
        self.sock.bind((0, 0))
        self.seq = 0
        self._config(_attr(NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
        self._config(_attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536)))

    def _config(self, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, self.seq, self.queue_num, attrs))
        data = self.sock.recv(65536)
        for msg_type, _seq, payload in _iter_messages(data):
            if msg_type == NLMSG_ERROR:
                (errno_neg,) = struct.unpack_from("=i", payload, 0)
                if errno_neg != 0:
                    raise OSError(-errno_neg, f"nfqueue config failed: {os.strerror(-errno_neg)}")

    def receive_ids(self) -> list[int]:
        ids: list[int] = []
        try:
            data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return ids
        except OSError as err:  # ENOBUFS: the kernel dropped messages; keep going
            if err.errno == 105:
                return ids
            raise
        for msg_type, _seq, payload in _iter_messages(data):
            if msg_type != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                continue
            for kind, value in _iter_attrs(payload[NFGENMSG.size :]):
                if kind == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", value, 0)[0])
        return ids

    def accept(self, packet_id: int) -> None:
        attrs = _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
        self.sock.send(_message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, 0, self.queue_num, attrs))


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    queue_num = int(argv[1])
    delay = float(argv[2]) / 1000.0
    queue = Queue(queue_num)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pending: collections.deque[tuple[float, int]] = collections.deque()
    poller = select.poll()
    poller.register(queue.sock, select.POLLIN)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            queue.accept(pending.popleft()[1])
        timeout_ms = None if not pending else max(0.0, (pending[0][0] - now) * 1000.0)
        if poller.poll(timeout_ms):
            arrived = time.monotonic() + delay
            for packet_id in queue.receive_ids():
                pending.append((arrived, packet_id))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
