"""NodeLoginKey and RetiredLoginKeys: rotating the key that logs in to a node.

A new `hk3s:ssh.private_key_file` rotates the key on every node instead of replacing
anything. Per node, in two resources, so that a host is never left that neither key
reaches and a killed run resumes:

1. `NodeLoginKey` comes before every other resource of its node. When the key changed
   it logs in with the previous key (kept encrypted in its own state, or named by
   `hk3s:ssh.previous_private_key_file`), adds the new public key to the login user's
   authorized_keys and checks a login with the new key. Its `retiring_keys` output
   lists the previous key's public line.
2. `RetiredLoginKeys` comes after every resource of the run (they all store the new
   key first, touching no host: providers.base.state_only_change). It logs in with
   the new key, pinned to the host key the node's probe recorded, and removes the
   retiring keys.

Between the two, both keys log in, so a refresh after a kill reads every resource with
whichever key its state holds. Existing hosts (whose authorized_keys the operator
wrote, not the program) are handled the same way; preview lists them.

A worker the stack fences (an `hk3s:fences` entry) is often a dead host, and its fence never
waits on its own login key: when the rotation cannot be done there (the host does not answer
over SSH), it waits, the run says so, and the state keeps the previous key, so every later run
still finds it pending. The first run that reaches the host rotates it (the lift, at the
latest: this resource comes before the fence's delete, which logs in with the new key). The
worker's other resources store the new key meanwhile (state only), and no step removes the
previous key from a host that never took the new one (its RetiredLoginKeys gets nothing new
to retire).

Host keys: `NodeLoginKey` runs before the node's probe, so it pins the host key the
stack config records, or the one it saw itself at its last rotation, and otherwise
accepts the host's key on first use. On a Hetzner server the program created, its
creation replaces the host key the server was given in user_data (served by the metadata
service for the server's whole life) with one the program made and kept only in the state,
once logged in pinned to the first: its `host_key` output, which the probe and every later
login pin. What it sends is a public key and a signature an
impostor could not reuse; the step that removes the old key is pinned to the probe's key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, Resource, UpdateResult

from node_operations.host_facts import FIRST_CONTACT_SECONDS
from node_operations.login_keys import (
    add_login_key,
    key_fingerprint,
    public_key_line,
    replace_host_key,
    retire_login_keys,
)
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    pin_recorded_host_key,
    progress,
    resource_inputs,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, is_known, known
from remote_access.ssh import FirstContact, SshError

KEY_COMMENT = "hk3s login key"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeLoginKeyInputs(NodeInputs):
    """The node's login (its `private_key` the key to use from now on) and where the previous one is."""

    previous_private_key: pulumi.Input[str] | None = None
    """hk3s:ssh.previous_private_key_file, a secret."""
    authorized_by: pulumi.Input[str] = "operator"
    """Who wrote the host's authorized_keys: "program" (a server it created) or "operator"."""
    fenced: pulumi.Input[bool] = False
    """The stack fences this worker (hk3s:fences): a rotation it cannot take now waits."""
    replacement_host_key: pulumi.Input[str] | None = None
    """A secret: the Ed25519 host key (HostKeyPair) that replaces, at creation, the one a server the
    program created was given in its user_data (login.recorded_host_key). Creation-only."""
    replacement_host_public_key: pulumi.Input[str] | None = None
    first_contact_seconds: pulumi.Input[float] | None = None
    """How long the creation waits for a new server's first answer (hk3s:ssh.first_contact_seconds)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetiredLoginKeysInputs(NodeInputs):
    """The public lines of the keys to remove from the node."""

    retiring_keys: pulumi.Input[list[str]] = dataclasses.field(default_factory=list)


def _fingerprint(private_key: Any) -> str:
    return key_fingerprint(str(private_key)) if is_known(private_key) and private_key else "(not known yet)"


class NodeLoginKeyProvider(NodeProvider):
    """Dynamic provider of `NodeLoginKey`."""

    acts_on_login_change = True

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        checked = dict(news)
        if olds.get("replaced_host_key") and checked.get("recorded_host_key") == olds["replaced_host_key"]:
            # The key the server was given at creation was replaced (create): the stack still names
            # it, but the host presents the replacement, which every later login pins.
            checked["recorded_host_key"] = olds.get("host_key")
        return CheckResult(pin_recorded_host_key(olds, checked), check_connection_inputs(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # A previous key named in the config only helps a rotation; on its own it changes nothing.
        result = diff_inputs(
            olds,
            news,
            replace_on=self.replace_on,
            # Whether the worker is fenced only says how a rotation may end: never a change by itself.
            ignore=NodeLoginKeyInputs.names(
                "recorded_host_key",
                "previous_private_key",
                "fenced",
                "replacement_host_key",
                "replacement_host_public_key",
                "first_contact_seconds",
            ),
        )
        if olds.get("private_key") and olds.get("private_key") != news.get("private_key"):
            node = str(news.get("node"))
            owner = (
                "its authorized_keys was written by you, not the program (an existing host): the new key's line is "
                "added and only the previous key's line removed"
                if news.get("authorized_by") == "operator"
                else "created by the program with the previous key"
            )
            progress(
                node,
                f"plan: login key rotates {_fingerprint(olds['private_key'])} -> {_fingerprint(news['private_key'])} "
                f"on {news.get('ssh_user')}@{news.get('address')} ({owner}); the previous key is removed once "
                "every resource of the run holds the new one",
            )
        return result

    def _rotate(self, props: dict[str, Any], previous: list[str]) -> dict[str, Any]:
        login = NodeLoginKeyInputs.from_props(props).login
        node = str(known(login.node))
        target = ssh_target(login)
        added = run_operation(add_login_key(target, previous, KEY_COMMENT, lambda line: progress(node, line)))
        return {
            **props,
            "host_key": added.host_key,
            "key_fingerprint": key_fingerprint(target.private_key),
            "retiring_keys": sorted({public_key_line(key, KEY_COMMENT) for key in previous}),
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        # Deterministic id: a create retried after a crash continues the same node's key.
        inputs = NodeLoginKeyInputs.from_props(props)
        id_ = f"{known(inputs.login.node)}-login-key"
        previous = known(inputs.previous_private_key)
        if previous and previous != known(inputs.login.private_key):
            # A rotation this state has no record of (a stack older than the rotation).
            return CreateResult(id_=id_, outs=self._rotate(props, [str(previous)]))
        given = known(inputs.login.recorded_host_key) or None
        replacement = known(inputs.replacement_host_key)
        if inputs.authorized_by == "program" and given and replacement:
            # A server the program created, its first host key given in user_data, which Hetzner's
            # metadata service serves to anything on the server for its whole life: once logged in
            # pinned to it, the host gets the replacement (never in user_data), pinned from now on.
            node = str(known(inputs.login.node))
            first_contact = FirstContact(
                seconds=float(known(inputs.first_contact_seconds) or FIRST_CONTACT_SECONDS),
                progress=lambda line: progress(node, line),
            )
            new_key = run_operation(
                replace_host_key(
                    ssh_target(inputs.login),
                    str(replacement),
                    str(known(inputs.replacement_host_public_key)),
                    first_contact,
                )
            )
            progress(node, f"host key replaced: the one given in user_data is no longer used ({new_key[:24]}...)")
            return CreateResult(
                id_=id_,
                outs={
                    **props,
                    "host_key": new_key,
                    "replaced_host_key": given,
                    "key_fingerprint": key_fingerprint(str(known(inputs.login.private_key))),
                    "retiring_keys": [],
                },
            )
        # Nothing to do on the host: the key given at creation (or the operator's) is in use. The
        # probe's first login, right after this, checks it.
        return CreateResult(
            id_=id_,
            outs={
                **props,
                "host_key": given,
                "key_fingerprint": key_fingerprint(str(known(inputs.login.private_key))),
                "retiring_keys": [],
            },
        )

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if olds.get("private_key") == news.get("private_key"):
            # A new address or user with the same key: nothing to rotate.
            return UpdateResult(outs={**olds, **{k: v for k, v in news.items() if v is not None}})
        previous = [str(olds["private_key"])]
        extra = news.get("previous_private_key")
        if extra and extra not in previous and extra != news["private_key"]:
            previous.append(str(extra))
        try:
            return UpdateResult(outs=self._rotate(news, previous))
        except SshError as error:
            if not news.get("fenced"):
                raise
            return UpdateResult(outs=self._wait_for_the_host(olds, news, error))

    def _wait_for_the_host(self, olds: dict[str, Any], news: dict[str, Any], error: SshError) -> dict[str, Any]:
        """A fenced worker's rotation that cannot be done now waits (see the module docstring): the
        state keeps the previous key, so the next run's diff still finds the rotation."""
        node = str(news.get("node"))
        reason = str(error).removeprefix(f"{error.node}: ")
        progress(
            node,
            f"fenced: its login key rotation {_fingerprint(olds['private_key'])} -> "
            f"{_fingerprint(news['private_key'])} waits until its host answers over SSH again ({reason}); the "
            f"previous key still logs in there and stays in the state for {node}, and the first up that reaches the "
            "host (the one that lifts the fence, at the latest) rotates it",
        )
        return dict(olds)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A node leaving the stack keeps whatever keys it has; the program never locks anyone out.
        return None


