"""What every Pulumi command the operator API runs is given: its environment, the Pulumi
CLI it runs, the backend (the one the user's Pulumi CLI uses), and the passphrase that encrypts
the stack's secrets when the stack uses one."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Literal

import yaml
from pulumi import automation as auto

from remote_access.private_dir import RUNTIME_DIR_VAR, runtime_directory

from .errors import StackError, shown


def pulumi_environment(project_dir: Path, given: Mapping[str, str], root: Path | str | None) -> dict[str, str]:
    """The environment of every Pulumi command: `given` over the defaults; with `root`, its
    `bin/` first on PATH."""
    # Nobody watches a run the API starts: the program refuses to trust a host key on first use
    # unless the stack opts in (providers.host_probe).
    env: dict[str, str] = {"PULUMI_SKIP_UPDATE_CHECK": "true", "HK3S_NON_INTERACTIVE": "1"}
    venv_python = project_dir / "venv" / "bin" / "python"
    # Older language hosts (the lab's) run the program with this interpreter.
    env["PULUMI_PYTHON_CMD"] = str(venv_python if venv_python.exists() else Path(sys.executable))
    env.update(given)
    path = env.get("PATH") or os.environ.get("PATH", "")
    if root is not None:
        path = f"{Path(root) / 'bin'}{os.pathsep}{path}"
    env["PATH"] = path
    return env


@contextlib.contextmanager
def run_temporary_directory(env: MutableMapping[str, str]) -> Iterator[Path]:
    """A temporary directory for one engine run alone, given to the run as $TMPDIR (in `env`,
    the environment the run is started with) and removed with everything in it when the run
    ends, however it ends.

    The Kubernetes provider writes the kubeconfig it is configured with (the cluster's admin
    client key) to a new file in $TMPDIR at every start and never removes it (pulumi-kubernetes
    provider.go: `writeKubeconfigToFile`, for Helm's settings); in a shared /tmp, one copy of
    the credentials per run would stay behind. The directory is made in the temporary directory
    the run would have used (mode 0700, a name no one can take first), not in the runtime
    directory, which is often a small tmpfs. The run's processes are told where the user's
    runtime directory is (HK3S_RUNTIME_DIR), so that they still share it with every other run
    (the SSH handshake slots, the API forward's record, the gzipped k3s binaries)."""
    merged = {**os.environ, **env}
    runtime = runtime_directory(merged)
    scratch = Path(tempfile.mkdtemp(prefix="hk3s-run-", dir=merged.get("TMPDIR") or None))
    saved = {name: env.get(name) for name in ("TMPDIR", RUNTIME_DIR_VAR)}
    env["TMPDIR"] = str(scratch)
    env[RUNTIME_DIR_VAR] = str(runtime)
    try:
        yield scratch
    finally:
        for name, value in saved.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        shutil.rmtree(scratch, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses and why: `PULUMI_BACKEND_URL`, `Pulumi.yaml` (the project's
    `backend.url`), `pulumi login` (what `pulumi whoami` reports), or `default` (the user never
    logged in: the local directory)."""

    url: str
    source: Literal["PULUMI_BACKEND_URL", "Pulumi.yaml", "pulumi login", "default"]

    @property
    def first_use(self) -> bool:
        """The local default, and nothing kept there yet."""
        directory = Path(self.url.removeprefix("file://"))
        return self.source == "default" and not (directory / ".pulumi").exists()

    def notice(self) -> str:
        """The line that says, on the first run, where the state goes and how to change it."""
        return (
            f"no Pulumi login and PULUMI_BACKEND_URL unset: the state is kept in {self.url} on this machine "
            "(for one person). To keep it elsewhere, `pulumi login s3://BUCKET?...` (or Pulumi Cloud) or set "
            "PULUMI_BACKEND_URL (docs/ci.md#keeping-state-for-a-team)"
        )


def default_backend(env: Mapping[str, str]) -> str:
    home = env.get("HOME") or os.environ.get("HOME") or str(Path.home())
    return (Path(home) / ".hk3s-state").as_uri()


def pulumi_home(env: Mapping[str, str]) -> Path:
    """The Pulumi CLI's home (PULUMI_HOME, else ~/.pulumi), where `pulumi login` records the backend."""
    merged = {**os.environ, **env}
    if merged.get("PULUMI_HOME"):
        return Path(merged["PULUMI_HOME"]).expanduser()
    return Path(merged.get("HOME") or Path.home()) / ".pulumi"


def logged_in(env: Mapping[str, str]) -> bool:
    """Whether the user ever ran `pulumi login` (the CLI's credentials name a current backend).
    Read from the file: asking the CLI would, without a login, try to log in to Pulumi Cloud."""
    try:
        credentials = json.loads((pulumi_home(env) / "credentials.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(credentials, dict) and bool(credentials.get("current"))


def resolve_backend(
    env: Mapping[str, str], project_dir: Path, command: Callable[[], auto.PulumiCommand]
) -> BackendChoice:
    """Which backend the Pulumi CLI would use for this project, so that this API, the scripts and
    a `pulumi up` typed by hand all see one stack, in the CLI's order: PULUMI_BACKEND_URL when
    set; the project's `backend.url` in Pulumi.yaml; the backend the user is logged in to (`pulumi
    whoami --json`'s `url`); the local default only when the user never logged in."""
    merged = {**os.environ, **env}
    if merged.get("PULUMI_BACKEND_URL"):
        return BackendChoice(merged["PULUMI_BACKEND_URL"], "PULUMI_BACKEND_URL")
    # The project's own choice comes next for the CLI (workspace.GetCurrentCloudURL).
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError):
        backend = (yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}).get("backend") or {}
        if isinstance(backend, dict) and backend.get("url"):
            return BackendChoice(str(backend["url"]), "Pulumi.yaml")
    if not logged_in(merged):
        return BackendChoice(default_backend(merged), "default")
    try:
        result = command().run(["whoami", "--json"], str(project_dir), dict(merged))
        url = str(json.loads(result.stdout).get("url") or "")
    except (auto.CommandError, ValueError, AttributeError) as error:
        reason = " ".join(str(error).split())[-300:]
        raise StackError(
            f"`pulumi whoami` cannot open the backend you are logged in to ({shown(reason)}): run `pulumi login` "
            "again, or set PULUMI_BACKEND_URL to the backend to use"
        ) from None
    if not url:
        raise StackError("`pulumi whoami --json` names no backend: run `pulumi login URL` or set PULUMI_BACKEND_URL")
    return BackendChoice(url, "pulumi login")


def pulumi_command(root: str | None, path: str) -> auto.PulumiCommand:
    """The Pulumi CLI under `root`, else the one on `path`."""
    if root is None:
        found = shutil.which("pulumi", path=path)
        if found is None:
            raise StackError(
                "The Pulumi CLI is not installed: see https://www.pulumi.com/docs/install/"
                " (docs/getting-started-hetzner.md#prerequisites)"
            )
        root = str(Path(found).resolve().parent.parent)
    return auto.PulumiCommand(root=root)


def check_passphrase(env_vars: Mapping[str, str], stack: str = "ENV") -> None:
    """Refuse to start a stack that uses the passphrase without it."""
    merged = {**os.environ, **env_vars}
    if not merged.get("PULUMI_CONFIG_PASSPHRASE") and not merged.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        raise StackError(
            "PULUMI_CONFIG_PASSPHRASE is not set: choose a passphrase that encrypts this stack's secrets, "
            "export it (or PULUMI_CONFIG_PASSPHRASE_FILE) and run again, or make the stack with a key service "
            f"instead (`scripts/hk3s --stack {stack} init --secrets-provider awskms://KEY?region=REGION`)"
        )


ALLOW_LOCAL_STATE = "HK3S_ALLOW_LOCAL_STATE"


def _set(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no")


def check_backend_lasts(env_vars: Mapping[str, str]) -> None:
    """Refuse a CI run whose state would stay on the runner: a `file://` backend there (the
    default when PULUMI_BACKEND_URL is unset) is lost with the runner, and with it the record
    of every server and the pinned host keys; the next run would create the cluster again.
    CI systems set CI; a runner that keeps its disk says so with HK3S_ALLOW_LOCAL_STATE=1."""
    merged = {**os.environ, **env_vars}
    backend = merged.get("PULUMI_BACKEND_URL") or ""
    if not _set(merged.get("CI")) or not backend.startswith("file://") or _set(merged.get(ALLOW_LOCAL_STATE)):
        return
    raise StackError(
        f"this is a CI run (CI is set) and the state would be kept in {backend} on this machine: a runner's "
        "disk goes with the runner, and with it the record of every server and the pinned host keys. Set "
        "PULUMI_BACKEND_URL to a shared backend (an s3:// bucket, or Pulumi Cloud; docs/ci.md#one-stack-per-"
        f"environment, in CI), or set {ALLOW_LOCAL_STATE}=1 on a runner that keeps its disk"
    )
