"""Typed errors of the operator API. Every one says what happened and what to do next.

The split a caller acts on:

* `SettingsRejectedError`, `RefusedError`: the program refused before changing anything
  (bad input, a capability this release does not have, a failed preflight).
  Fix the input or wait for the capability; nothing needs repairing.
* `ResourceFailedError`: something broke part-way; the stack config keeps the desired
  state so `up()` continues once the cause is fixed.
* `StackBusyError`: another run holds the stack's lock; try again when it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster_settings import SettingProblem
from node_operations.doc_links import REFUSAL_PAGES, settings_links, with_docs_link
from node_operations.refusal import refusal_code


class StackError(Exception):
    """Base of every error the operator API raises. Its message ends with the docs page that
    explains it (`docs`, or a subclass's `docs_link()`), chosen here rather than in each message."""

    docs = "docs/python-api.md#the-python-api"

    def docs_link(self) -> str:
        """The page that explains this error."""
        return self.docs

    def message(self) -> str:
        """The message without its docs link."""
        return super().__str__()

    def __str__(self) -> str:
        return with_docs_link(self.message(), self.docs_link())


class SettingsRejectedError(StackError):
    """The requested config is invalid; the stack file was left byte-identical.

    `problems` lists each setting (`key`, e.g. ``hk3s:workers[3].address``) and its fix.
    """

    docs = "docs/configuration.md#configuration-reference"

    def __init__(self, problems: Sequence[SettingProblem], *, action: str = "the change") -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(f"{action} was refused; the stack config is unchanged:\n{lines}")

    def docs_link(self) -> str:
        return settings_links(problem.key for problem in self.problems) or self.docs

    @property
    def keys(self) -> list[str]:
        """The config keys named by the problems."""
        return [problem.key for problem in self.problems]


class TeardownNotConfirmedError(StackError):
    """A destroy whose confirmation does not name the stack; nothing was run."""

    docs = "docs/teardown.md#tearing-down"


class MaintenanceError(StackError):
    """A reboot was refused, or stopped part-way. The message says where the worker was left
    (put back as it was, or still cordoned and recorded as rebooting, which the next call
    resumes) and what to do next."""

    docs = "docs/reboots-removal-upgrades.md#rebooting-a-worker"

    def __init__(self, node: str, message: str, *, put_back: bool) -> None:
        self.node = node
        self.put_back = put_back  # True: nothing is left changed
        super().__init__(message)


class WorkloadStartRefusedError(StackError):
    """`start_workload` refused, changing nothing: the workload was not stopped by a fence, or no
    copy elsewhere may serve it (the message names the volumes and the fix)."""

    docs = "docs/fencing.md#fencing-a-worker-that-is-down"


class UnknownWorkerError(SettingsRejectedError):
    """The named worker is not in `hk3s:workers`."""


class DuplicateWorkerError(SettingsRejectedError):
    """A worker (or the server) of that name already exists."""


def shown(text: str) -> str:
    """`text` as it may reach a terminal: every character that is not printable (an escape
    sequence's ESC or CSI, a carriage return, a bidirectional override) written as its Python
    escape. What a lock object says comes from whoever may write the bucket, and a terminal obeys
    the control sequences it is sent (clear the screen, rewrite a line, retitle the window)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a stack's lock, as the backend recorded it (the fields as written; `str` shows
    them with their control characters escaped)."""

    user: str
    hostname: str
    pid: int | None
    since: str
    path: str = ""

    def __str__(self) -> str:
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        since = f" since {shown(self.since)}" if self.since else ""
        return f"{shown(self.user)}@{shown(self.hostname)}{pid}{since}"


class StackBusyError(StackError):
    """Another run holds the stack's lock. Nothing was changed; try again when it ends."""

    docs = "docs/python-api.md#the-python-api"

    def __init__(self, stack: str, holders: Sequence[LockHolder], detail: str = "") -> None:
        self.stack = stack
        self.holders = list(holders)
        who = ", ".join(str(holder) for holder in self.holders) or "another run"
        message = f"stack {stack} is busy: locked by {who}. Wait for that run to end and try again"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


@dataclass(frozen=True)
class ResourceProblem:
    """An error the engine reported for one resource: its URN, type, name and the provider's message."""

    urn: str
    type: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.name} ({self.type}): {self.message}"


class RunFailedError(StackError):
    """A Pulumi run ended in error. `problems` holds what each failing resource reported;
    `output` is the tail of the engine's output."""

    docs = "docs/recovery.md#when-a-run-is-interrupted"

    def __init__(
        self,
        summary: str,
        problems: Sequence[ResourceProblem] = (),
        *,
        output: str = "",
        config_restored: bool = False,
    ) -> None:
        self.problems = list(problems)
        self.output = output
        self.config_restored = config_restored
        # After a refused change: whether the follow-up `up` returned the stack to the restored file.
        self.stack_restored = False
        self.restore_error: StackError | None = None
        lines = "\n".join(f"  - {problem}" for problem in self.problems)
        super().__init__(summary + (f":\n{lines}" if lines else ""))

    def message(self) -> str:
        text = super().message()
        if self.config_restored and self.restore_error is not None:
            return (
                f"{text}\nThe stack file was put back, but returning the stack to it failed: "
                f"{self.restore_error}\nRun up once that is fixed."
            )
        if self.config_restored:
            restored = " and the stack returned to it" if self.stack_restored else ""
            return f"{text}\nThe stack file was put back as it was{restored}."
        return text

    @property
    def resource(self) -> ResourceProblem | None:
        """The first failing resource, if the engine named one."""
        return self.problems[0] if self.problems else None


class RefusedError(RunFailedError):
    """The program refused a step before changing anything on the host: a capability
    this release does not have, a failed preflight, or config only a machine can check."""

    docs = "docs/python-api.md#the-python-api"

    def __init__(
        self,
        summary: str,
        problems: Sequence[ResourceProblem] = (),
        *,
        reason: str,
        output: str = "",
        config_restored: bool = False,
    ) -> None:
        self.reason = reason
        super().__init__(summary, problems, output=output, config_restored=config_restored)

    def docs_link(self) -> str:
        code = refusal_code(f"[refused: {self.reason}]")
        return REFUSAL_PAGES[code] if code is not None else self.docs


class ResourceFailedError(RunFailedError):
    """A resource operation broke part-way. The stack config keeps the desired state:
    fix the cause the message names and run `up()` again; it continues where it stopped."""

    docs = "docs/recovery.md#when-a-run-is-interrupted"
