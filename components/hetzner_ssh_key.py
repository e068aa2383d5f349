"""The operator's SSH key as Hetzner knows it: the key new servers are created with.

Hetzner refuses a second key with the same fingerprint, or the same name, in one project
(`uniqueness_error`), and most operators uploaded theirs long ago; a second stack in the same
project with the same deploy key would hit the same wall. So the program looks the key up by
fingerprint first (and takes it only when its public key is this one, blob for blob) and uploads it
only when the project does not hold it.

Whose a key is: a key without the owner label (`hk3s-owner: <project>.<stack>`) the program puts
on a key it uploads is the operator's (whatever its name, even `<cluster>-admin`, the name the
first releases gave theirs): used, never updated or deleted. A key uploaded through ProjectSshKey
(the `hk3s-upload: api` label) is declared as a ProjectSshKey by every stack that uses it, and its
provider decides ownership from what no stack name shapes: the state (`owned`, recorded at
upload) and the key's stack-id label (`hk3s-stack-id`, the stack's StackIdentity, made once and
kept in its state). So `pulumi stack rename`, which changes the owner label the program computes,
keeps the key declared and owned (the rename's run relabels it in place), where reading ownership
from the owner label would stop declaring it and Pulumi would delete it; and an upload whose run
ended before Pulumi recorded it is taken back by the next run as this stack's own (its stack-id
label is this stack's), so the teardown deletes it. Another stack's key is taken as not owned:
never renamed, relabelled or deleted.

The key's Pulumi resource has a logical name that no setting shapes (`cluster-ssh-key`), with
aliases for the name earlier releases gave it (`<cluster>-ssh-key`, for the cluster name now and the
one recorded on the key's `hk3s-cluster` label): renaming `hk3s:cluster.name` renames the key in
place (terraform-provider-hcloud's hcloud_ssh_key updates `name` and `labels` in place; only
`public_key` replaces it), where a new logical name would create a second key with the same
fingerprint and fail mid-run.

A key the stack uploads now is a `ProjectSshKey` (providers.project_ssh_key), marked with the
`hk3s-upload: api` label: two stacks' first runs that both found no key at preview may upload it
at once, and the one Hetzner refuses takes the other's key (by fingerprint, only with the same
public key) instead of failing. A key this stack uploaded before that marker is an
`hcloud.SshKey` in its state and stays one (a new resource type would delete and re-upload it);
it is recognised by its owner label alone, which names the stack, so a `pulumi stack rename` of
such a stack still loses it (known limit of keys uploaded by those releases).

Servers ignore later changes of their key (components.machine), so replacing
this key after a rotation touches no server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

import pulumi
import pulumi_hcloud as hcloud

from cluster_settings.loading import SettingsError
from cluster_settings.models import StackSettings
from cluster_settings.rules import SettingProblem
from providers.project_ssh_key import ProjectSshKey, ProjectSshKeyInputs
from providers.stack_identity import StackIdentity
from remote_access.hetzner_api import STACK_ID_LABEL

OWNER_LABEL = "hk3s-owner"
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def hetzner_fingerprint(public_key_line: str) -> str:
    """The fingerprint Hetzner shows and matches keys by: MD5 of the key blob, colon-separated hex
    (as `ssh-keygen -l -E md5` prints it, without the prefix)."""
    parts = public_key_line.split()
    if len(parts) < 2:
        raise ValueError(f"{public_key_line[:40]!r} is not an OpenSSH public key line")
    try:
        blob = base64.b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
    except binascii.Error as error:
        raise ValueError(f"the public key's base64 cannot be read: {error}") from None
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def stack_owner() -> str:
    """This stack's owner label value (Hetzner label values: at most 63 of [A-Za-z0-9_.-])."""
    value = _LABEL_UNSAFE.sub("-", f"{pulumi.get_project()}.{pulumi.get_stack()}")
    if len(value) > 63:
        value = value[:54] + "-" + hashlib.sha256(value.encode()).hexdigest()[:8]
    return value.strip("-_.") or "hk3s"


KEY_RESOURCE = "cluster-ssh-key"
STACK_IDENTITY_RESOURCE = "stack-identity"
CLUSTER_LABEL = "hk3s-cluster"
# On a key uploaded through ProjectSshKey: the resource type that manages it.
UPLOAD_LABEL = "hk3s-upload"
UPLOAD_VALUE = "api"


def _same_public_key(held: str | None, wanted: str) -> bool:
    """Hetzner's key is this one: type and base64 blob equal (the comment may differ)."""
    return bool(held) and str(held).split()[:2] == wanted.split()[:2]


