"""ProjectSshKey: the SSH key the stack uploads to its Hetzner project, or, when another stack
uploaded the same key first, that stack's key.

The rule: Hetzner holds one key per fingerprint and per name in a project (409
`uniqueness_error`), and two stacks of one project with the same deploy key may both find no key
at preview and both upload it in their first runs. The one whose upload Hetzner refuses takes
the key that won, by its fingerprint and only when its public key is this one, blob for blob
(remote_access.hetzner_api.upload_or_adopt_ssh_key); it records that the key is not its own
(`owned: false`), so it never renames, relabels or deletes it. A key it uploaded (`owned: true`)
is renamed and relabelled in place and deleted with the resource. A refused upload whose key
carries this stack's own `hk3s-stack-id` label (providers.stack_identity) is this stack's earlier
upload whose run ended before Pulumi recorded it: owned (brought to this run's name and labels).
`owned` lives in the state, so a `pulumi stack rename` (which changes only the owner label the
program computes) keeps it.

A new public key replaces the resource (a rotation: the new key is uploaded before the old one
is deleted); a new name or labels update it in place, as terraform-provider-hcloud's
hcloud_ssh_key does (internal/sshkey/resource.go: `public_key` ForceNew, `name` and `labels`
updated).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult

from providers.base import program_error
from providers.inputs import ResourceInputs, is_known, known
from remote_access.hetzner_api import (
    DEFAULT_ENDPOINT,
    HetznerAccess,
    HetznerApiError,
    delete_ssh_key,
    update_ssh_key,
    upload_or_adopt_ssh_key,
)

program_error(HetznerApiError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProjectSshKeyInputs(ResourceInputs):
    """The key to upload: its name and labels in the project, its public key and fingerprint."""

    name: pulumi.Input[str]
    public_key: pulumi.Input[str]
    fingerprint: pulumi.Input[str]
    labels: pulumi.Input[dict[str, str]]
    hcloud_token: pulumi.Input[str] | None = None
    """A secret: hcloud:token (or HCLOUD_TOKEN), as the Hetzner Pulumi provider reads it."""
    hcloud_endpoint: pulumi.Input[str] | None = None


@program_error
class NoHetznerTokenForKeyError(RuntimeError):
    """The key cannot be uploaded: no token."""


def _access(props: dict[str, Any]) -> HetznerAccess:
    inputs = ProjectSshKeyInputs.from_props(props)
    token = known(inputs.hcloud_token)
    if not token:
        raise NoHetznerTokenForKeyError(
            "uploading the cluster's SSH key needs the Hetzner API, but there is no token; set it: "
            "pulumi config set --secret hcloud:token <token> (or HCLOUD_TOKEN)"
        )
    return HetznerAccess(str(token), str(known(inputs.hcloud_endpoint) or DEFAULT_ENDPOINT))


class ProjectSshKeyProvider(ResourceProvider):
    """Dynamic provider of `ProjectSshKey`; it calls the Hetzner API only."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        key = news.get("public_key")
        failures = []
        if is_known(key) and (not isinstance(key, str) or len(key.split()) < 2):
            failures.append(CheckFailure("public_key", f"{str(key)[:40]!r} is not an OpenSSH public key line"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = ProjectSshKeyInputs.names("name", "public_key", "labels", "hcloud_token", "hcloud_endpoint")
        changed = [key for key in keys if olds.get(key) != news.get(key)]
        replaces = [key for key in changed if key == "public_key"]
        return DiffResult(changes=bool(changed), replaces=replaces, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        inputs = ProjectSshKeyInputs.from_props(props)
        key = upload_or_adopt_ssh_key(
            _access(props),
            str(known(inputs.name)),
            str(known(inputs.public_key)),
            str(known(inputs.fingerprint)),
            dict(known(inputs.labels) or {}),
        )
        return CreateResult(id_=str(key.id), outs={**props, "key_id": str(key.id), "owned": key.owned})

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        owned = bool(olds.get("owned"))
        if owned and (olds.get("name") != news.get("name") or olds.get("labels") != news.get("labels")):
            update_ssh_key(_access(news), int(id_), str(news["name"]), dict(news.get("labels") or {}))
        return UpdateResult(outs={**news, "key_id": id_, "owned": owned})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        # A key another stack uploaded stays: this stack only used it.
        if props.get("owned"):
            delete_ssh_key(_access(props), int(id_))


class ProjectSshKey(Resource, module="hk3s", name="ProjectSshKey"):
    """The Hetzner SSH key new servers get: uploaded by this stack, or taken from the stack that
    uploaded it first (`owned` false)."""

    key_id: pulumi.Output[str]
    owned: pulumi.Output[bool]

    def __init__(
        self, resource_name: str, inputs: ProjectSshKeyInputs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = {**inputs.props(), "key_id": None, "owned": None}
        props["hcloud_token"] = pulumi.Output.secret(props["hcloud_token"])
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["hcloud_token"]))
        super().__init__(ProjectSshKeyProvider(), resource_name, props, opts)
