"""What a run of the operator API returns: a preview's plan, a finished run, and what was
cleaned up after an interrupted one before it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import LockHolder
from .events import PlannedChange, RunRecord

# Resource types whose update or replacement restarts the Kubernetes API.
API_RESTART_TYPES = ("K3sServer",)
FIRST_USE_PREFIX = "recorded SSH host key on first use: "
_LOCK_LINE = re.compile(r"created by (?P<user>[^@\s]+)@(?P<host>\S+) \(pid (?P<pid>\d+)\) at (?P<since>\S+)")


@dataclass(frozen=True)
class Preview:
    """The planned change of every resource, and the engine's summary."""

    steps: list[PlannedChange]
    summary: dict[str, int]

    @property
    def changes(self) -> list[PlannedChange]:
        """The steps that change something (not `same`)."""
        return [step for step in self.steps if step.changes]

    @property
    def restarts_api(self) -> bool:
        """The server's k3s is updated or replaced: the Kubernetes API goes down for a while."""
        return any(step.type.endswith(API_RESTART_TYPES) and step.op != "create" for step in self.changes)

    @property
    def deletes(self) -> list[PlannedChange]:
        return [step for step in self.changes if step.op in ("delete", "replace")]


@dataclass(frozen=True)
class Recovery:
    """What was cleaned up after an interrupted run before this one started."""

    stale_locks: list[LockHolder] = field(default_factory=list)
    cleared_pending: list[str] = field(default_factory=list)

    @property
    def needed(self) -> bool:
        return bool(self.stale_locks or self.cleared_pending)


@dataclass(frozen=True)
class RunResult:
    """A finished `up`, `refresh` or `destroy`."""

    command: str
    summary: dict[str, int]
    changes: list[PlannedChange]
    recovery: Recovery
    # Hosts whose SSH key this run accepted on first use (hk3s:ssh.trust_on_first_use): node -> key.
    # Compare each with the host's key read over a channel you trust, then pin it (hk3s:ssh.host_keys).
    host_keys_recorded: dict[str, str] = field(default_factory=dict)


def keys_recorded_on_first_use(record: RunRecord) -> dict[str, str]:
    """node -> host key, from the probes' "recorded SSH host key on first use" lines."""
    found: dict[str, str] = {}
    for node, message in record.progress:
        if message.startswith(FIRST_USE_PREFIX):
            found[node] = message.removeprefix(FIRST_USE_PREFIX).split(" (pin it", 1)[0].strip()
    return found


def holders_from_message(text: str) -> list[LockHolder]:
    """The lock holders a Pulumi "concurrent update" error names."""
    return [
        LockHolder(user=m["user"], hostname=m["host"], pid=int(m["pid"]), since=m["since"])
        for m in _LOCK_LINE.finditer(text)
    ]