def _uploaded_by_this_stack(key: hcloud.outputs.GetSshKeysSshKeyResult, owner: str) -> bool:
    return (key.labels or {}).get(OWNER_LABEL) == owner


def _earlier_names(cluster: str, key: hcloud.outputs.GetSshKeysSshKeyResult | None) -> list[pulumi.Alias]:
    """The logical names earlier releases gave this stack's key: `<cluster>-ssh-key`, with the
    cluster's name now and the one the key was uploaded under (its hk3s-cluster label)."""
    names = {f"{cluster}-ssh-key"}
    recorded = (key.labels or {}).get(CLUSTER_LABEL) if key is not None else None
    if recorded:
        names.add(f"{recorded}-ssh-key")
    return [pulumi.Alias(name=name) for name in sorted(names)]


def cluster_ssh_key(parent: pulumi.Resource, settings: StackSettings, public_key: str) -> pulumi.Output[str]:
    """The id of the Hetzner SSH key new servers get: the one `hk3s:ssh.hetzner_key` names, else a key
    already in the project with this public key's fingerprint, else one this stack uploads."""
    keys = hcloud.get_ssh_keys().ssh_keys
    wanted = settings.ssh.hetzner_key
    if wanted is not None:
        named = [key for key in keys if key.name == wanted]
        if not named:
            known = ", ".join(sorted(key.name for key in keys)) or "none"
            raise SettingsError(
                [
                    SettingProblem(
                        "hk3s:ssh.hetzner_key",
                        f"the Hetzner project has no SSH key named {wanted!r} (its keys: {known}); "
                        "fix the name, or unset it to use or upload the key of hk3s:ssh.private_key_file",
                    )
                ]
            )
        return pulumi.Output.from_input(str(named[0].id))
    fingerprint = hetzner_fingerprint(public_key)
    owner = stack_owner()
    # Hetzner holds at most one key per fingerprint; an MD5 match alone is not this key.
    same = next((key for key in keys if key.fingerprint == fingerprint), None)
    if same is not None and not _same_public_key(same.public_key, public_key):
        raise SettingsError(
            [
                SettingProblem(
                    "hk3s:ssh.private_key_file",
                    f"the Hetzner project's SSH key {same.name!r} has this key's fingerprint {fingerprint} but "
                    "another public key, and Hetzner takes no second key with that fingerprint; use another "
                    "key pair, or name a key with hk3s:ssh.hetzner_key",
                )
            ]
        )
    uploaded_by_api = same is not None and (same.labels or {}).get(UPLOAD_LABEL) == UPLOAD_VALUE
    if same is not None and not uploaded_by_api and not _uploaded_by_this_stack(same, owner):
        whose = (same.labels or {}).get(OWNER_LABEL)
        pulumi.log.info(
            f"using the SSH key {same.name!r} already in the Hetzner project (fingerprint {fingerprint}, "
            + (f"uploaded by stack {whose}" if whose else "not uploaded by hk3s")
            + ") for new servers; this stack never changes or deletes it",
            resource=parent,
        )
        return pulumi.Output.from_input(str(same.id))
    # Named after its fingerprint: a rotation creates the new key before deleting the old one, and
    # Hetzner refuses two keys of one name.
    name = f"{settings.cluster.name}-{fingerprint.replace(':', '')[:12]}"
    labels = {CLUSTER_LABEL: settings.cluster.name, OWNER_LABEL: owner}
    opts = pulumi.ResourceOptions(parent=parent, aliases=_earlier_names(settings.cluster.name, same))
    if same is not None and not uploaded_by_api:
        # Uploaded by this stack before ProjectSshKey: its state holds an hcloud.SshKey.
        return hcloud.SshKey(KEY_RESOURCE, name=name, public_key=public_key, labels=labels, opts=opts).id
    from components.hetzner_project import hetzner_api_token  # noqa: PLC0415 - it imports this module

    # No key with this fingerprint yet, or one uploaded through ProjectSshKey (this stack's, or
    # another's it shares): declared either way, its provider decides whose it is (see above).
    identity = StackIdentity(STACK_IDENTITY_RESOURCE, opts=pulumi.ResourceOptions(parent=parent))
    uploaded = {**labels, UPLOAD_LABEL: UPLOAD_VALUE}
    token, endpoint = hetzner_api_token()
    return ProjectSshKey(
        KEY_RESOURCE,
        ProjectSshKeyInputs(
            name=name,
            public_key=public_key,
            fingerprint=fingerprint,
            labels=identity.stack_id.apply(lambda stack_id: {**uploaded, STACK_ID_LABEL: stack_id}),
            hcloud_token=token,
            hcloud_endpoint=endpoint,
        ),
        opts=pulumi.ResourceOptions(parent=parent),
    ).id
