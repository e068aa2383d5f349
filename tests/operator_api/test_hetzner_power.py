"""Which fenced worker `unfence` powers on through the Hetzner API, and where the token comes
from (operator_api/hetzner_power.py). The power-on itself runs against the lab's Hetzner API
stand-in in tests/lab/test_fence_hcloud.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_settings import load_settings
from cluster_settings.models import StackSettings
from components.hetzner_project import hetzner_name
from operator_api.errors import StackError
from operator_api.hetzner_power import fenced_hetzner_server, hetzner_access


def _settings(key_file: Path, fences: dict[str, dict[str, bool]]) -> StackSettings:
    return load_settings(
        {
            "cluster": {"k3s_version": "v1.31.4+k3s1"},
            "ssh": {"private_key_file": str(key_file)},
            "workers": [
                {"name": "worker-1"},
                {"name": "metal-1", "kind": "existing", "address": "198.51.100.20", "hcloud_server": "metal-one"},
                {"name": "metal-2", "kind": "existing", "address": "198.51.100.21"},
            ],
            "fences": fences,
        }
    )


def test_the_server_of_a_fenced_hetzner_worker_is_named_as_the_program_names_it(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("key")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA test")
    fenced = _settings(key, {"worker-1": {}, "metal-1": {}, "metal-2": {"powered_off": True}})
    cluster = fenced.cluster.name
    assert fenced_hetzner_server(fenced, "prod", "worker-1") == hetzner_name(cluster, "prod", "worker-1")
    assert fenced_hetzner_server(fenced, "prod", "metal-1") == "metal-one"
    # An existing host with no Hetzner server: nothing to power on (the operator does).
    assert fenced_hetzner_server(fenced, "prod", "metal-2") is None
    # Not fenced: nothing to power on.
    assert fenced_hetzner_server(_settings(key, {}), "prod", "worker-1") is None


def test_the_token_comes_from_the_stack_then_the_environment_and_its_absence_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HCLOUD_TOKEN", raising=False)
    monkeypatch.delenv("HCLOUD_ENDPOINT", raising=False)
    values = {"hcloud:token": "from-stack", "hcloud:endpoint": "http://127.0.0.1:1/v1"}

    def stack(key: str) -> str | None:
        return values.get(key)

    def empty(_key: str) -> str | None:
        return None

    access = hetzner_access(stack, {})
    assert (access.token, access.endpoint) == ("from-stack", "http://127.0.0.1:1/v1")
    access = hetzner_access(empty, {"HCLOUD_TOKEN": "from-env"})
    assert access.token == "from-env" and access.endpoint.startswith("https://api.hetzner.cloud")
    with pytest.raises(StackError, match=r"no token: pulumi config set --secret hcloud:token"):
        hetzner_access(empty, {})
    assert "from-stack" not in repr(hetzner_access(stack, {}))
