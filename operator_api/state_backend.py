"""`StateBackend`: where one stack's state is kept, and everything this API does with the
backend itself rather than through a Pulumi run: which backend and secrets provider the stack
uses, the checks made before anything runs, who holds the stack (Pulumi's locks, this API's
own), the states the backend kept after each run, and reading one of them back for a restore.

Which backend: PULUMI_BACKEND_URL when set, else the one the user's Pulumi CLI is logged in to
(operator_api.workspace.resolve_backend), the local default only for a user who never logged in.

A lock of a `file://` backend left by a process that no longer runs on this host is removed
before the next change (a live one, or one from another host, makes the stack busy and is never
touched). A stack kept in an S3 bucket is shared by machines that cannot see each other's
processes: its lock object is never removed without an operator's confirmation (`unlock`),
however old; the bucket, the endpoint and the credentials are checked before anything runs
(operator_api.s3_backend). Pulumi Cloud (or a self-hosted service) locks and keeps the history
itself: none of this reaches into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pulumi import automation as auto

from .backend_lock import hold_file_lock, hold_s3_lock
from .errors import LockHolder, StackBusyError, StackError, shown
from .locks import OperatorLock, backend_directory, keep_state_private, read_pulumi_locks
from .s3_backend import S3Backend, s3_backend
from .workspace import check_backend_lasts

# `.pulumi/history/[organization/]<project>/<stack>/<stack>-<unix nanoseconds>.checkpoint.json`
_CHECKPOINT = re.compile(
    r"\.pulumi/history/(?:[^/]+/)?(?P<project>[^/]+)/(?P<stack>[^/]+)/(?P=stack)-(?P<nanos>\d+)\.checkpoint\.json$"
)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A state the backend kept after one run: where (an object key or a path in the backend),
    when, and the run's kind and result."""

    key: str
    taken: str
    kind: str
    result: str


PASSPHRASE = "passphrase"


def secrets_provider_to_use(backend_url: str, named: str | None, chosen: str | None) -> str | None:
    """The secrets provider of a stack: the one its stack file names (`named`: the CLI opens the
    stack with it, whatever is chosen now), else the one the user chose for the stack's creation,
    else the passphrase for a backend the Pulumi CLI keeps itself (`file://`, `s3://`, `gs://`,
    `azblob://`: the CLI has no other default there), else the service backend's own (None). A
    passphrase stack is opened only with PULUMI_CONFIG_PASSPHRASE (or _FILE) set: without it the
    run is refused before the stack is made, naming the passphrase and a key service
    (workspace.check_passphrase), which a team shares better than a passphrase."""
    if named:
        return named
    if chosen:
        return chosen
    if backend_url.startswith(("file://", "s3://", "gs://", "azblob://")):
        return PASSPHRASE
    return None


def check_secrets_provider_url(url: str) -> None:
    """Refuse, by name, a secrets provider the Pulumi CLI does not know (before a stack is made)."""
    known = ("passphrase", "default", "awskms://", "gcpkms://", "azurekeyvault://", "hashivault://", "base64key://")
    if not url.startswith(known):
        raise StackError(
            f"secrets provider {shown(url)} is not one Pulumi knows: use passphrase, default (Pulumi Cloud's), or "
            "a key service's URL: awskms://KEY?region=REGION, gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K, "
            "azurekeyvault://VAULT.vault.azure.net/keys/KEY, hashivault://KEY"
        )


def secrets_provider_problem(text: str, provider: str | None) -> str | None:
    """One line naming the fix for a key service's failure in a Pulumi command's output (no
    credentials for it, the key not there or not allowed, a wrong passphrase); None for another failure."""
    which = f"the stack's secrets provider {shown(provider)}" if provider else "the stack's secrets provider"
    lowered = text.lower()
    if "incorrect passphrase" in lowered:
        return (
            f"{which} refused the passphrase: set PULUMI_CONFIG_PASSPHRASE (or _FILE) to the one the stack was made "
            "with"
        )
    if not provider or provider == PASSPHRASE:
        return None
    if any(
        marker in lowered
        for marker in (
            "failed to refresh cached credentials",
            "nocredentialproviders",
            "no valid providers in chain",
            "could not find default credentials",
            "defaultazurecredential",
            "missing client token",
        )
    ):
        return (
            f"{which} has no credentials: give them as its tool wants (for awskms://: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; gcpkms://: gcloud auth application-default login; "
            "azurekeyvault://: az login) and run again"
        )
    if "notfoundexception" in lowered or "key not found" in lowered or "is not found" in lowered:
        return f"{which} names a key the key service does not have: correct the key (id, ARN or alias) in its URL"
    if "accessdenied" in lowered or "permission denied" in lowered or "not authorized" in lowered:
        return f"{which} refused the key's use: grant encrypt and decrypt on the key to the credentials in use"
    return None


