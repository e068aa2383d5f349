"""Rotating the key that logs in to a node, over SSH, without ever leaving the host
unreachable: the new key is added with the previous one, a login with it is checked,
and only then (in a later step of the run, `retire_login_keys`) the previous key goes.

Every step looks first at what is done (the new key already logs in, the old line is
already gone), so a run killed at any point continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from host_scripts import script_path
from node_operations.host_facts import wait_for_cloud_init
from remote_access.ssh import (
    FirstContact,
    HostKeyChangedError,
    LineCallback,
    RemoteCommandError,
    SshError,
    SshTarget,
    fingerprint,
    open_session,
)

if TYPE_CHECKING:
    pass  # loaded on first use, as in remote_access.ssh

KEY_STEP_SECONDS = 30.0
AUTHORIZED_KEYS = "~/.ssh/authorized_keys"


class LoginKeyError(SshError):
    """A rotation step failed on a host; the message says which key still logs in and what to do."""


def public_key_line(private_key: str, comment: str = "hk3s") -> str:
    """The OpenSSH public line of a private key, with `comment`."""
    import asyncssh  # noqa: PLC0415 - loaded on first use, as in remote_access.ssh

    key = asyncssh.import_private_key(private_key)
    kind, blob = key.export_public_key("openssh").decode().split()[:2]
    return f"{kind} {blob} {comment}"


def key_fingerprint(private_key: str) -> str:
    """SHA256 fingerprint of a private key's public half, as ssh-keygen -l prints it."""
    return fingerprint(public_key_line(private_key))


def key_refused(error: SshError) -> bool:
    """True when the host refused the key (as opposed to being unreachable or impersonated).

    The SSH layer raises its own message for a refused key, from the asyncssh error it caught,
    which stays the exception's context."""
    import asyncssh  # noqa: PLC0415 - loaded on first use, as in remote_access.ssh

    return isinstance(error.__context__, asyncssh.PermissionDenied)


async def logs_in(target: SshTarget) -> str | None:
    """The host key when `target`'s key logs in (one harmless command run), None when refused.
    Any other failure (unreachable, host key changed) is raised."""
    try:
        async with open_session(target) as session:
            await session.run(["true"], deadline=KEY_STEP_SECONDS)
            return session.host_key
    except SshError as error:
        if key_refused(error):
            return None
        raise


@dataclasses.dataclass(frozen=True)
class KeyAdded:
    """What `add_login_key` found or did."""

    host_key: str
    added: bool
    """False when the new key logged in already (a resumed rotation, or the operator added it)."""


async def add_login_key(new: SshTarget, previous_keys: Sequence[str], comment: str, on_line: LineCallback) -> KeyAdded:
    """Make `new`'s key log in: log in with a previous key that still works, add the new public
    key to the user's authorized_keys, check a login with the new key."""
    where = f"{new.user}@{new.address}"
    host_key = await logs_in(new)
    if host_key is not None:
        on_line(f"the new login key {key_fingerprint(new.private_key)} logs in already")
        return KeyAdded(host_key, added=False)
    new_line = public_key_line(new.private_key, comment)
    for private_key in previous_keys:
        old = dataclasses.replace(new, private_key=private_key)
        try:
            async with open_session(old) as session:
                on_line(f"adding the new login key {fingerprint(new_line)} to {AUTHORIZED_KEYS} of {new.user}")
                try:
                    await session.run_script(
                        script_path("login_keys.sh"), ["add"], deadline=KEY_STEP_SECONDS, env={"NEW_KEY": new_line}
                    )
                except RemoteCommandError as error:
                    raise LoginKeyError(
                        new.node,
                        f"cannot add the new login key to {AUTHORIZED_KEYS} of {where}: {error.stderr_tail}. "
                        f"The previous key still logs in and nothing was removed. Make the file writable (or add "
                        f"this line to it yourself: {new_line}) and run pulumi up again",
                    ) from None
                host_key = session.host_key
        except LoginKeyError:
            raise
        except SshError as error:
            if key_refused(error):
                continue
            raise
        pinned = dataclasses.replace(new, recorded_host_key=host_key)
        if await logs_in(pinned) is None:
            raise LoginKeyError(
                new.node,
                f"the new login key was added to {AUTHORIZED_KEYS} of {where} but sshd refuses it (does sshd read "
                "another AuthorizedKeysFile?). The previous key still logs in and nothing was removed; make sshd "
                "accept the new key and run pulumi up again",
            )
        on_line(f"the new login key {fingerprint(new_line)} logs in")
        return KeyAdded(host_key, added=True)
    raise LoginKeyError(
        new.node,
        f"neither the new login key ({key_fingerprint(new.private_key)}, hk3s:ssh.private_key_file) nor the "
        f"previous one logs in as {where}. Set hk3s:ssh.previous_private_key_file to the key the host accepts, "
        f"or add the new public key to its {AUTHORIZED_KEYS} yourself, and run pulumi up again",
    )


