"""The settings of key rotation, the Hetzner key and protection: defaults and the rules that
need no machine, each problem naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings


def _config(key_file: Path, **ssh: Any) -> dict[str, Any]:
    return {
        "cluster": {"k3s_version": "v1.31.4+k3s1", "server_type": "cx23"},
        "server": {"name": "srv", "kind": "existing", "address": "198.51.100.5"},
        "ssh": {"private_key_file": str(key_file), **ssh},
    }


def test_control_plane_protected_by_default(ssh_key_file: Path) -> None:
    settings = load_settings(_config(ssh_key_file))
    assert settings.cluster.protect_control_plane is True
    assert settings.ssh.previous_private_key_file is None and settings.ssh.hetzner_key is None


def test_a_missing_previous_key_file_is_named(ssh_key_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_config(ssh_key_file, previous_private_key_file=str(tmp_path / "gone")))
    assert "hk3s:ssh.previous_private_key_file" in str(raised.value)


def test_hetzner_key_without_hetzner_servers_is_refused(ssh_key_file: Path) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_config(ssh_key_file, hetzner_key="deploy"))
    assert "hk3s:ssh.hetzner_key" in str(raised.value)
