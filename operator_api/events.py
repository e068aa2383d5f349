"""Engine events turned into data: the planned change per resource, what failed and why.

The engine reports a provider's exception as a diagnostic (severity ``error``) carrying the
resource's URN; a Python dynamic provider sends its whole traceback, whose last exception
line (``providers.base.CapabilityMissingError: worker-2: ... is not available in this
release ...``) is the message worth showing. A refusal (the program stopped before changing
anything) is known by the code its message carries (``[refused: <code>]``,
node_operations.refusal), never by its wording.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pulumi.automation import events as auto_events

from node_operations.refusal import refusal_code, untagged

from .errors import RefusedError, ResourceFailedError, ResourceProblem, RunFailedError

# Ops that belong to one replacement, reported as "replace".
_REPLACE_STEPS = {"replace", "create-replacement", "delete-replaced", "discard-replaced"}
# Ops that change nothing.
UNCHANGED_OPS = {"same", "read", "refresh"}
# `[node] message`: the progress lines node operations print.
PROGRESS_LINE = re.compile(r"\[(?P<node>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\] (?P<message>\S.*)")
_EXCEPTION_LINE = re.compile(r"^(?P<type>(?:[A-Za-z_][\w.]*)?(Error|Exception|Exit|Interrupt)): ?(?P<message>.*)$")


# Hetzner's API errors that mean a limit of the project, not a fault of the stack: the
# engine shows the provider's whole error; the caller gets one line saying what to do.
HETZNER_LIMITS = {
    "resource_limit_exceeded": (
        "Hetzner refused: the project reached one of its resource limits (servers, primary IPs, volumes, "
        "networks, firewalls...; resource_limit_exceeded). Ask Hetzner for a higher limit (Cloud Console, "
        "project, Limits) or delete what the project no longer needs, then run up again: it continues "
        "where it stopped"
    ),
    "rate_limit_exceeded": (
        "Hetzner refused: the project's API rate limit is used up (3600 requests an hour per project, shared "
        "by every stack and tool using it; rate_limit_exceeded). Wait a few minutes and run up again: it "
        "continues where it stopped"
    ),
}


def hetzner_limit(message: str) -> str | None:
    """The one-line explanation of a Hetzner limit error in `message`, if it is one."""
    for code, explanation in HETZNER_LIMITS.items():
        if code in message:
            return explanation
    return None


def parse_urn(urn: str) -> tuple[str, str]:
    """(type, name) of a URN `urn:pulumi:<stack>::<project>::<parent$type>::<name>`."""
    parts = urn.split("::")
    if len(parts) < 4:
        return "", urn
    return parts[2].rsplit("$", 1)[-1], "::".join(parts[3:])


def provider_message(text: str) -> tuple[str, str]:
    """(exception type, message) from what the engine reported for a resource."""
    lines = [line.removeprefix("error: ") for line in text.strip().splitlines()]
    for index in range(len(lines) - 1, -1, -1):
        match = _EXCEPTION_LINE.match(lines[index])
        if match:
            rest = [line for line in lines[index + 1 :] if line.strip()]
            message = " ".join([match["message"].strip(), *(line.strip() for line in rest)]).strip()
            return match["type"].rsplit(".", 1)[-1], message
    message = " ".join(line.strip() for line in lines if line.strip())
    return "", message.removeprefix("error: ").strip()


@dataclass(frozen=True)
class PlannedChange:
    """What the engine will do (preview) or did (up) to one resource."""

    urn: str
    type: str
    name: str
    op: str

    @property
    def changes(self) -> bool:
        return self.op not in UNCHANGED_OPS


@dataclass
class RunRecord:
    """Everything worth keeping from one run's event stream."""

    steps: dict[str, PlannedChange] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # urn -> type
    errors: list[tuple[str, str]] = field(default_factory=list)  # (urn or "", message)
    summary: dict[str, int] = field(default_factory=dict)
    progress: list[tuple[str, str]] = field(default_factory=list)

    def handle(self, event: auto_events.EngineEvent) -> None:
        if event.resource_pre_event is not None:
            self._step(event.resource_pre_event.metadata)
        if event.res_outputs_event is not None:
            metadata = event.res_outputs_event.metadata
            if str(_op(metadata)) not in UNCHANGED_OPS:
                self.finished.add(metadata.urn)
        if event.res_op_failed_event is not None:
            metadata = event.res_op_failed_event.metadata
            self.failed[metadata.urn] = metadata.type
        if event.diagnostic_event is not None:
            diagnostic = event.diagnostic_event
            if diagnostic.severity == "error":
                self.errors.append((diagnostic.urn or "", diagnostic.message))
            else:
                for line in diagnostic.message.splitlines():
                    match = PROGRESS_LINE.search(line)
                    if match:
                        self.progress.append((match["node"], match["message"].strip()))
        if event.summary_event is not None:
            self.summary = {
                str(getattr(op, "value", op)): count for op, count in event.summary_event.resource_changes.items()
            }

    def _step(self, metadata: auto_events.StepEventMetadata) -> None:
        op = str(_op(metadata))
        if op in _REPLACE_STEPS:
            op = "replace"
        type_, name = parse_urn(metadata.urn)
        previous = self.steps.get(metadata.urn)
        if previous is None or previous.op in UNCHANGED_OPS or op == "replace":
            self.steps[metadata.urn] = PlannedChange(metadata.urn, metadata.type or type_, name, op)

    @property
    def changes(self) -> list[PlannedChange]:
        return [step for step in self.steps.values() if step.changes]

    def problems(self) -> list[ResourceProblem]:
        """Errors per resource (the engine's closing "update failed" without a URN dropped when
        a resource said more)."""
        found: list[ResourceProblem] = []
        for urn, text in self.errors:
            type_, name = parse_urn(urn) if urn else ("", "")
            if urn and urn in self.failed:
                type_ = self.failed[urn] or type_
            _, message = provider_message(text)
            if not message:
                continue
            message = hetzner_limit(message) or message
            found.append(ResourceProblem(urn=urn, type=type_, name=name, message=untagged(message)))
        with_urn = [problem for problem in found if problem.urn and "pulumi:pulumi:Stack" not in problem.type]
        return with_urn or found

    def to_error(self, command: str, output: str) -> RunFailedError:
        """The typed error for a run that ended in error."""
        problems = self.problems()
        # A refusal says so by its code (`[refused: <code>]`, node_operations.refusal), whatever its wording.
        texts = [text for _urn, text in self.errors] if problems else [output]
        reason = next((code for code in map(refusal_code, texts) if code is not None), None)
        if reason is not None:
            return RefusedError(f"{command} was refused ({reason})", problems, reason=reason, output=output)
        return ResourceFailedError(f"{command} failed", problems, output=output)


def _op(metadata: auto_events.StepEventMetadata) -> Any:
    return getattr(metadata.op, "value", metadata.op)


EventCallback = Callable[[auto_events.EngineEvent], None]
