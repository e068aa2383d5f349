"""Free local ports for the stand-in's k3s server started directly on this machine (its
supervisor listens on a port and the API server behind it on the next)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_pair() -> int:
    """A port p such that p and p+1 are free (the supervisor and the API server behind it)."""
    for _ in range(50):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair")
