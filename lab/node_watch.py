"""A watcher of the cluster's Nodes during a run, for tests and benchmarks that need to
know when each node was Ready at which version, and when it was cordoned.

It reads the API server's own watch (`kubectl get nodes --watch --output-watch-events -o json`,
one process on the server for the whole run): every change of every Node arrives as it happens,
so a state that lasts less than a poll's interval (a cordon of a second) is seen too, and the
run costs one kubectl start instead of one per poll. When the API goes away (k3s restarting on
the server) the watch ends; it is started again, and the API's fresh list replaces what was known.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

from lab.hosts import Host, HostNotRunningError
from lab.hosts.host import NSENTER_ENV

K3S = "/usr/local/bin/k3s"
#: How long to wait before watching again when the API is away.
RETRY_SECONDS = 0.5
WATCH_ARGV = (K3S, "kubectl", "get", "nodes", "--watch", "--output-watch-events", "-o", "json")


def node_ready(node: dict[str, Any]) -> bool:
    """Whether the Node's Ready condition is True (a Node not yet reporting has none)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def watch_events(text: str) -> tuple[list[dict[str, Any]], str]:
    """The complete JSON documents at the start of `text` (kubectl writes one per event, pretty
    printed, one after the other) and the rest, an event not yet whole."""
    decoder = json.JSONDecoder()
    events: list[dict[str, Any]] = []
    while (rest := text.lstrip()) != "":
        try:
            event, end = decoder.raw_decode(rest)
        except json.JSONDecodeError:
            return events, rest
        events.append(event)
        text = rest[end:]
    return events, ""


class NodeWatcher:
    """Every Node while a run goes on: after each change, a sight of every Node then known
    (seconds since start, name, kubelet version, Ready, cordoned) in `sights`, and the Node
    objects themselves in `objects` (seconds, Node)."""

    def __init__(self, server: Host) -> None:
        self.server = server
        self.sights: list[tuple[float, str, str, bool, bool]] = []
        self.objects: list[tuple[float, dict[str, Any]]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _record(self, known: dict[str, dict[str, Any]], node: dict[str, Any]) -> None:
        at = time.monotonic() - self.started
        self.objects.append((at, node))
        for name, each in known.items():
            self.sights.append(
                (
                    at,
                    name,
                    ((each.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
                    node_ready(each),
                    bool((each.get("spec") or {}).get("unschedulable")),
                )
            )

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                argv = self.server.nsenter_argv(list(WATCH_ARGV))
            except HostNotRunningError:  # the server is powered off: try again
                time.sleep(RETRY_SECONDS)
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                # Its own session: stopping it ends nsenter and the kubectl it forked inside the host.
                self._process = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=dict(NSENTER_ENV),
                    start_new_session=True,
                )
            known: dict[str, dict[str, Any]] = {}
            pending = ""
            stdout = self._process.stdout
            assert stdout is not None
            while chunk := os.read(stdout.fileno(), 1 << 16):
                events, pending = watch_events(pending + chunk.decode(errors="replace"))
                for event in events:
                    node = event.get("object") or {}
                    name = (node.get("metadata") or {}).get("name")
                    if not name:
                        continue
                    if event.get("type") == "DELETED":
                        known.pop(name, None)
                    else:
                        known[name] = node
                    self._record(known, node)
            self._process.wait()
            stdout.close()
            if not self._stop.is_set():
                time.sleep(RETRY_SECONDS)

    def __enter__(self) -> NodeWatcher:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._stop.set()
            process = self._process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        self._thread.join(timeout=30)

    def first_at(self, name: str, version: str) -> float | None:
        """When `name` was first seen Ready at `version`."""
        return next((t for t, n, v, r, _ in self.sights if n == name and v == version and r), None)

    def cordoned(self, name: str) -> list[float]:
        return [t for t, n, _, _, c in self.sights if n == name and c]

    def not_ready(self, name: str) -> list[float]:
        return [t for t, n, _, r, _ in self.sights if n == name and not r]

    def seen(self, name: str) -> list[dict[str, Any]]:
        """Every version of `name`'s Node the watch delivered, in order."""
        return [node for _, node in self.objects if (node.get("metadata") or {}).get("name") == name]
