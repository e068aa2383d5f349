"""Validated stack settings: the one place the stack's config is read and checked.

The names below are resolved on first use (PEP 562): building the pydantic models costs a fresh
process tens of milliseconds, and the provider processes that import one light module of this
package (a pattern, a constant) never need them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loading import SettingsError, load_settings, load_settings_from_pulumi
    from .models import (
        ClusterSettings,
        FenceSettings,
        FirewallSettings,
        HostSettings,
        NetworkSettings,
        ServerSettings,
        SshSettings,
        StackSettings,
        StorageSettings,
        WorkerSettings,
    )
    from .rules import SettingProblem

# Where each exported name lives.
_HOMES = {
    "SettingsError": "loading",
    "load_settings": "loading",
    "load_settings_from_pulumi": "loading",
    "ClusterSettings": "models",
    "FenceSettings": "models",
    "FirewallSettings": "models",
    "HostSettings": "models",
    "NetworkSettings": "models",
    "ServerSettings": "models",
    "SshSettings": "models",
    "StackSettings": "models",
    "StorageSettings": "models",
    "WorkerSettings": "models",
    "SettingProblem": "rules",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "ClusterSettings",
    "FenceSettings",
    "FirewallSettings",
    "HostSettings",
    "NetworkSettings",
    "ServerSettings",
    "SettingProblem",
    "SettingsError",
    "SshSettings",
    "StackSettings",
    "StorageSettings",
    "WorkerSettings",
    "load_settings",
    "load_settings_from_pulumi",
]
