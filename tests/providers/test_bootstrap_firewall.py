"""BootstrapFirewallRelease's provider against the lab's Hetzner API stand-in (a real HTTP server,
Hetzner's own `hcloud` library in between): a server leaves the SSH-only firewall only once its
full firewall is applied to it (Hetzner lets in what any attached firewall allows, so the
SSH-only one left on would keep SSH open whatever the plan says; taken off before the full one
is on, the server would have no cloud firewall at all)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lab.hcloud_standin import HcloudStandin, SwitchedMachine, running_standin
from providers.bootstrap_firewall import BootstrapFirewallReleaseProvider, NoHetznerTokenError
from remote_access.hetzner_api import HetznerApiError

_Machine = SwitchedMachine


@pytest.fixture
def standin() -> Iterator[HcloudStandin]:
    with running_standin() as running:
        yield running


def _props(standin: HcloudStandin, server: int, bootstrap: int, full: int) -> dict[str, Any]:
    return {
        "node": "w1",
        "server_id": str(server),
        "bootstrap_firewall_id": str(bootstrap),
        "full_firewall_id": str(full),
        "hcloud_token": standin.token,
        "hcloud_endpoint": standin.url,
    }


def test_the_server_leaves_the_ssh_only_firewall_once_its_full_one_is_on(standin: HcloudStandin) -> None:
    server = standin.add_server("shop-dev-w1", _Machine(), public_ipv4="192.0.2.7")
    bootstrap = standin.add_firewall("shop-dev-ssh-only", (server,))
    full = standin.add_firewall("shop-dev-workers", (server,))
    created = BootstrapFirewallReleaseProvider().create(_props(standin, server, bootstrap, full))
    assert standin.firewalls[bootstrap].applied == set()
    assert standin.firewalls[full].applied == {server}
    assert created.outs is not None and created.outs["released"] is True
    # Again (a later run, an update): nothing left to take off, and no error.
    again = BootstrapFirewallReleaseProvider().update("x", {}, _props(standin, server, bootstrap, full))
    assert again.outs is not None and again.outs["released"] is False


def test_the_release_runs_again_after_a_token_rotation_and_a_cluster_rename(standin: HcloudStandin) -> None:
    """A rotated hcloud:token or a renamed cluster changes the release's inputs, so the next `up`
    updates it and it asks Hetzner again to take the server off the SSH-only firewall it already
    left. Hetzner answers that call 404 `firewall_resource_not_found` (the API reference's error
    table of "Remove from Resources"; terraform-provider-hcloud's removeFromResources in
    internal/firewall/resource.go reads it as "nothing left to remove"): the update must succeed,
    take nothing else off and leave the full firewall on."""
    server = standin.add_server("shop-dev-w1", _Machine(), public_ipv4="192.0.2.7")
    bootstrap = standin.add_firewall("shop-dev-ssh-only", (server,))
    full = standin.add_firewall("shop-dev-workers", (server,))
    first = _props(standin, server, bootstrap, full)
    created = BootstrapFirewallReleaseProvider().create(first)
    assert created.outs is not None and created.outs["released"] is True
    standin.token = "rotated-" + standin.token  # the old token is revoked with the rotation
    news = {**_props(standin, server, bootstrap, full), "node": "shop2-w1"}
    assert BootstrapFirewallReleaseProvider().diff("x", first, news).changes
    again = BootstrapFirewallReleaseProvider().update("x", first, news)
    assert again.outs is not None and again.outs["released"] is False
    assert standin.firewalls[bootstrap].applied == set()
    assert standin.firewalls[full].applied == {server}


def test_a_server_not_yet_in_its_full_firewall_keeps_the_ssh_only_one(standin: HcloudStandin) -> None:
    server = standin.add_server("shop-dev-w2", _Machine(), public_ipv4="192.0.2.8")
    bootstrap = standin.add_firewall("shop-dev-ssh-only", (server,))
    full = standin.add_firewall("shop-dev-workers")
    with pytest.raises(HetznerApiError, match=r"not in its full cloud firewall shop-dev-workers .* run up again"):
        BootstrapFirewallReleaseProvider().create(_props(standin, server, bootstrap, full))
    assert standin.firewalls[bootstrap].applied == {server}
    assert not any(path.endswith("remove_from_resources") for _, path in standin.requests)


def test_no_token_is_refused_naming_the_setting(standin: HcloudStandin) -> None:
    props = {**_props(standin, 1, 2, 3), "hcloud_token": None}
    with pytest.raises(NoHetznerTokenError, match=r"pulumi config set --secret hcloud:token"):
        BootstrapFirewallReleaseProvider().create(props)


def test_another_server_replaces_the_release_and_other_firewalls_update_it() -> None:
    provider = BootstrapFirewallReleaseProvider()
    olds = {"node": "w1", "server_id": "1", "bootstrap_firewall_id": "2", "full_firewall_id": "3"}
    assert provider.diff("x", olds, dict(olds)).changes is False
    replaced = provider.diff("x", olds, {**olds, "server_id": "9"})
    assert replaced.changes and replaced.replaces == ["server_id"]
    updated = provider.diff("x", olds, {**olds, "full_firewall_id": "8"})
    assert updated.changes and not updated.replaces
