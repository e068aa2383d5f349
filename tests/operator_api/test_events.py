"""Engine events to data and typed errors. The events are built with the SDK's own
`EngineEvent.from_json` from the engine's wire shape; the refusal's diagnostic is the one a
lab run recorded (tests/lab/test_automation.py, removing a worker), traceback and all. No
engine runs here: the lab tests drive the same code through the real CLI."""

from __future__ import annotations

from typing import Any

from pulumi.automation import events as auto_events

from cluster_settings import SettingProblem
from cluster_settings.loading import SettingsError
from node_operations.join import JoinError
from operator_api import RefusedError, ResourceFailedError
from operator_api.cluster_stack import Preview
from operator_api.events import PlannedChange, RunRecord, hetzner_limit, parse_urn, provider_message
from providers.base import CapabilityMissingError

JOIN_URN = "urn:pulumi:lab::hk3s::hk3s:index:WorkerNode$pulumi-python:dynamic/hk3s:NodeJoin::au-worker-2-join"
JOIN_TYPE = "pulumi-python:dynamic/hk3s:NodeJoin"
SERVER_URN = "urn:pulumi:lab::hk3s::hk3s:index:ClusterServer$pulumi-python:dynamic/hk3s:K3sServer::au-server-k3s"
SERVER_TYPE = "pulumi-python:dynamic/hk3s:K3sServer"
STACK_URN = "urn:pulumi:lab::hk3s::pulumi:pulumi:Stack::hk3s-lab"
# A capability refusal as an earlier release raised it (removing a worker, before that landed):
# the parsing does not depend on which capability it was.
REMOVE_CAPABILITY = (
    "removing a worker (drain, move copies, wipe, deregister); put the worker back in hk3s:workers to keep it"
)
REMOVAL_REFUSED = (
    "Traceback (most recent call last):\n"
    '  File "/tmp/pytest-of-root/pytest-118/automation-stack0/project/venv/lib/python3.11/site-packages/pulumi/'
    'dynamic/__main__.py", line 84, in wrapper\n'
    "    return fn(self, request, context)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/tmp/pytest-of-root/pytest-118/automation-stack0/project/venv/lib/python3.11/site-packages/pulumi/'
    'dynamic/__main__.py", line 160, in Delete\n'
    "    provider.delete(id_, props)\n"
    '  File "/tmp/pytest-of-root/pytest-118/automation-stack0/project/providers/node_join.py", line 157, in delete\n'
    '    raise CapabilityMissingError(props["node"], "removing the worker", REMOVE_CAPABILITY)\n'
    # The message is the real class's, with the refusal code it carries.
    f"providers.base.CapabilityMissingError: {CapabilityMissingError('au-worker-2', 'removing the worker', REMOVE_CAPABILITY)}"
    "\n\n"
)


def metadata(op: str, urn: str, type_: str) -> dict[str, Any]:
    return {"op": op, "urn": urn, "type": type_, "provider": ""}


def event(sequence: int, **body: Any) -> auto_events.EngineEvent:
    return auto_events.EngineEvent.from_json({"sequence": sequence, "timestamp": 0, **body})


def feed(*events: auto_events.EngineEvent) -> RunRecord:
    record = RunRecord()
    for item in events:
        record.handle(item)
    return record


def failed_run(message: str, urn: str = JOIN_URN, type_: str = JOIN_TYPE, op: str = "delete") -> RunRecord:
    return feed(
        event(1, resourcePreEvent={"metadata": metadata(op, urn, type_)}),
        event(2, diagnosticEvent={"urn": urn, "message": message, "color": "never", "severity": "error"}),
        event(3, resOpFailedEvent={"metadata": metadata(op, urn, type_), "status": 0, "steps": 1}),
        event(4, diagnosticEvent={"message": "update failed\n", "color": "never", "severity": "error"}),
        event(5, summaryEvent={"maybeCorrupt": False, "durationSeconds": 4, "resourceChanges": {"same": 14}}),
    )


def test_urns_give_type_and_name() -> None:
    assert parse_urn(JOIN_URN) == (JOIN_TYPE, "au-worker-2-join")
    assert parse_urn(STACK_URN) == ("pulumi:pulumi:Stack", "hk3s-lab")


def test_the_provider_message_is_the_last_exception_line_of_the_traceback() -> None:
    kind, message = provider_message(REMOVAL_REFUSED)
    assert kind == "CapabilityMissingError"
    assert message.startswith("au-worker-2: removing the worker is not available in this release: removing a worker")
    assert "Traceback" not in message and "node_join.py" not in message
    assert provider_message("error: Exception: disk full\n") == ("Exception", "disk full")
    assert provider_message("plain words from the engine") == ("", "plain words from the engine")


def test_a_capability_refusal_is_refused_naming_the_resource() -> None:
    error = failed_run(REMOVAL_REFUSED).to_error("up", "output")
    assert isinstance(error, RefusedError) and error.reason == "capability-missing"
    assert error.resource is not None
    assert (error.resource.urn, error.resource.type, error.resource.name) == (JOIN_URN, JOIN_TYPE, "au-worker-2-join")
    assert "is not available in this release" in error.resource.message
    assert len(error.problems) == 1  # the engine's closing "update failed" adds nothing
    assert "au-worker-2-join (pulumi-python:dynamic/hk3s:NodeJoin): au-worker-2: removing" in str(error)


