"""Validated stack settings: the one place the stack's config is read and checked."""

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
