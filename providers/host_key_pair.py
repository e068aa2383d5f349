"""HostKeyPair: the SSH host key of a Hetzner server the program creates.

A new server's key cannot be pinned from outside (nobody has seen it), and a
key recorded on first use trusts whoever answers first. So the program makes
the key itself: an Ed25519 pair generated once, when the resource is created,
kept in the state as a secret, handed to the server through cloud-init's
`ssh_keys` in `user_data` at creation, and pinned by every login from the
first one. It is never regenerated: no input changes it, and `user_data` is
creation-only on the server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult

from providers.inputs import ResourceInputs


def generate_host_key() -> tuple[str, str]:
    """(private key in OpenSSH PEM form, public key line 'ssh-ed25519 AAAA...')."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - only creates need it
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: PLC0415

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


def cloud_config(private_key: str, public_key: str) -> str:
    """cloud-init user data that installs this host key and generates no other."""
    import yaml  # noqa: PLC0415

    document = {
        "ssh_deletekeys": True,
        # Only the pinned key: a key type cloud-init made up would be one nobody pinned.
        "ssh_genkeytypes": [],
        "ssh_keys": {"ed25519_private": private_key, "ed25519_public": public_key},
    }
    return "#cloud-config\n" + yaml.safe_dump(document, sort_keys=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostKeyPairInputs(ResourceInputs):
    """The node the key is for (the key itself is made by create, never an input)."""

    node: str


class HostKeyPairProvider(ResourceProvider):
    """Dynamic provider of `HostKeyPair`: create generates, nothing else changes it."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        private, public = generate_host_key()
        node = HostKeyPairInputs.from_props(props).node
        return CreateResult(id_=f"{node}-host-key", outs={"node": node, "private_key": private, "public_key": public})

    def diff(self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]) -> DiffResult:
        # The server holds this key from its creation: a new one would lock every login out.
        return DiffResult(changes=False, replaces=[], stables=["private_key", "public_key"])

    def update(self, _id: str, olds: dict[str, Any], _news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=dict(olds))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_=id_, outs=dict(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


_NO_KEY_YET: str | None = None


class HostKeyPair(Resource, module="hk3s", name="HostKeyPair"):
    """An Ed25519 SSH host key for one Hetzner server; `private_key` is secret."""

    private_key: pulumi.Output[str]
    public_key: pulumi.Output[str]

    def __init__(self, resource_name: str, node: str, opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["private_key"]))
        super().__init__(
            HostKeyPairProvider(),
            resource_name,
            {
                **HostKeyPairInputs(node=node).props(),
                "private_key": pulumi.Output.secret(_NO_KEY_YET),
                "public_key": None,
            },
            opts,
        )
