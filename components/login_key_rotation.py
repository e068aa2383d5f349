"""The last step of a login key rotation: each node's previous key leaves its authorized_keys
once every resource of the run holds the new key (providers.login_key explains the order)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from components.barrier import Barrier
from components.node_endpoint import NodeEndpoint, SshCredentials
from providers.login_key import RetiredLoginKeys, RetiredLoginKeysInputs


def retire_previous_login_keys(
    endpoints: Sequence[NodeEndpoint], credentials: SshCredentials, after: Sequence[pulumi.Resource]
) -> list[RetiredLoginKeys]:
    """One `RetiredLoginKeys` per node, after `after` (the node components, whose every child
    logs in to some node): until they all hold the new key, the previous one must keep working.
    Each waits for one barrier that waits for all of `after` (components.barrier); a retirement's
    delete does nothing, so no delete needs ordering beside it."""
    rotating = [(endpoint, endpoint.login_key) for endpoint in endpoints if endpoint.login_key is not None]
    if not rotating:
        return []
    holders = Barrier("login-key-holders", after)
    retired = []
    for endpoint, login_key in rotating:
        retired.append(
            RetiredLoginKeys(
                f"{endpoint.name}-retired-login-keys",
                RetiredLoginKeysInputs(login=endpoint.login(credentials), retiring_keys=login_key.retiring_keys),
                opts=pulumi.ResourceOptions(provider=endpoint.operations, depends_on=[holders]),
            )
        )
    return retired
