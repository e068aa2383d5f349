"""Bash scripts that run on hosts, one file each; `script_path` finds them."""

from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().parent


def script_path(name: str) -> Path:
    """Path of a host script shipped with the program."""
    path = SCRIPTS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"host script {name} is missing from {SCRIPTS_DIR}")
    return path
