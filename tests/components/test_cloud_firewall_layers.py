"""The Hetzner cloud firewalls: the SSH-only one a new server carries from its first boot is
detached once the node's full firewall is attached, and every cloud firewall comes from the plan
the host firewalls come from (node_operations.firewall_plan), ICMP included.

What Hetzner's provider does (terraform-provider-hcloud, which pulumi-hcloud wraps):
- docs/resources/server.md: `firewall_ids` are the "Firewall IDs the server should be attached to
  on creation"; docs/resources/firewall_attachment.md ("Ensure a server is attached to a Firewall on
  first boot"): only `firewall_ids` attaches a firewall before the first boot, an
  `hcloud_firewall_attachment` attaches it after, and the server must then ignore the remote
  `firewall_ids` (here: `ignore_changes`), or the attachment's firewall would be taken off again.
  So the SSH-only firewall, given at creation and ignored after, stays attached for the server's
  whole life unless something takes it off: Hetzner lets in what any attached firewall allows,
  so SSH could never be narrowed by the full firewall.
- docs/resources/firewall_attachment.md: "only one hcloud_firewall_attachment per Firewall is
  allowed", and it must list at least one resource (internal/firewall/attachment_resource.go:
  "no resources referenced"), so the SSH-only firewall cannot be handed to an attachment that
  lists no server once every server has its full firewall. The program therefore takes each
  server off it through the Hetzner API (a BootstrapFirewallRelease), after the full attachment.

Hetzner cannot be reached from here: the engine and Hetzner are Pulumi mocks
(tests/components/mock_engine.py); what is tested is what the program asks for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_settings import load_settings
from components.program import build_cluster, read_credentials
from node_operations.firewall_plan import ICMP_RULE, bootstrap_rules, ssh_rule
from tests.components.mock_engine import Recording, fake_id, run_with_mocks

RELEASE = "hk3s:BootstrapFirewallRelease"


def _config(key_file: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "cluster": {"name": "shop", "k3s_version": "v1.36.1+k3s1"},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "workers": [{"name": "w1"}, {"name": "metal", "kind": "existing", "address": "192.0.2.250"}],
    }
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def _run(config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Recording:
    monkeypatch.setenv("HCLOUD_TOKEN", "test-hetzner-token")
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), stack="dev")


def _plain(value: Any) -> Any:
    return value["value"] if isinstance(value, dict) and "value" in value else value


def test_every_cloud_firewall_lets_in_the_plans_icmp(ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recording = _run(_config(ssh_key_file), monkeypatch)
    for name in ("shop-ssh-only", "shop-servers", "shop-workers"):
        icmp = [rule for rule in recording.by_name(name).inputs["rules"] if rule["protocol"] == "icmp"]
        assert len(icmp) == 1, name
        assert icmp[0]["direction"] == "in" and "port" not in icmp[0], icmp
        assert icmp[0]["sourceIps"] == list(ICMP_RULE.sources), icmp


def test_the_ssh_only_firewall_is_the_plans_bootstrap_rules(
    ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = _run(_config(ssh_key_file), monkeypatch)
    ports = [rule for rule in recording.by_name("shop-ssh-only").inputs["rules"] if rule["protocol"] != "icmp"]
    assert [(r["port"], r["protocol"], r["sourceIps"]) for r in ports] == [
        (rule.port, rule.protocol, list(rule.sources)) for rule in bootstrap_rules()
    ]
    # The full firewalls' SSH rule is the same rule: narrowing it in the plan narrows both.
    for name in ("shop-servers", "shop-workers"):
        ssh = [rule for rule in recording.by_name(name).inputs["rules"] if rule.get("port") == ssh_rule().port]
        assert [(r["protocol"], r["sourceIps"]) for r in ssh] == [(ssh_rule().protocol, list(ssh_rule().sources))]


def test_each_server_leaves_the_ssh_only_firewall_after_its_full_firewall_is_attached(
    ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = _run(_config(ssh_key_file), monkeypatch)
    releases = {r.inputs["node"]: r for r in recording.of_type(RELEASE)}
    assert sorted(releases) == ["srv", "w1"]  # the existing host has no Hetzner firewall
    attachments = {
        "server": recording.by_name("shop-servers-attachment"),
        "worker": recording.by_name("shop-workers-attachment"),
    }
    for node, role in (("srv", "server"), ("w1", "worker")):
        release = releases[node]
        # Only once the full firewall is attached: a server is never without a cloud firewall.
        assert attachments[role].urn in release.dependencies, node
        assert release.inputs["server_id"] == fake_id(node)
        assert release.inputs["bootstrap_firewall_id"] == fake_id("shop-ssh-only")
        assert release.inputs["full_firewall_id"] == fake_id(f"shop-{role}s")
        assert release.is_secret("hcloud_token") and _plain(release.inputs["hcloud_token"]) == "test-hetzner-token"
        # The server still carries the SSH-only firewall from creation, and never has it put back.
        (server,) = [s for s in recording.of_type("hcloud:index/server:Server") if s.name == node]
        assert server.inputs["firewallIds"] == [int(fake_id("shop-ssh-only"))]
        assert "firewallIds" in server.ignore_changes


def test_no_release_without_the_cloud_firewall(ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recording = _run(_config(ssh_key_file, firewall={"cloud_firewall": False}), monkeypatch)
    assert recording.of_type(RELEASE) == []