async def retire_login_keys(new: SshTarget, retiring: Sequence[str], on_line: LineCallback) -> int:
    """Log in with the new key and remove the `retiring` public keys from authorized_keys (never the
    new key, and only while the file holds the new key). Returns how many lines went."""
    new_line = public_key_line(new.private_key)
    new_blob = new_line.split()[1]
    lines = [line for line in retiring if line.split()[1] != new_blob]
    if not lines:
        return 0
    try:
        async with open_session(new) as session:
            result = await session.run_script(
                script_path("login_keys.sh"),
                ["remove"],
                deadline=KEY_STEP_SECONDS,
                env={"NEW_KEY": new_line, "RETIRE_KEYS": "\n".join(lines)},
            )
    except RemoteCommandError as error:
        raise LoginKeyError(
            new.node,
            f"cannot remove the previous login key from {AUTHORIZED_KEYS} of {new.user}@{new.address}: "
            f"{error.stderr_tail}. Both keys still log in; fix the file and run pulumi up again",
        ) from None
    words = result.stdout.split()
    removed = int(words[1]) if words[:1] == ["removed"] else 0
    retired = ", ".join(fingerprint(line) for line in lines)
    on_line(f"previous login key {retired} removed from {AUTHORIZED_KEYS}" if removed else f"{retired} already gone")
    return removed


HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key"
HOST_KEY_STEP_SECONDS = 60.0


async def replace_host_key(
    target: SshTarget, private_key: str, public_key: str, first_contact: FirstContact | None = None
) -> str:
    """Put `private_key` in place of the host key `target` is pinned to (the one the host was given
    at creation) and return the new public line ('ssh-ed25519 AAAA...'), once a fresh login pinned
    to it worked. Where the host already presents the new key (a retried create after a crash) it is
    adopted. With `first_contact` a host still booting is waited for, and cloud-init."""
    new_line = " ".join(public_key.split()[:2])
    pinned_new = dataclasses.replace(target, recorded_host_key=new_line)
    try:
        async with open_session(target, first_contact, login_anew=True) as session:
            if first_contact is not None:
                await wait_for_cloud_init(session, first_contact, time.monotonic())
            await session.upload(
                private_key.encode(), f"{HOST_KEY_FILE}.hk3s-new", deadline=HOST_KEY_STEP_SECONDS, mode=0o600
            )
            await session.run_script(script_path("host_key_replace.sh"), [new_line], deadline=HOST_KEY_STEP_SECONDS)
    except HostKeyChangedError:
        # Replaced already, or an impostor: only a login pinned to the new key says which.
        pass
    # sshd re-executes itself on the reload: for a moment nothing listens (connection refused).
    settling = FirstContact(seconds=HOST_KEY_STEP_SECONDS, progress=lambda _line: None)
    async with open_session(pinned_new, settling, login_anew=True) as session:
        await session.run(["true"], deadline=KEY_STEP_SECONDS)
    return new_line