class _NoLock:
    """No operator lock (a backend such as Pulumi Cloud, which locks the stack itself)."""

    @contextlib.contextmanager
    def hold(self, action: str) -> Iterator[None]:
        del action
        yield


class StateBackend:
    """The backend (`url`) that keeps stack `stack` of project `project`, opened with the
    environment `env` (the credentials of an S3 bucket among it)."""

    def __init__(self, url: str, env: Mapping[str, str], project: str, stack: str) -> None:
        self.url = url
        self.env = dict(env)
        self.project = project
        self.stack = stack
        self.directory = backend_directory(url)
        self._s3: S3Backend | None = None

    # --- before anything runs --------------------------------------------------------------
    def check(self) -> None:
        """Refuse a backend that cannot work or would not last (a CI runner's disk), check an S3
        bucket (reachable, there, the key accepted and allowed to write), and keep a local
        backend's directory private. Changes nothing in the backend."""
        check_backend_lasts(self.env)
        self.s3()
        if self.directory is not None:
            keep_state_private(self.directory)

    def s3(self) -> S3Backend | None:
        """The S3 backend, checked once before this object reads or writes it; None for another backend."""
        if self._s3 is None:
            backend = s3_backend(self.url, self.env)
            if backend is None:
                return None
            backend.check()
            self._s3 = backend
        return self._s3

    # --- who holds the stack ----------------------------------------------------------------
    def holders(self) -> tuple[list[LockHolder], list[str]]:
        """Every Pulumi lock of the stack and a word on each (live, stale, foreign, in the bucket)."""
        s3 = self.s3()
        if s3 is not None:
            holders = s3.locks(self.project, self.stack)
            return holders, ["in the bucket"] * len(holders)
        locks = read_pulumi_locks(self.directory, self.project, self.stack) if self.directory else []
        return [lock.holder for lock in locks], [lock.state for lock in locks]

    def remove(self, holders: Sequence[LockHolder]) -> list[LockHolder]:
        """Remove the locks of `holders` (an operator confirmed their runs are dead)."""
        s3 = self.s3()
        for holder in holders:
            if s3 is not None:
                s3.remove_lock(holder)
            else:
                Path(holder.path).unlink(missing_ok=True)
        return list(holders)

    def take_over(self, say: Callable[[str], None]) -> list[LockHolder]:
        """Before a change: refuse a stack another run holds (`StackBusyError`), remove the lock of
        a run of this machine that no longer runs (said through `say`) and return those."""
        stale: list[LockHolder] = []
        s3 = self.s3()
        if s3 is not None:
            # Another machine's run, live or dead, cannot be told apart from here.
            held = s3.locks(self.project, self.stack)
            if held:
                raise StackBusyError(
                    self.stack,
                    held,
                    "held by a Pulumi run in the bucket; if that run is dead (a runner that went down), "
                    f"`scripts/hk3s --stack {self.stack} unlock` shows the lock and removes it on your word",
                )
        if self.directory is not None:
            locks = read_pulumi_locks(self.directory, self.project, self.stack)
            busy = [lock.holder for lock in locks if lock.state != "stale"]
            if busy:
                raise StackBusyError(self.stack, busy, "held by a Pulumi run")
            for lock in locks:
                lock.path.unlink(missing_ok=True)
                stale.append(lock.holder)
                say(f"removed the lock of an interrupted run: {lock.holder} is no longer running")
        return stale

    def operator_lock(self) -> OperatorLock | _NoLock:
        """This API's lock for one change on this machine: in a file backend's directory, or, for
        a bucket, under ~/.hk3s-operator (machines are kept apart by Pulumi's lock)."""
        directory = self.directory
        if directory is None and self.url.startswith("s3://"):
            home = Path(self.env.get("HOME") or Path.home())
            directory = home / ".hk3s-operator" / self.url.removeprefix("s3://").partition("?")[0]
        return OperatorLock(directory, self.project, self.stack) if directory is not None else _NoLock()

    def hold(self, action: str) -> contextlib.AbstractContextManager[None]:
        """The stack's lock in its backend (a file:// or s3:// one), the one `pulumi up` takes, for an
        operation that makes no Pulumi run itself: held while it runs, so no run or operation on any
        machine sharing the state goes on meanwhile (operator_api.backend_lock)."""
        s3 = self.s3()
        if s3 is not None:
            return hold_s3_lock(s3, self.project, self.stack, action)
        if self.directory is not None:
            return hold_file_lock(self.directory, self.project, self.stack, action)
        return contextlib.nullcontext()

    # --- the states kept after each run -----------------------------------------------------
    def checkpoints(self) -> list[Checkpoint]:
        """The states the backend kept after each run of the stack (a `file://` or `s3://`
        backend keeps one per update, refresh and destroy under `.pulumi/history/`), newest first."""
        s3 = self.s3()
        if s3 is not None:
            keys = s3.list_keys(f".pulumi/history/{self.project}/{self.stack}/")
        elif self.directory is not None:
            root = self.directory / ".pulumi" / "history" / self.project / self.stack
            keys = (
                [str(path.relative_to(self.directory)) for path in root.rglob("*.checkpoint.json")]
                if root.exists()
                else []
            )
        else:
            raise StackError("checkpoints are read from a file:// or s3:// backend; Pulumi Cloud keeps its own history")
        found = []
        for key in keys:
            match = _CHECKPOINT.search(key)
            if match is None or match["project"] != self.project or match["stack"] != self.stack:
                continue
            info: dict[str, Any] = {}
            with contextlib.suppress(ValueError, StackError, OSError):
                info = json.loads(self.read(key.replace(".checkpoint.json", ".history.json")))
            taken = datetime.datetime.fromtimestamp(int(match["nanos"]) / 1e9, datetime.UTC)
            found.append(
                Checkpoint(
                    key, taken.isoformat(timespec="seconds"), str(info.get("kind", "")), str(info.get("result", ""))
                )
            )
        return sorted(found, key=lambda checkpoint: checkpoint.key, reverse=True)

    def read(self, key: str) -> bytes:
        """One object (a path) of the backend."""
        s3 = self.s3()
        if s3 is not None:
            data = s3.get(key)
            if data is None:
                raise StackError(f"{key} is not in the bucket")
            return data
        if self.directory is None:
            raise StackError("only a file:// or s3:// backend is read directly")
        return (self.directory / key).read_bytes()

    def checkpoint_state(self, checkpoint: Checkpoint) -> auto.Deployment:
        """The state `checkpoint` holds, as `pulumi stack import` takes it."""
        document = json.loads(self.read(checkpoint.key))
        deployment = document.get("checkpoint", {}).get("latest")
        if not isinstance(deployment, dict):
            raise StackError(f"{checkpoint.key} holds no state to restore")
        return auto.Deployment(version=int(document["version"]), deployment=deployment)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m operator_api.state_backend PROJECT_DIR STACK [SECRETS_PROVIDER]`, for
    scripts/stack.sh: the backend the stack's runs use, why, and the secrets provider the stack is
    opened (or made) with, one a line (an empty line: the backend service's own); on the first run
    with the local default, the line that says so on stderr. One line on stderr and exit 2 when
    the backend cannot be known."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from .stack_file import StackFile  # noqa: PLC0415
    from .workspace import pulumi_command, resolve_backend  # noqa: PLC0415

    project_dir, stack, *chosen = list(sys.argv[1:] if argv is None else argv)
    try:
        choice = resolve_backend(
            dict(os.environ), Path(project_dir), lambda: pulumi_command(None, os.environ.get("PATH", ""))
        )
    except StackError as error:
        print(error, file=sys.stderr)
        return 2
    if choice.first_use:
        print(f"hk3s: {choice.notice()}", file=sys.stderr)
    stack_file = StackFile(Path(project_dir) / f"Pulumi.{stack}.yaml")
    named = stack_file.document().secrets_provider if stack_file.exists() else None
    provider = secrets_provider_to_use(choice.url, named, chosen[0] if chosen else None)
    print(f"{choice.url}\n{choice.source}\n{provider or ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