class NodeLoginKey(Resource, module="hk3s", name="NodeLoginKey"):
    """The key that logs in to one node, rotated in place when hk3s:ssh.private_key_file changes."""

    host_key: pulumi.Output[str]
    key_fingerprint: pulumi.Output[str]
    retiring_keys: pulumi.Output[list[str]]

    def __init__(
        self, resource_name: str, inputs: NodeLoginKeyInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = resource_inputs(inputs, ["host_key", "key_fingerprint", "retiring_keys", "replaced_host_key"])
        if inputs.previous_private_key is not None:
            props["previous_private_key"] = pulumi.Output.secret(inputs.previous_private_key)
        if inputs.replacement_host_key is not None:
            props["replacement_host_key"] = pulumi.Output.secret(inputs.replacement_host_key)
        opts = pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(
                additional_secret_outputs=["private_key", "previous_private_key", "replacement_host_key"]
            ),
        )
        super().__init__(NodeLoginKeyProvider(), resource_name, props, opts)


class RetiredLoginKeysProvider(NodeProvider):
    """Dynamic provider of `RetiredLoginKeys`."""

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return diff_inputs(olds, news, replace_on=(), ignore=RetiredLoginKeysInputs.names("recorded_host_key"))

    def _retire(self, props: dict[str, Any]) -> dict[str, Any]:
        inputs = RetiredLoginKeysInputs.from_props(props)
        node = str(known(inputs.login.node))
        retiring = [str(line) for line in known(inputs.retiring_keys) or []]
        if retiring:
            run_operation(retire_login_keys(ssh_target(inputs.login), retiring, lambda line: progress(node, line)))
        return {**props, "retired_keys": retiring}

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=f"{props['node']}-retired-login-keys", outs=self._retire(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._retire(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class RetiredLoginKeys(Resource, module="hk3s", name="RetiredLoginKeys"):
    """The previous login keys removed from one node, after every resource of the run holds the new key."""

    retired_keys: pulumi.Output[list[str]]

    def __init__(
        self, resource_name: str, inputs: RetiredLoginKeysInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(RetiredLoginKeysProvider(), resource_name, resource_inputs(inputs, ["retired_keys"]), opts)
