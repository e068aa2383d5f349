"""The stack config file `Pulumi.<env>.yaml`: read, edit, validate, write.

Edits keep the file's comments and key order (ruamel.yaml round trip). Every edit is
validated against the program's own settings models (`cluster_settings`) before the
file is written, so a rejected edit leaves the file byte-identical.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from cluster_settings import SettingProblem, SettingsError, StackSettings, load_settings
from cluster_settings.models import PoolSettings

from .errors import DuplicateWorkerError, SettingsRejectedError, UnknownWorkerError

NAMESPACE = "hk3s"
WORKERS_KEY = f"{NAMESPACE}:workers"
FENCES_KEY = f"{NAMESPACE}:fences"
POOLS_KEY = f"{NAMESPACE}:worker_pools"
SERVER_KEY = f"{NAMESPACE}:server"
# Pulumi's own rule for stack names, without which `Pulumi.<env>.yaml`, the backend's state and lock
# paths are built from a name that could climb out of the project or the backend (`../../x`).
STACK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


def check_stack_name(env: str) -> None:
    """Refuse a stack name that is not a plain name before it reaches any path."""
    if not STACK_NAME.match(env) or ".." in env:
        raise SettingsRejectedError(
            [
                SettingProblem(
                    "stack",
                    f"{env!r} is not a stack name: use letters, digits, '-', '_' and '.', "
                    "no path separator and no '..' (e.g. 'staging')",
                )
            ],
            action="choosing the stack",
        )


def _yaml() -> YAML:
    yaml = YAML()  # round trip: comments, order and quoting survive
    yaml.indent(mapping=2, sequence=4, offset=2)  # the layout of Pulumi.dev.yaml
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def plain(value: Any) -> Any:
    """A ruamel node as plain dicts, lists and scalars (what the settings models take)."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, bool | int | float) or value is None:
        return value
    return str(value)


