"""StackIdentity's provider: the id is made once, at create, and no later input changes it (a
stack rename keeps the state and so the id; a new stack makes another)."""

from __future__ import annotations

import re

from providers.stack_identity import StackIdentityProvider


def test_the_id_is_made_at_create_and_never_changes() -> None:
    first = StackIdentityProvider().create({"stack_id": None})
    other = StackIdentityProvider().create({"stack_id": None})
    assert first.outs is not None and other.outs is not None
    # A Hetzner label value (at most 63 of [A-Za-z0-9_.-]), and another stack's differs.
    assert re.fullmatch(r"[0-9a-f]{16}", first.outs["stack_id"]) and first.id == first.outs["stack_id"]
    assert other.outs["stack_id"] != first.outs["stack_id"]
    diff = StackIdentityProvider().diff(first.id, first.outs, {"stack_id": None})
    assert diff.changes is False and not diff.replaces
