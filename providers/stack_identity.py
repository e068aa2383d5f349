"""StackIdentity: a random id made once for the stack and kept in its state.

The rule: what this stack made in a shared Hetzner project must be recognisable as its own by
something that does not change with the stack's name. `pulumi stack rename` keeps the state
(only its URNs are rewritten) but changes `pulumi.get_stack()`, so a label holding the stack's
name stops matching after a rename, and a run that took a key with another label for another
stack's would stop declaring it and Pulumi would delete it. The id made here is written once, at
the stack's first `up`, and every later run reads it back from the state: a rename, a renamed
cluster or a rotated token keep it; a new stack (or a stack removed and made again) gets a new
one. It touches no host and no API.
"""

from __future__ import annotations

import secrets
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider

# 16 hex digits: unique enough among the stacks of one project, and a valid Hetzner label value.
ID_BYTES = 8


class StackIdentityProvider(ResourceProvider):
    """Dynamic provider of `StackIdentity`: the id is made at create and never changes."""

    def diff(self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=False, replaces=[], delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        stack_id = secrets.token_hex(ID_BYTES)
        return CreateResult(id_=stack_id, outs={**props, "stack_id": stack_id})


class StackIdentity(Resource, module="hk3s", name="StackIdentity"):
    """The stack's own id, made at its first `up` and kept in its state."""

    stack_id: pulumi.Output[str]

    def __init__(self, resource_name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(StackIdentityProvider(), resource_name, {"stack_id": None}, opts)
