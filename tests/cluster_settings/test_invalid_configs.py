"""Every invalid config fails before any machine is touched, with a message
that names the config key and says what to do."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings


def _base(key_file: Path) -> dict[str, Any]:
    return {
        "cluster": {"k3s_version": "v1.31.4+k3s1"},
        "ssh": {"private_key_file": str(key_file)},
        "workers": [
            {"name": "worker-1"},
            {"name": "metal-1", "kind": "existing", "address": "198.51.100.20"},
        ],
    }


def _set(config: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted path; `workers.1.name` indexes lists."""
    parts = path.split(".")
    target: Any = config
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
    last = parts[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


# (case id, changes as {dotted path: value}, expected key in the message, words the fix must contain)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "private-net-overlaps-pods",
        {"network.private_network_cidr": "10.42.0.0/16"},
        "hk3s:network.private_network_cidr",
        "overlaps",
    ),
    (
        "private-net-overlaps-services",
        {"network.private_network_cidr": "10.43.0.0/20", "network.private_subnet_cidr": "10.43.1.0/24"},
        "hk3s:network.private_network_cidr",
        "service cidr",
    ),
    (
        "explicit-private-net-overlaps-pods",
        {"network.private_network": "10.40.0.0/14"},
        "hk3s:network.private_network",
        "overlaps",
    ),
    ("pods-overlap-services", {"cluster.service_cidr": "10.42.128.0/17"}, "hk3s:cluster.service_cidr", "overlaps"),
    (
        "duplicate-worker-names",
        {"workers.1": {"name": "worker-1", "kind": "existing", "address": "198.51.100.21"}},
        "hk3s:workers[1].name",
        "unique",
    ),
    (
        "duplicate-addresses",
        {
            "workers": [
                {"name": "a", "kind": "existing", "address": "198.51.100.9"},
                {"name": "b", "kind": "existing", "address": "198.51.100.9"},
            ]
        },
        "hk3s:workers[1].address",
        "own address",
    ),
    (
        "duplicate-address-with-server",
        {"server": {"kind": "existing", "address": "198.51.100.20"}},
        "hk3s:workers[1].address",
        "already the address",
    ),
    ("name-uppercase", {"workers.0.name": "Worker-1"}, "hk3s:workers[0].name", "DNS-1123"),
    ("name-underscore", {"workers.0.name": "worker_1"}, "hk3s:workers[0].name", "DNS-1123"),
    ("name-too-long", {"workers.0.name": "w" * 64}, "hk3s:workers[0].name", "at most 63"),
    ("name-trailing-dash", {"workers.0.name": "worker-"}, "hk3s:workers[0].name", "DNS-1123"),
    ("server-name-invalid", {"server": {"name": "Server.1"}}, "hk3s:server.name", "DNS-1123"),
    ("worker-named-like-server", {"workers.0.name": "k3s-server"}, "hk3s:workers[0].name", "server's name"),
    ("k3s-version-no-suffix", {"cluster.k3s_version": "v1.31.4"}, "hk3s:cluster.k3s_version", "v1.36.1+k3s1"),
    ("k3s-version-no-v", {"cluster.k3s_version": "1.31.4+k3s1"}, "hk3s:cluster.k3s_version", "k3s tags it"),
    ("k3s-version-too-old", {"cluster.k3s_version": "v1.25.9+k3s1"}, "hk3s:cluster.k3s_version", "v1.30.0"),
    # 1.28-1.29 serve the join permit's ValidatingAdmissionPolicy only as beta, off by default.
    (
        "k3s-version-no-admission-policy",
        {"cluster.k3s_version": "v1.29.15+k3s1"},
        "hk3s:cluster.k3s_version",
        "ValidatingAdmissionPolicy",
    ),
    ("k3s-version-missing", {"cluster": {}}, "hk3s:cluster.k3s_version", "required"),
    ("copies-3", {"storage.max_copies": 3}, "hk3s:storage.max_copies", "set 1"),
    ("copies-0", {"storage.max_copies": 0}, "hk3s:storage.max_copies", "set 1"),
    (
        "fence-unknown-worker",
        {"fences": {"worker-9": {"powered_off": True}}},
        "hk3s:fences.worker-9",
        "no worker named",
    ),
    ("fence-the-server", {"fences": {"k3s-server": {}}}, "hk3s:fences.k3s-server", "only workers"),
    (
        "give-up-a-worker-still-listed",
        {"fences": {"worker-1": {"force_remove": True}}},
        "hk3s:fences.worker-1.force_remove",
        "a worker given up leaves the stack",
    ),
    (
        "fence-unknown-flag",
        {"fences": {"worker-1": {"powered_of": True}}},
        "hk3s:fences.worker-1.powered_of",
        "did you mean 'powered_off'",
    ),
    (
        "existing-host-without-address",
        {"workers.1": {"name": "metal-1", "kind": "existing"}},
        "hk3s:workers[1].address",
        "set its public IPv4",
    ),
    ("existing-host-ipv6", {"workers.1.address": "2001:db8::1"}, "hk3s:workers[1].address", "IPv6"),
    (
        "hcloud-server-of-a-created-server",
        {"workers.0.hcloud_server": 4711},
        "hk3s:workers[0].hcloud_server",
        "remove hcloud_server",
    ),
    (
        "hcloud-server-not-a-name",
        {"workers.1.hcloud_server": "no such/name"},
        "hk3s:workers[1].hcloud_server",
        "give the server's id",
    ),
    ("hcloud-server-id-zero", {"workers.1.hcloud_server": 0}, "hk3s:workers[1].hcloud_server", "its name"),
    (
        "hcloud-server-twice",
        {
            "workers.0": {"name": "metal-0", "kind": "existing", "address": "198.51.100.21", "hcloud_server": "m1"},
            "workers.1.hcloud_server": "m1",
        },
        "hk3s:workers[1].hcloud_server",
        "its own server",
    ),
    (
        "existing-host-hostname-as-address",
        {"workers.1.address": "metal.example.com"},
        "hk3s:workers[1].address",
        "not an IPv4 address",
    ),
    (
        "hetzner-worker-with-address",
        {"workers.0.address": "198.51.100.30"},
        "hk3s:workers[0].address",
        "kind: existing",
    ),
    ("existing-host-with-server-type", {"workers.1.server_type": "cx23"}, "hk3s:workers[1].server_type", "Remove it"),
    ("address-inside-pod-network", {"workers.1.address": "10.42.0.5"}, "hk3s:workers[1].address", "pod cidr"),
    (
        "ssh-key-missing",
        {"ssh.private_key_file": "/nonexistent/id_ed25519"},
        "hk3s:ssh.private_key_file",
        "does not exist",
    ),
    ("ssh-key-unset", {"ssh": {}}, "hk3s:ssh.private_key_file", "required"),
    (
        "ssh-host-key-unknown-node",
        {"ssh.host_keys": {"worker-7": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB"}},
        "hk3s:ssh.host_keys.worker-7",
        "neither the server nor a worker",
    ),
    ("ssh-host-key-garbage", {"ssh.host_keys": {"worker-1": "not a key"}}, "hk3s:ssh.host_keys", "OpenSSH public key"),
    ("location-unknown", {"cluster.location": "fra1"}, "hk3s:cluster.location", "fsn1"),
    ("worker-in-other-network-zone", {"workers.0.location": "ash"}, "hk3s:workers[0].location", "network zone"),
    ("pod-network-unknown", {"cluster.pod_network": "calico"}, "hk3s:cluster.pod_network", "wireguard"),
    ("network-mode-unknown", {"network.mode": "hybrid"}, "hk3s:network.mode", "auto"),
    ("cidr-host-bits", {"cluster.pod_cidr": "10.42.0.1/16"}, "hk3s:cluster.pod_cidr", "host bits"),
    (
        "subnet-outside-network",
        {"network.private_subnet_cidr": "10.1.0.0/24"},
        "hk3s:network.private_subnet_cidr",
        "subnet of it",
    ),
    (
        "public-mode-with-private-network",
        {"network.mode": "public", "network.private_network": "10.0.0.0/16"},
        "hk3s:network.private_network",
        "mode is public",
    ),
    (
        "private-address-outside-explicit-network",
        {"network.private_network": "10.0.0.0/16", "workers.1.private_address": "172.16.0.4"},
        "hk3s:workers[1].private_address",
        "outside",
    ),
    (
        "operator-access-not-cidr",
        {"firewall.operator_access": ["my office"]},
        "hk3s:firewall.operator_access[0]",
        "CIDR",
    ),
    (
        "no-firewall-acknowledgement-not-a-bool",
        {"firewall.none_acknowledged": "maybe"},
        "hk3s:firewall.none_acknowledged",
        "bool",
    ),
    (
        "label-reserved",
        {"workers.0.labels": {"node-role.kubernetes.io/worker": ""}},
        "hk3s:workers[0].labels",
        "set by the program",
    ),
    (
        "label-key-invalid",
        {"workers.0.labels": {"bad key!": "x"}},
        "hk3s:workers[0].labels",
        "not a valid Kubernetes label key",
    ),
    (
        "slow-disk-override-without-copies",
        {"workers.0.holds_copies": False, "workers.0.ignore_slow_disk": True},
        "hk3s:workers[0].ignore_slow_disk",
        "remove ignore_slow_disk",
    ),
    (
        "unknown-worker-setting",
        {"workers.0.adress": "198.51.100.3"},
        "hk3s:workers[0].adress",
        "did you mean 'address'",
    ),
    ("unknown-top-level-key", {"wokers": []}, "hk3s:wokers", "not a setting"),
    ("k3s-binary-without-checksum", {"cluster.k3s_binary": "/bin/true"}, "hk3s:cluster.k3s_sha256", "sha256sum"),
    (
        "k3s-binary-missing",
        {"cluster.k3s_binary": "/nonexistent/k3s", "cluster.k3s_sha256": "a" * 64},
        "hk3s:cluster.k3s_binary",
        "does not exist",
    ),
    (
        "longhorn-chart-missing",
        {"storage.longhorn_chart": "/nonexistent/longhorn"},
        "hk3s:storage.longhorn_chart",
        "not a Helm chart",
    ),
    (
        "longhorn-chart-without-longhorn",
        {"storage.install_longhorn": False, "storage.longhorn_chart": "/nonexistent/longhorn"},
        "hk3s:storage.longhorn_chart",
        "remove longhorn_chart",
    ),
    ("k3s-sha-malformed", {"cluster.k3s_sha256": "abc"}, "hk3s:cluster.k3s_sha256", "64 hex"),
    ("registry-malformed", {"cluster.registry": "https://registry:5000/"}, "hk3s:cluster.registry", "host[:port]"),
    ("api-wait-too-short", {"cluster.api_wait_seconds": 1}, "hk3s:cluster.api_wait_seconds", "set about 120"),
    ("api-wait-too-long", {"cluster.api_wait_seconds": 86400}, "hk3s:cluster.api_wait_seconds", "outside 5-3600 s"),
    (
        "validation-image-malformed",
        {"cluster.validation_image": "Busybox latest"},
        "hk3s:cluster.validation_image",
        "registry/name:tag",
    ),
    ("ssh-port-out-of-range", {"workers.1.ssh_port": 70000}, "hk3s:workers[1].ssh_port", "65535"),
    (
        "disk-sync-threshold-zero",
        {"storage.disk_sync_p99_ms": 0},
        "hk3s:storage.disk_sync_p99_ms",
        "keep the default 10",
    ),
    (
        "disk-sync-threshold-over-a-second",
        {"storage.disk_sync_p99_ms": 5000},
        "hk3s:storage.disk_sync_p99_ms",
        "outside 0.5-1000 ms",
    ),
    (
        "disk-sync-threshold-not-a-number",
        {"storage.disk_sync_p99_ms": "fast"},
        "hk3s:storage.disk_sync_p99_ms",
        "number",
    ),
    ("too-many-hetzner-servers", {"workers": [{"name": f"w{i}"} for i in range(100)]}, "hk3s:workers", "at most 100"),
    (
        "control-plane-lost-without-the-teardown",
        {"cluster.control_plane_lost": True},
        "hk3s:cluster.control_plane_lost",
        "set hk3s:cluster.teardown: allowed too",
    ),
    (
        "vxlan-in-public-mode",
        {"cluster.pod_network": "vxlan", "network.mode": "public"},
        "hk3s:cluster.pod_network",
        "wireguard",
    ),
]


@pytest.mark.parametrize(("changes", "key", "fix"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_invalid_config_names_key_and_fix(ssh_key_file: Path, changes: dict[str, Any], key: str, fix: str) -> None:
    config = _base(ssh_key_file)
    for path, value in changes.items():
        _set(config, path, copy.deepcopy(value))
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    matching = [problem for problem in caught.value.problems if problem.key == key]
    assert matching, f"no problem names {key}; got: {caught.value}"
    assert any(fix.lower() in problem.message.lower() for problem in matching), str(caught.value)
    assert key in str(caught.value)


def test_there_are_at_least_thirty_cases() -> None:
    assert len({case[0] for case in CASES}) == len(CASES) >= 30


def test_the_base_config_is_valid(ssh_key_file: Path) -> None:
    settings = load_settings(_base(ssh_key_file))
    assert [w.name for w in settings.workers] == ["worker-1", "metal-1"]


def test_disk_sync_threshold_defaults_to_etcds_10_ms_and_takes_another(ssh_key_file: Path) -> None:
    assert load_settings(_base(ssh_key_file)).storage.disk_sync_p99_ms == 10.0
    config = _base(ssh_key_file)
    config["storage"] = {"disk_sync_p99_ms": 25}
    assert load_settings(config).storage.disk_sync_p99_ms == 25.0


def test_an_existing_host_names_its_hetzner_server_by_id_or_name(ssh_key_file: Path) -> None:
    config = _base(ssh_key_file)
    config["workers"][1]["hcloud_server"] = 4711
    config["workers"].append({"name": "metal-2", "kind": "existing", "address": "198.51.100.21"})
    config["workers"][2]["hcloud_server"] = "metal-2.example"
    workers = load_settings(config).all_workers()
    assert [w.hcloud_server for w in workers] == [None, "4711", "metal-2.example"]


def test_every_problem_is_reported_at_once(ssh_key_file: Path) -> None:
    config = _base(ssh_key_file)
    config["workers"].append({"name": "worker-1"})
    config["fences"] = {"ghost": {}}
    config["network"] = {"private_network_cidr": "10.42.0.0/16", "private_subnet_cidr": "10.42.1.0/24"}
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    keys = {problem.key for problem in caught.value.problems}
    assert {"hk3s:workers[2].name", "hk3s:fences.ghost", "hk3s:network.private_network_cidr"} <= keys


def _chart(folder: Path, name: str, version: str) -> Path:
    chart = folder / name
    chart.mkdir()
    (chart / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: {version}\n")
    return chart


@pytest.mark.parametrize("packaged", [False, True], ids=["folder", "tgz"])
def test_longhorn_chart_must_be_longhorn_at_the_pinned_version(
    ssh_key_file: Path, tmp_path: Path, packaged: bool
) -> None:
    """A local chart (folder or packaged) is accepted when it is Longhorn at storage.longhorn_version;
    another chart or another version is refused naming both."""
    import tarfile  # noqa: PLC0415

    def located(chart: Path) -> str:
        if not packaged:
            return str(chart)
        archive = chart.with_suffix(".tgz")
        with tarfile.open(archive, "w:gz") as tgz:
            tgz.add(chart, arcname=chart.name)
        return str(archive)

    good = located(_chart(tmp_path, "longhorn", "1.9.1"))
    config = _base(ssh_key_file)
    _set(config, "storage.longhorn_chart", good)
    assert str(load_settings(config).storage.longhorn_chart) == good
    _set(config, "storage.longhorn_version", "1.8.2")
    with pytest.raises(SettingsError, match=r"holds chart longhorn 1\.9\.1, not longhorn 1\.8\.2"):
        load_settings(config)
    other = located(_chart(tmp_path, "nginx", "1.9.1"))
    config = _base(ssh_key_file)
    _set(config, "storage.longhorn_chart", other)
    with pytest.raises(SettingsError, match=r"hk3s:storage\.longhorn_chart: .* holds chart nginx 1\.9\.1"):
        load_settings(config)


def test_vxlan_is_refused_in_public_mode_naming_the_setting_and_both_fixes(ssh_key_file: Path) -> None:
    """vxlan carries pod traffic unencrypted (8472/udp, guarded only by a spoofable source address)
    into flannel.1, which every firewall backend trusts: over public addresses that is the internet.
    Refused before any machine is touched; wireguard, or a private network, is the fix."""
    config = _base(ssh_key_file)
    config["cluster"]["pod_network"] = "vxlan"
    config["network"] = {"mode": "public"}
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    (problem,) = [p for p in caught.value.problems if p.key == "hk3s:cluster.pod_network"]
    assert "unencrypted" in problem.message and "public" in problem.message
    assert "pod_network: wireguard" in problem.message and "hk3s:network.mode: private" in problem.message
    # The fixes it names are accepted.
    for key, value in (("cluster", {"pod_network": "wireguard"}), ("network", {"mode": "private"})):
        fixed = copy.deepcopy(config)
        fixed[key] = {**fixed[key], **value}
        load_settings(fixed)


def test_vxlan_over_public_addresses_needs_an_explicit_acknowledgement(ssh_key_file: Path) -> None:
    """A network whose "public" addresses are no internet (the lab's bridge, whose kernel has no
    WireGuard module) may say so explicitly; nothing else lets vxlan run in public mode."""
    config = _base(ssh_key_file)
    config["cluster"].update(pod_network="vxlan", vxlan_over_public_addresses="allowed")
    config["network"] = {"mode": "public"}
    assert load_settings(config).cluster.pod_network == "vxlan"
    config["cluster"]["vxlan_over_public_addresses"] = "refused"
    with pytest.raises(SettingsError):
        load_settings(config)
