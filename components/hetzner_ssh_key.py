"""The operator's SSH key as Hetzner knows it: the key new servers are created with.

Hetzner refuses a second key with the same fingerprint in one project
(`uniqueness_error`), and most operators uploaded theirs long ago; a second
stack in the same project with the same deploy key would hit the same wall.
So the program looks the key up by fingerprint first and uploads it only when
the project does not hold it. A key the program uploaded carries the stack's
owner label, which is how a later run tells its own key (kept managed, so a
rotation replaces it) from someone else's (used, never deleted).

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


def _uploaded_by_this_stack(key: hcloud.outputs.GetSshKeysSshKeyResult, cluster: str, owner: str) -> bool:
    labels = key.labels or {}
    if OWNER_LABEL in labels:
        return labels[OWNER_LABEL] == owner
    # Uploaded by a release before the owner label, under the name that release gave it: still in
    # this stack's state, so it stays managed (and gets the label) instead of being dropped.
    return key.name == f"{cluster}-admin"


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
    same = [key for key in keys if key.fingerprint == fingerprint]
    if same and not _uploaded_by_this_stack(same[0], settings.cluster.name, owner):
        pulumi.log.info(
            f"using the SSH key {same[0].name!r} already in the Hetzner project (fingerprint {fingerprint}) "
            "for new servers; this stack never deletes it",
            resource=parent,
        )
        return pulumi.Output.from_input(str(same[0].id))
    # Named after its fingerprint: a rotation creates the new key before deleting the old one, and
    # Hetzner refuses two keys of one name.
    key = hcloud.SshKey(
        f"{settings.cluster.name}-ssh-key",
        name=f"{settings.cluster.name}-{fingerprint.replace(':', '')[:12]}",
        public_key=public_key,
        labels={"hk3s-cluster": settings.cluster.name, OWNER_LABEL: owner},
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return key.id
