"""Which k3s version changes the server's provider refuses before anything runs (its `check`,
which the engine calls at preview): a downgrade, and an upgrade past the next minor release.
The provider's own code, no host involved (the check reads only the settings)."""

from __future__ import annotations

import pytest

from providers.k3s_server import K3sServerProvider

RUNNING = {"node": "srv", "k3s_version": "v1.35.2+k3s1"}


def _failures(new_version: str) -> list[str]:
    result = K3sServerProvider().check(dict(RUNNING), {**RUNNING, "k3s_version": new_version})
    return [f"{failure.property}: {failure.reason}" for failure in result.failures or []]


@pytest.mark.parametrize("version", ["v1.35.2+k3s1", "v1.35.2+k3s2", "v1.35.9+k3s1", "v1.36.0+k3s1", "v1.36.4+k3s1"])
def test_a_patch_or_the_next_minor_is_accepted(version: str) -> None:
    assert not [f for f in _failures(version) if f.startswith("k3s_version")]


@pytest.mark.parametrize("version", ["v1.35.1+k3s1", "v1.34.9+k3s1", "v1.35.2+k3s0"])
def test_a_downgrade_is_refused_naming_the_setting(version: str) -> None:
    (failure,) = [f for f in _failures(version) if f.startswith("k3s_version")]
    assert f"hk3s:cluster.k3s_version {version} is older than the running v1.35.2+k3s1" in failure
    assert "Set it back to v1.35.2+k3s1 or later" in failure


@pytest.mark.parametrize("version", ["v1.37.0+k3s1", "v1.38.1+k3s1", "v2.0.0+k3s1"])
def test_skipping_a_minor_release_is_refused_naming_the_next_step(version: str) -> None:
    (failure,) = [f for f in _failures(version) if f.startswith("k3s_version")]
    assert f"{version} skips minor releases from the running v1.35.2+k3s1" in failure
    assert "Set it to the latest v1.36 release (e.g. v1.36.0+k3s1), run up" in failure


def test_who_runs_the_servers_firewall_never_changes_a_running_server() -> None:
    """Checked at the server's first install only: a state written before the inputs existed,
    or a later change of them, plans no update (an update reinstalls k3s on the server)."""
    provider = K3sServerProvider()
    assert not provider.diff("srv-k3s", dict(RUNNING), {**RUNNING, "firewall_managed": False}).changes
    acknowledged = {**RUNNING, "firewall_managed": False, "no_firewall_acknowledged": True}
    assert not provider.diff("srv-k3s", {**RUNNING, "firewall_managed": True}, acknowledged).changes
    assert provider.diff("srv-k3s", dict(RUNNING), {**RUNNING, "k3s_version": "v1.35.3+k3s1"}).changes
