"""lab.node_watch's reading of kubectl's watch output: pretty-printed JSON documents one after
the other, arriving in pieces of any size."""

from __future__ import annotations

import json

from lab.node_watch import watch_events


def _event(kind: str, name: str, unschedulable: bool) -> dict:
    return {"type": kind, "object": {"metadata": {"name": name}, "spec": {"unschedulable": unschedulable}}}


def test_whole_documents_are_read_and_the_piece_of_the_next_is_kept() -> None:
    events = [_event("ADDED", "a", False), _event("MODIFIED", "a", True), _event("DELETED", "b", False)]
    text = "".join(json.dumps(event, indent=4) + "\n" for event in events)
    assert watch_events(text) == (events, "")
    # Cut anywhere: what is whole comes out, the rest waits for the next read.
    for cut in range(len(text)):
        first, rest = watch_events(text[:cut])
        second, left = watch_events(rest + text[cut:])
        assert first + second == events and left == "", cut


def test_a_brace_inside_a_string_does_not_end_a_document() -> None:
    event = {"type": "MODIFIED", "object": {"metadata": {"name": "a", "annotations": {"x": "} {"}}}}
    text = json.dumps(event, indent=2)
    assert watch_events(text[:-1]) == ([], text[:-1].lstrip())
    assert watch_events(text) == ([event], "")