def test_a_failed_preflight_is_a_refusal() -> None:
    text = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in create\n'
        f"node_operations.join.JoinError: {JoinError('w3', 'preflight', 'swap: swap is on; turn it off (swapoff -a)')}\n"
    )
    error = failed_run(text, op="create").to_error("up", "")
    assert isinstance(error, RefusedError) and error.reason == "preflight"


def test_a_failure_part_way_is_resource_failed() -> None:
    text = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in create\n'
        "node_operations.join.JoinError: w3: join stopped at ca-hash: the agent refuses the server's CA (x)\n"
    )
    error = failed_run(text, op="create").to_error("up", "")
    assert isinstance(error, ResourceFailedError) and not isinstance(error, RefusedError)
    assert error.resource is not None and error.resource.message.startswith("w3: join stopped at ca-hash")


def test_settings_the_program_rejects_are_a_refusal() -> None:
    message = (
        'Program failed with an unhandled exception:\nTraceback (most recent call last):\n  File "__main__.py"\n'
        f"cluster_settings.loading.SettingsError: "
        f"{SettingsError([SettingProblem('hk3s:workers[0].address', repr('1.2.3') + ' is not an IPv4 address')])}\n"
    )
    record = feed(
        event(1, diagnosticEvent={"urn": STACK_URN, "message": message, "color": "never", "severity": "error"})
    )
    error = record.to_error("preview", "")
    assert isinstance(error, RefusedError) and error.reason == "settings"
    assert error.resource is not None and "hk3s:workers[0].address" in error.resource.message


def test_preview_steps_changes_and_server_restart() -> None:
    join_create = metadata("create", JOIN_URN, JOIN_TYPE)
    record = feed(
        event(1, resourcePreEvent={"metadata": metadata("same", STACK_URN, "pulumi:pulumi:Stack"), "planning": True}),
        event(2, resourcePreEvent={"metadata": join_create, "planning": True}),
        event(3, resourcePreEvent={"metadata": metadata("update", SERVER_URN, SERVER_TYPE), "planning": True}),
        event(
            4,
            diagnosticEvent={
                "urn": JOIN_URN,
                "message": "[au-worker-2] preflight (at 0.3s)\n",
                "severity": "info#err",
                "color": "never",
            },
        ),
        event(
            5,
            summaryEvent={
                "maybeCorrupt": False,
                "durationSeconds": 2,
                "resourceChanges": {"same": 1, "create": 1, "update": 1},
            },
        ),
    )
    assert record.changes == [
        PlannedChange(JOIN_URN, JOIN_TYPE, "au-worker-2-join", "create"),
        PlannedChange(SERVER_URN, SERVER_TYPE, "au-server-k3s", "update"),
    ]
    assert record.summary == {"same": 1, "create": 1, "update": 1}
    assert record.progress == [("au-worker-2", "preflight (at 0.3s)")]
    preview = Preview(steps=list(record.steps.values()), summary=record.summary)
    assert preview.restarts_api and preview.deletes == []


def test_replacement_steps_read_as_one_replace() -> None:
    record = feed(
        event(1, resourcePreEvent={"metadata": metadata("create-replacement", JOIN_URN, JOIN_TYPE)}),
        event(2, resourcePreEvent={"metadata": metadata("replace", JOIN_URN, JOIN_TYPE)}),
        event(3, resourcePreEvent={"metadata": metadata("delete-replaced", JOIN_URN, JOIN_TYPE)}),
    )
    assert [(c.name, c.op) for c in record.changes] == [("au-worker-2-join", "replace")]
    preview = Preview(steps=list(record.steps.values()), summary={})
    assert not preview.restarts_api and [c.op for c in preview.deletes] == ["replace"]


def test_hetzner_limit_errors_read_as_one_line_naming_the_limit() -> None:
    record = RunRecord()
    urn = "urn:pulumi:dev::hk3s::hk3s:index:WorkerNode$hcloud:index/server:Server::dev-worker-9"
    engine_text = (
        "error: 1 error occurred:\n\t* creating server: server limit exceeded for this project, please contact "
        "support (resource_limit_exceeded, 7c1a)\n"
    )
    record.handle(
        auto_events.EngineEvent.from_json(
            {
                "sequence": 1,
                "timestamp": 1,
                "diagnosticEvent": {"urn": urn, "message": engine_text, "severity": "error"},
            }
        )
    )
    record.failed[urn] = "hcloud:index/server:Server"
    problem = record.problems()[0]
    assert "\n" not in problem.message and "resource limits" in problem.message
    assert "Ask Hetzner for a higher limit" in problem.message and problem.name == "dev-worker-9"
    assert "3600 requests an hour" in (hetzner_limit("... (rate_limit_exceeded)") or "")
    assert hetzner_limit("dial tcp: connection refused") is None


def test_a_refusal_is_known_by_its_code_not_its_wording() -> None:
    reworded = "w3: this step is refused for reasons of its own [refused: capability-missing]\n"
    error = failed_run(reworded, op="create").to_error("up", "")
    assert isinstance(error, RefusedError) and error.reason == "capability-missing"
    assert error.resource is not None and error.resource.message == "w3: this step is refused for reasons of its own"
    # The words of a refusal without its code are no refusal.
    untagged = "w3: removing the worker is not available in this release: (quoted by a failed step)\n"
    failed = failed_run(untagged, op="create").to_error("up", "")
    assert isinstance(failed, ResourceFailedError) and not isinstance(failed, RefusedError)
