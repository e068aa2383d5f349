"""Directories only the user running the program may use.

The program keeps files that steer it on this machine: the SSH handshake slots, the
record of the running API forward (which port serves which server), the DIY backend's
state. A directory under a shared `/tmp` that another user made first (or a symbolic
link planted there) would let that user steer the run: a forged forward record points
the Kubernetes provider, and the cluster's credentials, at the other user's listener.
So such a directory is made 0700 and accepted only when it is a real directory of this
user that nobody else can enter; anything else is refused, naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path


class UnsafeDirectoryError(RuntimeError):
    """A directory the program would keep its files in is not private to this user."""


# Set by the operator API for the processes of a run it starts, whose $TMPDIR it points at a
# directory of that run alone: the run's processes must still meet every other run's files here
# (the SSH handshake slots, the API forward's record), so they are told where "here" is.
RUNTIME_DIR_VAR = "HK3S_RUNTIME_DIR"


def runtime_directory(env: Mapping[str, str] | None = None) -> Path:
    """This user's private directory for the run's transient files: `$HK3S_RUNTIME_DIR` when a
    run's starter named it, else `$XDG_RUNTIME_DIR/hk3s` (the per-user runtime directory
    systemd makes, 0700) or, without one, `hk3s-<uid>` in the system's temporary directory.
    `env`: the environment to read (default: this process's)."""
    env = os.environ if env is None else env
    if named := env.get(RUNTIME_DIR_VAR):
        return private_directory(Path(named))
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return private_directory(Path(runtime) / "hk3s")
    temporary = env.get("TMPDIR") if env is not os.environ else None
    return private_directory(Path(temporary or tempfile.gettempdir()) / f"hk3s-{os.geteuid()}")


def private_directory(path: Path, *, tighten: bool = False) -> Path:
    """Make `path` (mode 0700) or accept it when it already is a directory of this user
    that no one else may enter; with `tighten`, a directory of this user's that others may
    read is made 0700 (the user's own state directory, made by an earlier release).

    Never follows a symbolic link at `path`: the link's target is someone else's choice."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeDirectoryError(
            f"{path} is a symbolic link (to {os.readlink(path)}), not a directory of yours: the program "
            "keeps files there that steer its runs; remove the link (or set XDG_RUNTIME_DIR to a private directory)"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectoryError(f"{path} is not a directory: remove it, and the program makes its own")
    if info.st_uid != os.geteuid():
        raise UnsafeDirectoryError(
            f"{path} belongs to user id {info.st_uid}, not to you ({os.geteuid()}): another user made it first "
            "and could steer this program's runs through it; remove it (as that user or root), or set "
            "XDG_RUNTIME_DIR to a directory of your own"
        )
    if info.st_mode & 0o077:
        if tighten:
            os.chmod(path, 0o700)
        else:
            raise UnsafeDirectoryError(
                f"{path} has mode {stat.S_IMODE(info.st_mode):04o}: other users may enter it and could steer "
                f"this program's runs through it; run chmod 700 {path}"
            )
    return path