class StackDocument:
    """One parsed stack file, edited in memory."""

    def __init__(self, text: str) -> None:
        loaded = _yaml().load(text) if text.strip() else None
        self.root: CommentedMap = loaded if isinstance(loaded, CommentedMap) else CommentedMap()
        if not isinstance(self.root.get("config"), CommentedMap):
            self.root["config"] = CommentedMap()

    @property
    def config(self) -> CommentedMap:
        config = self.root["config"]
        assert isinstance(config, CommentedMap)
        return config

    def settings_input(self) -> dict[str, Any]:
        """The `hk3s:*` keys as the dict `cluster_settings.load_settings` takes."""
        return {
            key.partition(":")[2]: plain(value)
            for key, value in self.config.items()
            if str(key).startswith(NAMESPACE + ":")
        }

    def validate(self, action: str = "the change") -> StackSettings:
        """The whole config checked by the program's models; `SettingsRejectedError` lists every problem."""
        try:
            return load_settings(self.settings_input())
        except SettingsError as error:
            raise SettingsRejectedError(error.problems, action=action) from None

    @property
    def secrets_provider(self) -> str | None:
        """The secrets provider the Pulumi CLI opens the stack with: the one the file names
        (`secretsprovider:`), `passphrase` for a file holding a passphrase's salt, None when the
        file names none (a stack not created yet, or one whose backend keeps its own)."""
        named = self.root.get("secretsprovider")
        if isinstance(named, str) and named:
            return named
        return "passphrase" if self.root.get("encryptionsalt") else None

    def render(self) -> str:
        out = io.StringIO()
        _yaml().dump(self.root, out)
        return out.getvalue()

    # --- edits -------------------------------------------------------------------
    def worker_names(self) -> list[str]:
        workers = self.config.get(WORKERS_KEY) or []
        return [str(entry.get("name")) for entry in workers if isinstance(entry, Mapping)]

    def pool_workers(self) -> dict[str, tuple[int, PoolSettings, int]]:
        """The workers the pools make, by name: (the pool's index, the pool, the worker's number).
        A pool entry that does not parse makes none here (validation names it)."""
        members: dict[str, tuple[int, PoolSettings, int]] = {}
        for index, entry in enumerate(self.config.get(POOLS_KEY) or []):
            try:
                pool = PoolSettings.model_validate(plain(entry))
            except ValidationError:
                continue
            members.update({pool.worker_name(number): (index, pool, number) for number in pool.numbers()})
        return members

    def server_name(self) -> str:
        server = self.config.get(SERVER_KEY)
        name = server.get("name") if isinstance(server, Mapping) else None
        return str(name) if name else "k3s-server"

    def add_worker(self, entry: Mapping[str, Any]) -> None:
        """Append a worker; a name already used by a worker or the server is refused."""
        name = str(entry["name"])
        names = self.worker_names()
        if name in names or name == self.server_name():
            index = names.index(name) if name in names else None
            key = f"{WORKERS_KEY}[{index}].name" if index is not None else f"{SERVER_KEY}.name"
            raise DuplicateWorkerError(
                [SettingProblem(key, f"{name!r} is already a node of this stack; choose another worker name")],
                action=f"adding worker {name}",
            )
        workers = self.config.get(WORKERS_KEY)
        if not isinstance(workers, CommentedSeq):
            workers = CommentedSeq(workers or [])
            self.config[WORKERS_KEY] = workers
        node = CommentedMap()
        for key, value in entry.items():
            node[key] = CommentedMap(value) if isinstance(value, Mapping) else value
        workers.append(node)

    def remove_worker(self, name: str, *, force: bool = False) -> None:
        """Drop a worker and its fence entry. A pool's worker goes by its pool's count instead.
        With `force`, a fenced worker is given up: its fence entry stays, with force_remove."""
        names = self.worker_names()
        pooled = self.pool_workers().get(name)
        if name not in names and pooled is not None:
            index, pool, number = pooled
            raise SettingsRejectedError(
                [
                    SettingProblem(
                        f"{POOLS_KEY}[{index}].count",
                        f"{name} is worker {number} of pool {pool.name}, which keeps {pool.count} workers: lower "
                        f"count to {pool.count - 1} (the highest number goes) or add {number} to its retire list "
                        "with it",
                    )
                ],
                action=f"removing worker {name}",
            )
        if name not in names:
            raise UnknownWorkerError(
                [SettingProblem(WORKERS_KEY, self._unknown(name, names))], action=f"removing worker {name}"
            )
        fences = self.config.get(FENCES_KEY)
        fenced = isinstance(fences, Mapping) and name in fences
        if force and not fenced:
            raise SettingsRejectedError(
                [
                    SettingProblem(
                        f"{FENCES_KEY}.{name}",
                        f"{name} is not fenced: --force gives up a fenced worker only. Fence it first (node fence "
                        f"{name}), or remove it without --force (drained, copies moved, wiped)",
                    )
                ],
                action=f"giving up worker {name}",
            )
        del self.config[WORKERS_KEY][names.index(name)]
        if force:
            fences = self.config[FENCES_KEY]
            fences[name] = CommentedMap({**(fences[name] or {}), "force_remove": True})
        elif fenced:
            self._drop_fence(name)

    def set_fence(self, name: str, *, powered_off: bool, accept_stale_data: bool) -> None:
        """Record `hk3s:fences.<name>` for a listed worker or a pool's worker."""
        names = [*self.worker_names(), *self.pool_workers()]
        if name not in names:
            raise UnknownWorkerError(
                [SettingProblem(f"{FENCES_KEY}.{name}", self._unknown(name, names))], action=f"fencing {name}"
            )
        fences = self.config.get(FENCES_KEY)
        if not isinstance(fences, CommentedMap):
            fences = CommentedMap(fences or {})
            self.config[FENCES_KEY] = fences
        fences[name] = CommentedMap(powered_off=powered_off, accept_stale_data=accept_stale_data)

    def remove_fence(self, name: str) -> None:
        fences = self.config.get(FENCES_KEY)
        if not isinstance(fences, Mapping) or name not in fences:
            raise SettingsRejectedError(
                [SettingProblem(f"{FENCES_KEY}.{name}", f"{name} is not fenced; there is no fence to lift")],
                action=f"unfencing {name}",
            )
        self._drop_fence(name)

    def _drop_fence(self, name: str) -> None:
        fences = self.config[FENCES_KEY]
        del fences[name]
        if not fences:
            del self.config[FENCES_KEY]

    @staticmethod
    def _unknown(name: str, names: list[str]) -> str:
        listed = ", ".join(names) or "none"
        return f"there is no worker named {name!r} in {WORKERS_KEY} (workers: {listed})"


class StackFile:
    """`Pulumi.<env>.yaml` of one stack, on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.is_file()

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()

    def document(self) -> StackDocument:
        return StackDocument(self.path.read_text() if self.path.exists() else "")

    def write_bytes(self, data: bytes) -> None:
        """Replace the file in one step: a reader sees the old file or the new one, never half."""
        mode = self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644
        handle, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def write_document(self, document: StackDocument) -> None:
        self.write_bytes(document.render().encode())
