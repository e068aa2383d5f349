"""What every Pulumi command the operator API runs is given: its environment, the Pulumi
CLI it runs, and the passphrase that encrypts the stack's secrets."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from pulumi import automation as auto

from .errors import StackError


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
    if not env.get("PULUMI_BACKEND_URL"):
        env["PULUMI_BACKEND_URL"] = os.environ.get("PULUMI_BACKEND_URL") or (Path.home() / ".hk3s-state").as_uri()
    path = env.get("PATH") or os.environ.get("PATH", "")
    if root is not None:
        path = f"{Path(root) / 'bin'}{os.pathsep}{path}"
    env["PATH"] = path
    return env


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


def check_passphrase(env_vars: Mapping[str, str]) -> None:
    """Refuse to start without the passphrase that encrypts the stack's secrets."""
    merged = {**os.environ, **env_vars}
    if not merged.get("PULUMI_CONFIG_PASSPHRASE") and not merged.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        raise StackError(
            "PULUMI_CONFIG_PASSPHRASE is not set: choose a passphrase that encrypts this stack's secrets, "
            "export it (or PULUMI_CONFIG_PASSPHRASE_FILE) and run again"
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
