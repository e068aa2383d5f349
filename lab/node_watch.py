"""A watcher of the cluster's Nodes during a run, for tests and benchmarks that need to
know when each node was Ready at which version, and when it was cordoned."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from lab.hosts import LabError

POLL_SECONDS = 0.3


def node_ready(node: dict[str, Any]) -> bool:
    """Whether the Node's Ready condition is True (a Node not yet reporting has none)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class NodeWatcher:
    """Polls every Node while a run goes on: (seconds since start, name, kubelet version,
    Ready, cordoned) per sight. `list_nodes` returns the API's `get nodes` items."""

    def __init__(self, list_nodes: Callable[[], list[dict[str, Any]]]) -> None:
        self.list_nodes = list_nodes
        self.sights: list[tuple[float, str, str, bool, bool]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                nodes = self.list_nodes()
            except LabError:  # the API is away while k3s restarts on the server
                time.sleep(POLL_SECONDS)
                continue
            for node in nodes:
                self.sights.append(
                    (
                        time.monotonic() - self.started,
                        node["metadata"]["name"],
                        ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""),
                        node_ready(node),
                        bool((node.get("spec") or {}).get("unschedulable")),
                    )
                )
            time.sleep(POLL_SECONDS)

    def __enter__(self) -> NodeWatcher:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def first_at(self, name: str, version: str) -> float | None:
        """When `name` was first seen Ready at `version`."""
        return next((t for t, n, v, r, _ in self.sights if n == name and v == version and r), None)

    def cordoned(self, name: str) -> list[float]:
        return [t for t, n, _, _, c in self.sights if n == name and c]

    def not_ready(self, name: str) -> list[float]:
        return [t for t, n, _, r, _ in self.sights if n == name and not r]
