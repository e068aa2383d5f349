"""The lab's errors."""

from __future__ import annotations


class LabError(RuntimeError):
    """A lab operation failed; the message says what and, where known, why."""


class HostNotRunningError(LabError):
    """The host's container is not running (powered off or failed to boot)."""
