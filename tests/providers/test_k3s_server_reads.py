"""When the server provider's diff reads the running server (its kubeconfig and how long its own
certificates have left), and when it must not. The diff runs the real provider; the "server" is a
real TCP listener on this machine that counts the connections made to it (no SSH server is needed
to tell whether a login was tried: every login starts with a connection).

- A run with nothing to do logs in nowhere: outside k3s's renewal window the recorded state says
  all there is (k3s signs nothing new at a start then). (That the server is read when the run
  uses the kubeconfig or the certificates are in the window: tests/lab/test_longhorn_settings.py.)
- A preview never logs in with an input it does not know yet (pulumi's Unknown: a host key or
  login key this run changes); it decides from the recorded certificates' end alone."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import asyncssh
import pytest
from pulumi.output import Unknown

from node_operations.health import SERVER_CERT_RENEW_DAYS
from providers.k3s_server import K3sServerProvider


class CountingListener:
    """A TCP listener that accepts and closes every connection, counting them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.count += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    found = CountingListener()
    yield found
    found.close()


DAY = 86400
KEY = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()


def _olds(port: int, days_left: float) -> dict[str, Any]:
    return {
        "node": "srv",
        "address": "127.0.0.1",
        "ssh_port": port,
        "ssh_user": "root",
        "private_key": KEY,
        "k3s_version": "v1.35.2+k3s1",
        "kubeconfig": "apiVersion: v1",
        "api_endpoint": "https://127.0.0.1:6443",
        "certificates_end": int(time.time() + days_left * DAY),
    }


def test_a_run_with_nothing_to_do_logs_in_nowhere(listener: CountingListener) -> None:
    olds = _olds(listener.port, SERVER_CERT_RENEW_DAYS + 30)
    result = K3sServerProvider().diff("srv-k3s", olds, {**olds, "kubeconfig_used": False})
    assert not result.changes
    time.sleep(0.3)
    assert listener.count == 0


def test_a_preview_with_an_unknown_host_key_decides_without_logging_in(listener: CountingListener) -> None:
    """The preview of a login-key rotation: the server's probe is updated, so the host key the
    login pins is unknown. Without it no login is tried (before: AttributeError: 'Unknown' object
    has no attribute 'strip')."""
    olds = _olds(listener.port, 10)
    news = {**olds, "recorded_host_key": Unknown(), "kubeconfig_used": True}
    assert not K3sServerProvider().diff("srv-k3s", olds, news).changes
    # In the window with restarts allowed, the update rotates: planned without logging in.
    assert K3sServerProvider().diff("srv-k3s", olds, {**news, "approve_restart": True}).changes
    far = _olds(listener.port, SERVER_CERT_RENEW_DAYS + 30)
    assert (
        not K3sServerProvider()
        .diff("srv-k3s", far, {**far, "recorded_host_key": Unknown(), "kubeconfig_used": True})
        .changes
    )
    time.sleep(0.3)
    assert listener.count == 0
