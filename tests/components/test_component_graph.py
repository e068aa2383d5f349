"""The component graph under Pulumi mocks (the engine and Hetzner Cloud are
mocked: Hetzner cannot be reached from the test machine). Asserts which
resources exist, their parents and dependencies, the firewall ports and
sources, and that secrets stay secret on the wire."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_settings import SettingsError, load_settings
from components.program import build_cluster, read_credentials
from remote_access.api_forward import forward_port
from tests.components.mock_engine import Recording, fake_id, fake_ipv4, run_with_mocks

OPERATOR_NET = "192.0.2.0/24"
METAL_ADDRESS = "198.51.100.250"


def _config(key_file: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "cluster": {"name": "t", "k3s_version": "v1.31.4+k3s1"},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "firewall": {"operator_access": [OPERATOR_NET]},
        "network": {"mode": "private"},
        "storage": {"max_copies": 2},
        "workers": [
            {"name": "w1"},
            {"name": "w2", "holds_copies": False},
            {"name": "metal", "kind": "existing", "address": METAL_ADDRESS},
        ],
        "fences": {"w1": {"powered_off": True}},
    }
    config.update(overrides)
    return config


def _run(config: dict[str, Any]) -> Recording:
    settings = load_settings(config)
    return run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)))


@pytest.fixture(autouse=True)
def hetzner_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The Hetzner token the fence of a Hetzner worker needs (read as the Hetzner provider reads
    it: hcloud:token, else HCLOUD_TOKEN)."""
    monkeypatch.setenv("HCLOUD_TOKEN", "test-hetzner-token")
    monkeypatch.delenv("HCLOUD_ENDPOINT", raising=False)
    return "test-hetzner-token"


@pytest.fixture
def graph(ssh_key_file: Path) -> Recording:
    return _run(_config(ssh_key_file))


def _rules(reg_inputs: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    rules: dict[tuple[str, str], set[str]] = {}
    for rule in reg_inputs["rules"]:
        sources = rule.get("sourceIps", rule.get("sources"))
        # An ICMP rule has no port.
        rules[(rule.get("port", ""), rule["protocol"])] = set(sources)
    return rules


def test_resources_and_parents(graph: Recording) -> None:
    components = {r.name: r for r in graph.registrations if r.type.startswith("hk3s:index:")}
    assert {(r.type.split(":")[-1], name) for name, r in components.items()} == {
        ("PrivateNetwork", "private-network"),
        ("ClusterServer", "srv"),
        ("WorkerNode", "w1"),
        ("WorkerNode", "w2"),
        ("WorkerNode", "metal"),
        ("FirewallRules", "firewall"),
        ("StorageCopies", "storage"),
    }
    parent_of = {r.name: r.parent for r in graph.registrations}
    # Machines: Hetzner servers for srv, w1, w2; none for the existing host.
    servers = sorted(r.name for r in graph.of_type("hcloud:index/server:Server"))
    assert servers == ["srv", "w1", "w2"]
    for reg in graph.of_type("hcloud:index/server:Server"):
        component = next(r for r in graph.registrations if r.type.startswith("hk3s:index:") and r.name == reg.name)
        assert reg.parent == component.urn
    assert graph.by_name("cluster-ssh-key").parent.endswith("ClusterServer::srv")
    for name in ("private-network-network", "private-network-subnet", "srv-private", "w1-private", "w2-private"):
        assert graph.by_name(name).parent.endswith("PrivateNetwork::private-network"), name
    assert "metal-private" not in parent_of
    for name in ("w1-join", "w1-disk", "w1-fence", "w1-probe", "w1-to-server-api", "w1-from-server-ssh"):
        assert graph.by_name(name).parent.endswith("WorkerNode::w1"), name
    # w2 holds no copies: no disk probe; only w1 is fenced.
    assert "w2-disk" not in parent_of and "metal-fence" not in parent_of and "w2-fence" not in parent_of
    assert "metal-disk" in parent_of
    assert graph.by_name("srv-k3s").parent.endswith("ClusterServer::srv")
    for name in ("srv-firewall", "w1-firewall", "w2-firewall", "metal-firewall", "t-servers", "t-workers"):
        assert graph.by_name(name).parent.endswith("FirewallRules::firewall"), name
    assert graph.by_name("storage-longhorn").parent.endswith("StorageCopies::storage")


def test_dependencies_order_the_join(graph: Recording) -> None:
    join = graph.by_name("w1-join")
    deps = set(join.dependencies)
    for name in (
        "srv-k3s",
        "w1-probe",
        "w1-firewall",
        "w1-to-server-api",
        "w1-from-server-ssh",
    ):
        assert graph.urn_of(name) in deps, name
    # Every firewall, through one barrier (components.barrier); the worker's own directly, so that
    # when it leaves the stack its join's delete comes before its firewall's.
    for name in ("srv-firewall", "metal-firewall", "t-workers-attachment"):
        assert graph.urn_of(name) in graph.dependencies_of("w1-join"), name
    # The fence never waits on the worker's own join (a dead worker's pending change would fail the
    # join first): the join comes after the fence and finds its record.
    assert graph.urn_of("w1-fence") in deps
    assert graph.urn_of("w1-join") not in set(graph.by_name("w1-fence").dependencies)
    assert graph.urn_of("srv-k3s") in set(graph.by_name("w1-fence").dependencies)
    assert graph.urn_of("w1-join") in set(graph.by_name("w1-disk").dependencies)
    # The server's k3s waits for the firewalls, never for a worker's join.
    k3s_deps = set(graph.by_name("srv-k3s").dependencies)
    assert graph.urn_of("srv-firewall") in k3s_deps
    assert graph.urn_of("w1-join") not in k3s_deps
    # Storage talks to the cluster through a provider that waits for k3s.
    assert graph.urn_of("srv-k3s") in set(graph.by_name("storage-kubernetes").dependencies)


def test_the_workers_upgrade_in_order_after_the_server_and_before_any_join(graph: Recording) -> None:
    """One K3sUpgrade after the server's k3s moves the joined workers in the stack's order; every
    join takes its k3s version from it (so it comes after), and it waits for no join."""
    upgrade = graph.by_name("k3s-upgrade")
    assert upgrade.parent.endswith("ClusterServer::srv")
    assert [worker["node"] for worker in upgrade.inputs["workers"]] == ["w1", "w2", "metal"]
    assert upgrade.inputs["target_version"] == "v1.31.4+k3s1"
    assert upgrade.inputs["drain_on_minor_upgrade"] is True
    assert upgrade.inputs["fenced"] == ["w1"]  # left alone by an upgrade, and listed
    assert graph.urn_of("srv-k3s") in set(upgrade.dependencies)
    assert not {graph.urn_of(f"{name}-join") for name in ("w1", "w2", "metal")} & set(upgrade.dependencies)
    for name in ("w1", "w2", "metal"):
        join = graph.by_name(f"{name}-join")
        assert graph.urn_of("k3s-upgrade") in set(join.dependencies), name
        assert join.inputs["k3s_version"] == "v1.31.4+k3s1"


def test_cloud_firewall_ports_and_sources(graph: Recording) -> None:
    public = {name: f"{fake_ipv4(name)}/32" for name in ("srv", "w1", "w2")}
    public["metal"] = f"{METAL_ADDRESS}/32"
    everyone = set(public.values())
    workers = everyone - {public["srv"]}
    server_rules = _rules(graph.by_name("t-servers").inputs)
    assert server_rules == {
        ("22", "tcp"): {"0.0.0.0/0"},
        ("6443", "tcp"): workers | {OPERATOR_NET},
        ("51820", "udp"): workers,
        ("10250", "tcp"): workers,
        ("", "icmp"): {"0.0.0.0/0", "::/0"},  # the plan's ICMP, as the host firewalls let it in
    }
    worker_rules = _rules(graph.by_name("t-workers").inputs)
    assert worker_rules == {
        ("22", "tcp"): {"0.0.0.0/0"},
        ("51820", "udp"): everyone,
        ("10250", "tcp"): everyone,
        ("9100", "tcp"): {public["srv"]},
        ("", "icmp"): {"0.0.0.0/0", "::/0"},
    }
    attached = graph.by_name("t-workers-attachment").inputs["serverIds"]
    assert sorted(attached) == sorted([int(fake_id("w1")), int(fake_id("w2"))])
    assert graph.by_name("t-servers-attachment").inputs["serverIds"] == [int(fake_id("srv"))]


def test_host_firewall_rules_exclude_self_and_keep_8888_closed(graph: Recording) -> None:
    # Private mode: host firewalls admit the peers' private addresses.
    rules = _rules(graph.by_name("w2-firewall").inputs)
    own = f"{fake_ipv4('w2-private', '10.0.1')}/32"
    assert all(own not in sources for port, sources in rules.items() if port[0] != "22")
    assert ("8888", "tcp") not in rules
    assert not any(port.startswith("30000") for port, _ in rules)
    assert rules[("9100", "tcp")] == {f"{fake_ipv4('srv-private', '10.0.1')}/32"}
    # The existing host has no private address: its public one stands in.
    assert f"{METAL_ADDRESS}/32" in rules[("10250", "tcp")]


def test_auto_mode_checks_connections_in_the_mode_the_plan_decides(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file, network={"mode": "auto"}))
    plan = graph.by_name("network-plan")
    assert plan.parent.endswith("ClusterServer::srv")
    assert plan.inputs["mode_setting"] == "auto"
    assert {w["node"] for w in plan.inputs["workers"]} == {"w1", "w2", "metal"}
    # The decision reads every probe's addresses and routes.
    for name in ("srv-probe", "w1-probe", "w2-probe", "metal-probe"):
        assert graph.urn_of(name) in set(plan.dependencies), name
    checks = {r.name: r for r in graph.of_type("hk3s:ConnectivityCheck")}
    assert set(checks) == {f"{w}-{leg}" for w in ("w1", "w2", "metal") for leg in ("from-server-ssh", "to-server-api")}
    # The mocked plan decides public for auto: the checks carry that and record "not needed".
    assert {check.inputs["network_mode"] for check in checks.values()} == {"public"}
    assert checks["w1-from-server-ssh"].inputs["node"] == "srv"
    assert checks["w1-to-server-api"].inputs["target_port"] == 6443
    # The server's k3s, the firewalls and the join use the plan's addresses.
    for name in ("srv-k3s", "w1-join", "w1-to-server-api"):
        assert graph.urn_of("network-plan") in set(graph.by_name(name).dependencies), name
    join = graph.by_name("w1-join")
    assert join.inputs["node_ip"] == fake_ipv4("w1") and join.inputs["network_mode"] == "public"
    assert join.inputs["server_url"] == f"https://{fake_ipv4('srv')}:6443"


def test_vxlan_and_nodeports_change_the_plan(ssh_key_file: Path) -> None:
    config = _config(
        ssh_key_file,
        cluster={"name": "t", "k3s_version": "v1.31.4+k3s1", "pod_network": "vxlan"},
        firewall={"nodeports_open": True},
    )
    rules = _rules(_run(config).by_name("t-workers").inputs)
    assert ("8472", "udp") in rules and ("51820", "udp") not in rules
    assert rules[("30000-32767", "tcp")] == {"0.0.0.0/0"}


def test_unmanaged_firewall_has_no_host_firewall(ssh_key_file: Path) -> None:
    config = _config(ssh_key_file, firewall={"managed": False})
    config["workers"][0]["firewall"] = True
    names = {r.name for r in _run(config).of_type("hk3s:HostFirewall")}
    assert names == {"w1-firewall"}


def test_every_host_firewall_closes_the_cluster_networks_to_non_nodes(ssh_key_file: Path) -> None:
    """Component wiring under Pulumi's mocks: each host firewall gets the stack's pod and Service
    networks and every node's cluster address (private mode: the private ones, the existing host's
    public one standing in), the sources that may send to those networks from outside the fabric."""
    config = _config(ssh_key_file)
    config["cluster"] = {**config["cluster"], "pod_cidr": "10.60.0.0/16", "service_cidr": "10.61.0.0/16"}
    firewalls = {r.name: r.inputs for r in _run(config).of_type("hk3s:HostFirewall")}
    nodes = sorted([*(fake_ipv4(f"{name}-private", "10.0.1") for name in ("srv", "w1", "w2")), METAL_ADDRESS])
    for name, inputs in firewalls.items():
        assert inputs["cluster_networks"] == ["10.60.0.0/16", "10.61.0.0/16"], name
        assert inputs["node_addresses"] == nodes, name


def test_the_no_firewall_acknowledgement_reaches_the_joins(ssh_key_file: Path) -> None:
    """Component wiring under Pulumi's mocks: hk3s:firewall.none_acknowledged reaches every join
    and the server's k3s (read there only where the operator runs the firewall); unset, false."""
    assert _run(_config(ssh_key_file)).by_name("w1-join").inputs["no_firewall_acknowledged"] is False
    config = _config(ssh_key_file, firewall={"managed": False, "none_acknowledged": True})
    graph = _run(config)
    join = graph.by_name("w1-join").inputs
    assert join["no_firewall_acknowledged"] is True and join["operator_firewall_rules"]
    server = graph.by_name("srv-k3s").inputs
    assert server["firewall_managed"] is False and server["no_firewall_acknowledged"] is True


def test_the_metadata_service_is_blocked_on_hetzner_servers_only(ssh_key_file: Path) -> None:
    """Component wiring under Pulumi's mocks: a server the program creates at Hetzner, and an
    existing worker named as a Hetzner server (hcloud_server), have pods' traffic to the metadata
    service dropped; any other existing host, whose provider the program does not know, not."""
    config = _config(ssh_key_file)
    config["workers"].append({"name": "metal-h", "kind": "existing", "address": "198.51.100.77", "hcloud_server": "7"})
    firewalls = {r.name: r.inputs for r in _run(config).of_type("hk3s:HostFirewall")}
    blocked = {name: inputs.get("block_metadata") for name, inputs in firewalls.items()}
    assert blocked == {
        "srv-firewall": True,
        "w1-firewall": True,
        "w2-firewall": True,
        "metal-firewall": False,
        "metal-h-firewall": True,
    }


def test_secrets_stay_secret(graph: Recording) -> None:
    # NetworkRanges records two CIDRs, WorkerRoster the workers' names and TeardownGuard one
    # flag: they log in nowhere. BootstrapFirewallRelease and ProjectSshKey call the Hetzner API
    # only, with the token, a secret.
    keyless = (
        "NetworkRanges",
        "WorkerRoster",
        "TeardownGuard",
        "BootstrapFirewallRelease",
        "ProjectSshKey",
        "StackIdentity",
    )
    dynamic = [
        r for r in graph.registrations if "pulumi-python:dynamic" in r.type and not any(k in r.type for k in keyless)
    ]
    assert len(dynamic) >= 12
    for reg in dynamic:
        assert reg.is_secret("private_key"), f"{reg.name}: private_key is not secret"
        assert reg.is_secret("__provider"), f"{reg.name}: serialized provider is not secret"
    assert graph.of_type("hk3s:ProjectSshKey")
    assert graph.of_type("hk3s:TeardownGuard")
    for reg in [
        *graph.of_type("hk3s:BootstrapFirewallRelease"),
        *graph.of_type("hk3s:ProjectSshKey"),
        *graph.of_type("hk3s:TeardownGuard"),
    ]:
        assert reg.is_secret("hcloud_token") and "hcloud_token" in reg.additional_secret_outputs, reg.name
    assert "kubeconfig" in graph.by_name("srv-k3s").additional_secret_outputs
    assert graph.by_name("w1-fence").is_secret("kubeconfig")
    assert graph.by_name("w1-fence").is_secret("hcloud_token")
    assert graph.by_name("storage-kubernetes").is_secret("kubeconfig")


def test_the_fence_of_a_hetzner_worker_gets_its_server_and_the_token(graph: Recording) -> None:
    fence = graph.by_name("w1-fence").inputs
    assert fence["hcloud_server"] == fake_id("w1")
    assert fence["hcloud_token"]["value"] == "test-hetzner-token"  # a secret (test_secrets_stay_secret)
    assert fence.get("hcloud_endpoint") is None
    # What proves the server is w1's: a private address only in the cluster's network; the labels
    # the program gave the server it created for w1.
    assert fence["hcloud_network"] == fake_id("private-network-network")
    labels = next(r for r in graph.of_type("server:Server") if r.name == "w1").inputs["labels"]
    assert fence["hcloud_labels"] == {"hk3s-owner": labels["hk3s-owner"], "hk3s-node": "w1"}
    assert labels["hk3s-node"] == "w1"


def test_an_existing_host_names_its_hetzner_server_for_the_fence(ssh_key_file: Path) -> None:
    workers = [{"name": "metal", "kind": "existing", "address": METAL_ADDRESS, "hcloud_server": "metal-1"}]
    graph = _run(_config(ssh_key_file, workers=workers, fences={"metal": {}}))
    assert graph.by_name("metal-fence").inputs["hcloud_server"] == "metal-1"
    # Not a server the program created: no labels of the program's to match.
    assert graph.by_name("metal-fence").inputs.get("hcloud_labels") is None
    plain = _run(_config(ssh_key_file, workers=[{**workers[0], "hcloud_server": None}], fences={"metal": {}}))
    fence = plain.by_name("metal-fence").inputs
    assert fence.get("hcloud_server") is None and fence["hcloud_token"]["value"] is None


def test_fencing_a_hetzner_worker_without_a_token_is_a_settings_error(
    ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HCLOUD_TOKEN")
    with pytest.raises(SettingsError, match=r"hcloud:token: hk3s:fences.w1 fences a Hetzner server"):
        _run(_config(ssh_key_file))


def test_every_resource_waits_for_the_worker_roster(graph: Recording) -> None:
    """A leaving worker is removed (or its removal refused) by the roster before anything that
    touches the cluster changes: every resource depends on it (Pulumi runs updates before
    deletes, so without this the peers' firewalls would drop the worker first), except the
    machines it records the logins of (their servers, host keys, login keys and probes),
    which it depends on itself."""
    roster = graph.by_name("workers")
    by_urn = {r.urn: r for r in graph.registrations}
    before: set[str] = set()
    pending = list(roster.dependencies)
    while pending:
        urn = pending.pop()
        if urn not in before and urn in by_urn:
            before.add(urn)
            pending.extend(by_urn[urn].dependencies)
    assert {graph.urn_of(f"{n}-login-key") for n in ("srv", "w1", "w2", "metal")} <= before
    assert {graph.urn_of(f"{n}-probe") for n in ("srv", "w1", "w2", "metal")} <= before
    others = [r for r in graph.registrations if r.urn != roster.urn and r.type != "pulumi:pulumi:Stack"]
    assert len(others) > 20
    # Made before the roster and not something it waits for: the components and provider
    # processes themselves, and the private network's own pieces.
    machine_level = ("hk3s:index:", "pulumi:providers:", "hcloud:index/network", "hcloud:index/sshKey", "NetworkRanges")
    missing = [
        r.name
        for r in others
        if roster.urn not in r.dependencies and r.urn not in before and not any(k in r.type for k in machine_level)
    ]
    assert not missing, f"not waiting for the roster: {missing}"
    touching = ("HostFirewall", "K3sServer", "NetworkPlan", "NodeJoin", "ConnectivityCheck", "NodeAccessCheck")
    for kind in (*touching, "DiskProbe", "NodeFence", "firewall:Firewall", "FirewallAttachment", "StorageClass"):
        for reg in graph.of_type(kind):
            if reg.urn not in before:
                assert roster.urn in reg.dependencies, f"{reg.name} does not wait for the roster"


def test_public_mode_creates_no_private_network_or_checks(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file, network={"mode": "public"}))
    types = {r.type for r in graph.registrations}
    assert "hcloud:index/network:Network" not in types
    assert not graph.of_type("hk3s:ConnectivityCheck")


def test_existing_hosts_only_need_no_hetzner(ssh_key_file: Path) -> None:
    config = _config(
        ssh_key_file,
        server={"name": "srv", "kind": "existing", "address": "198.51.100.2"},
        workers=[{"name": "metal", "kind": "existing", "address": METAL_ADDRESS}],
        fences={},
        storage={"install_longhorn": False},
    )
    graph = _run(config)
    # Neither Hetzner nor Kubernetes plugins are needed for such a stack.
    assert not [r for r in graph.registrations if r.type.startswith(("hcloud:", "kubernetes:", "pulumi:providers:k"))]
    assert {r.type for r in graph.registrations if r.type.startswith("pulumi:providers:")} == {
        "pulumi:providers:pulumi-python"
    }
    assert graph.by_name("metal-probe").inputs["address"] == METAL_ADDRESS


def test_one_copy_offer_has_one_storage_class(ssh_key_file: Path) -> None:
    graph = _run(_config(ssh_key_file, storage={"max_copies": 1}))
    classes = graph.of_type("kubernetes:storage.k8s.io/v1:StorageClass")
    assert [c.inputs["metadata"]["name"] for c in classes] == ["hk3s-one-copy"]
    assert classes[0].inputs["parameters"]["numberOfReplicas"] == "1"
    assert classes[0].inputs["reclaimPolicy"] == "Retain"
    values = graph.by_name("storage-longhorn").inputs["values"]["defaultSettings"]
    assert values == {
        "defaultReplicaCount": 1,
        "replicaSoftAntiAffinity": False,
        "defaultDataLocality": "disabled",
        "replicaAutoBalance": "disabled",
        "allowVolumeCreationWithDegradedAvailability": True,
        "storageReservedPercentageForDefaultDisk": 30,
        "storageMinimalAvailablePercentage": 25,
        "nodeDownPodDeletionPolicy": "do-nothing",
        "nodeDrainPolicy": "block-if-contains-last-replica",
    }


def test_longhorn_tolerates_every_taint_the_settings_give_a_node(ssh_key_file: Path) -> None:
    """Longhorn's manager is a DaemonSet with no tolerations of its own (the chart's
    `longhornManager.tolerations`), and its CSI plugin and instance managers tolerate what the
    `taint-toleration` setting names: a tainted worker (a pool's, or its own) gets both, else it
    gets no Longhorn node and the join's LonghornNodeRole fails after waiting for it."""
    workers = [{"name": "w1", "taints": ["gpu:NoExecute"]}, {"name": "b1", "pool": "batch"}]
    pools = [{"name": "batch", "count": 1, "taints": ["dedicated=batch:NoSchedule"]}]
    graph = _run(_config(ssh_key_file, workers=workers, worker_pools=pools, fences={}))
    values = graph.by_name("storage-longhorn").inputs["values"]
    assert values["longhornManager"] == {
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"},
            {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
        ]
    }
    assert values["defaultSettings"]["taintToleration"] == "dedicated=batch:NoSchedule;gpu:NoExecute"
    # A stack without taints keeps the chart's own (none).
    untainted = _run(_config(ssh_key_file)).by_name("storage-longhorn").inputs["values"]
    assert "longhornManager" not in untainted and "taintToleration" not in untainted["defaultSettings"]


def test_node_operations_are_sharded_over_provider_processes(graph: Recording) -> None:
    """Each node's dynamic resources run in the provider process of its shard, so joins of
    different nodes are not queued behind one process's 4 gRPC workers."""
    from components.provider_shards import shard_of  # noqa: PLC0415

    shard_urn = {int(r.name.rsplit("-", 1)[1]): r.urn for r in graph.of_type("pulumi:providers:pulumi-python")}
    for node in ("srv", "w1", "w2", "metal"):
        for reg in graph.registrations:
            if (
                "pulumi-python:dynamic" in reg.type
                and reg.name.startswith(f"{node}-")
                and "from-server" not in reg.name
            ):
                assert reg.provider.startswith(shard_urn[shard_of(node)] + "::"), (reg.name, reg.provider)
    # The server-side connection check runs where the server's operations run.
    assert graph.by_name("w1-from-server-ssh").provider.startswith(shard_urn[shard_of("srv")] + "::")


def test_hetzner_probes_wait_for_their_network_address(graph: Recording) -> None:
    # A created server's probe waits until the attached network's address is on the host,
    # so the network decision sees it; an existing host's probe waits for nothing.
    assert graph.by_name("w1-probe").inputs["expected_address"] == fake_ipv4("w1-private", "10.0.1")
    assert graph.urn_of("w1-private") in set(graph.by_name("w1-probe").dependencies)
    assert graph.by_name("metal-probe").inputs.get("expected_address") is None


def test_the_kubernetes_provider_reaches_the_api_through_the_servers_ssh_forward(ssh_key_file: Path) -> None:
    """The Kubernetes provider's kubeconfig points at the local end of a forward of the server's
    SSH session (pinned to the server's host key): nothing needs 6443 open to the operator, so the
    default config (no operator_access) installs Longhorn. The forward itself is recorded by the
    mock harness, not opened (no host answers here; tests/lab/test_join_firewalled.py opens one)."""
    graph = _run(_config(ssh_key_file, firewall={}))
    port = forward_port("hk3s", "test")
    provider = graph.by_name("storage-kubernetes")
    assert provider.is_secret("kubeconfig")
    kubeconfig = provider.inputs["kubeconfig"]["value"]
    assert f"server: https://127.0.0.1:{port}\n" in kubeconfig and "certificate-authority-data: Q0E=" in kubeconfig
    assert ":6443" not in kubeconfig
    assert provider.inputs["deleteUnreachable"] == "false"
    [(server, asked_port)] = graph.forwards
    assert asked_port == port and server.node == "srv" and server.address == fake_ipv4("srv")
    assert server.recorded_host_key and server.recorded_host_key.startswith("ssh-ed25519 ")
    # Another port by setting; a teardown lets a destroy forget Longhorn's objects once the API is gone.
    other = _run(_config(ssh_key_file, cluster={"name": "t", "k3s_version": "v1.31.4+k3s1", "api_forward_port": 18443}))
    assert "server: https://127.0.0.1:18443\n" in other.by_name("storage-kubernetes").inputs["kubeconfig"]["value"]
    torn = _run(_config(ssh_key_file, cluster={"name": "t", "k3s_version": "v1.31.4+k3s1", "teardown": "allowed"}))
    assert torn.by_name("storage-kubernetes").inputs["deleteUnreachable"] == "true"


def test_the_kubernetes_provider_is_named_by_the_servers_machine_not_its_kubeconfig(ssh_key_file: Path) -> None:
    """pulumi-kubernetes replaces a provider (and every object it made) whose kubeconfig changed its
    cluster or is unknown in a preview, unless its `clusterIdentifier` is set and unchanged
    (provider.go DiffConfig). The identifier names the server's machine (its Hetzner id, or an
    existing host's address), so a new forward port or a teardown leaves it as it is."""
    graph = _run(_config(ssh_key_file))
    identifier = graph.by_name("storage-kubernetes").inputs["clusterIdentifier"]
    assert identifier == f"hk3s-server/srv/{fake_id('srv')}", identifier
    for cluster in ({"api_forward_port": 18443}, {"teardown": "allowed"}):
        other = _run(_config(ssh_key_file, cluster={"name": "t", "k3s_version": "v1.31.4+k3s1", **cluster}))
        assert other.by_name("storage-kubernetes").inputs["clusterIdentifier"] == identifier, cluster
    existing = _run(_config(ssh_key_file, server={"name": "srv", "kind": "existing", "address": "192.0.2.10"}))
    assert existing.by_name("storage-kubernetes").inputs["clusterIdentifier"] == "hk3s-server/srv/192.0.2.10"


# Longhorn's settings as the program keeps them: Setting object name -> value (a string, as the
# object holds it). Written out here rather than read from the component, so a changed value fails.
KEPT_SETTINGS = {
    "default-replica-count": "1",
    "replica-soft-anti-affinity": "false",
    "default-data-locality": "disabled",
    "replica-auto-balance": "disabled",
    "allow-volume-creation-with-degraded-availability": "true",
    "storage-reserved-percentage-for-default-disk": "20",
    "storage-minimal-available-percentage": "15",
    "node-down-pod-deletion-policy": "do-nothing",
    "node-drain-policy": "block-if-contains-last-replica",
    # Longhorn's own guard against its uninstall: false until hk3s:cluster.teardown allows it.
    "deleting-confirmation-flag": "false",
}


def test_longhorn_settings_are_patched_after_the_release(ssh_key_file: Path) -> None:
    """Each kept setting is a server-side apply patch of Longhorn's Setting object (the provider's
    custom resource patch, forced, under the program's field manager), through the forwarded
    provider, after the Helm release. Wiring only: the patches run for real in
    tests/lab/test_longhorn_settings.py."""
    graph = _run(
        _config(ssh_key_file, storage={"max_copies": 2, "reserved_percent": 20, "minimal_available_percent": 15})
    )
    patches = graph.of_type("kubernetes:longhorn.io/v1beta2:SettingPatch")
    assert {p.inputs["metadata"]["name"]: p.inputs["value"] for p in patches} == KEPT_SETTINGS
    release, provider = graph.by_name("storage-longhorn"), graph.by_name("storage-kubernetes")
    for patch in patches:
        assert patch.inputs["apiVersion"] == "longhorn.io/v1beta2" and patch.inputs["kind"] == "Setting"
        assert patch.inputs["metadata"]["namespace"] == "longhorn-system"
        assert patch.inputs["metadata"]["annotations"] == {
            "pulumi.com/patchForce": "true",
            "pulumi.com/patchFieldManager": "hk3s",
        }
        assert release.urn in set(patch.dependencies)
        assert patch.provider.startswith(provider.urn + "::")
        assert patch.parent.endswith("StorageCopies::storage")
        assert patch.retain_on_delete, "deleting a patch would empty the setting"
    # The chart starts from the same values.
    defaults = release.inputs["values"]["defaultSettings"]
    assert defaults["storageReservedPercentageForDefaultDisk"] == 20
    assert defaults["storageMinimalAvailablePercentage"] == 15
    # Allowing the teardown confirms Longhorn's uninstall through the patch alone: the release's
    # values stay as they were, so no Helm upgrade comes with it.
    allowed = _run(
        _config(
            ssh_key_file,
            cluster={"name": "t", "k3s_version": "v1.31.4+k3s1", "teardown": "allowed"},
            storage={"max_copies": 2, "reserved_percent": 20, "minimal_available_percent": 15},
        )
    )
    flag = allowed.by_name("storage-setting-deleting-confirmation-flag")
    assert flag.inputs["value"] == "true"
    assert allowed.by_name("storage-longhorn").inputs["values"] == release.inputs["values"]


def test_longhorn_chart_from_its_repository_or_a_local_path(ssh_key_file: Path, tmp_path: Path) -> None:
    """Unset, the release fetches the chart from Longhorn's repository; with storage.longhorn_chart
    (air-gapped), from that folder, and no repository is named."""
    fetched = _run(_config(ssh_key_file)).by_name("storage-longhorn").inputs
    assert fetched["chart"] == "longhorn" and fetched["version"] == "1.9.1"
    assert fetched["repositoryOpts"] == {"repo": "https://charts.longhorn.io"}
    chart = tmp_path / "longhorn"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: longhorn\nversion: 1.9.1\n")
    local = _run(_config(ssh_key_file, storage={"longhorn_chart": str(chart)})).by_name("storage-longhorn").inputs
    assert local["chart"] == str(chart.resolve()) and local["version"] == "1.9.1"
    assert "repositoryOpts" not in local


def test_one_access_check_of_the_recorded_nodes_serves_every_join(graph: Recording) -> None:
    """The recorded nodes are logged in to by one check per run, from the server's provider, and
    every join waits for it: adding K workers to N nodes costs N logins for this, not K x N. No
    join carries the peers to log in to itself."""
    [check] = graph.of_type("NodeAccessCheck")
    assert check.name == "node-access" and check.parent.endswith("ClusterServer::srv")
    # w1 is fenced (hk3s:fences): it may be powered off for good, so no run logs in to it for this.
    assert sorted(node["node"] for node in check.inputs["nodes"]) == ["metal", "w2"]
    for name in ("w1", "w2", "metal"):
        join = graph.by_name(f"{name}-join")
        assert check.urn in set(join.dependencies), name
        assert "peers" not in join.inputs, name


def test_a_fenced_workers_firewall_keeps_its_rules_while_the_others_change(
    graph: Recording, ssh_key_file: Path
) -> None:
    """The fenced w1's host firewall ignores rule changes (peers added or removed meanwhile), so
    those runs never log in to a worker that may be powered off; the others' firewalls follow."""
    assert graph.by_name("w1-firewall").ignore_changes == [
        "rules",
        "block_metadata",
        "cluster_networks",
        "node_addresses",
    ]
    assert graph.by_name("w2-firewall").ignore_changes == []
    # Given up later (force_remove), it may be gone for good: its rules are forgotten, not removed over SSH.
    assert graph.by_name("w1-firewall").retain_on_delete and not graph.by_name("w2-firewall").retain_on_delete
    unfenced = _run(_config(ssh_key_file, fences={}))
    assert unfenced.by_name("w1-firewall").ignore_changes == []
    assert not unfenced.by_name("w1-firewall").retain_on_delete


def test_a_worker_given_up_leaves_the_roster_as_forced(ssh_key_file: Path) -> None:
    """w1 dropped from the workers, its fence kept with force_remove: the roster gives it up
    (no drain), and nothing of it is built any more."""
    config = _config(ssh_key_file, fences={"w1": {"powered_off": True, "force_remove": True}})
    config["workers"] = [w for w in config["workers"] if w["name"] != "w1"]
    graph = _run(config)
    roster = graph.by_name("workers")
    assert roster.inputs["forced"] == ["w1"] and "w1" not in roster.inputs["workers"]
    assert not [r for r in graph.registrations if r.name.startswith("w1-")]
    assert graph.by_name("k3s-upgrade").inputs["fenced"] == []


def test_longhorn_is_uninstalled_before_any_worker_is_wiped(graph: Recording) -> None:
    """Under Pulumi mocks (wiring only; the engine's delete order is shown in the lab's teardown,
    tests/lab/test_longhorn_teardown.py). In a destroy the engine deletes a resource only once
    every resource that depends on it is deleted, and a worker's join is what wipes it in a
    teardown (its delete, providers/node_join.py). Longhorn's release and namespace depend on
    every worker's join, so Longhorn's uninstall (its pre-delete job reaches every node) and its
    namespace are gone before any worker is wiped."""
    joins = {graph.urn_of(f"{name}-join") for name in ("w1", "w2", "metal")}
    for name in ("storage-longhorn", "storage-namespace"):
        missing = sorted(urn.rsplit("::", 1)[-1] for urn in joins - graph.dependencies_of(name))
        assert not missing, f"{name} does not wait for the joins of {missing}"


def test_longhorns_manager_ui_and_instance_managers_admit_only_longhorn_and_the_named_namespaces(
    ssh_key_file: Path,
) -> None:
    """Longhorn's API and UI have no authentication: three NetworkPolicies the program keeps in
    longhorn-system (components/longhorn_network.py), made after the namespace and before the
    release, through the forwarded provider. Wiring and specs; tests/lab/test_longhorn_csi.py
    shows a plain pod refused by them on a real node."""
    graph = _run(_config(ssh_key_file, storage={"longhorn_api_clients": ["monitoring", "monitoring"]}))
    policies = {p.inputs["metadata"]["name"]: p for p in graph.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")}
    assert sorted(policies) == ["hk3s-longhorn-instance-manager", "hk3s-longhorn-manager", "hk3s-longhorn-ui"]
    namespace, release = graph.by_name("storage-namespace"), graph.by_name("storage-longhorn")
    own: dict[str, Any] = {"podSelector": {}}
    named = {
        "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["monitoring"]}]
        }
    }
    for policy in policies.values():
        assert policy.inputs["metadata"]["namespace"] == "longhorn-system"
        assert policy.inputs["spec"]["policyTypes"] == ["Ingress"]
        assert namespace.urn in set(policy.dependencies)
        assert policy.urn in set(release.dependencies), "the release waits for the policies"
    manager = policies["hk3s-longhorn-manager"].inputs["spec"]
    assert manager["podSelector"] == {"matchLabels": {"app": "longhorn-manager"}}
    assert manager["ingress"] == [
        {"from": [own, named]},
        {"ports": [{"protocol": "TCP", "port": 9501}, {"protocol": "TCP", "port": 9502}]},
    ]
    ui = policies["hk3s-longhorn-ui"].inputs["spec"]
    assert ui["podSelector"] == {"matchLabels": {"app": "longhorn-ui"}} and ui["ingress"] == [{"from": [own, named]}]
    instances = policies["hk3s-longhorn-instance-manager"].inputs["spec"]
    assert instances["podSelector"] == {"matchLabels": {"longhorn.io/component": "instance-manager"}}
    assert instances["ingress"] == [{"from": [own]}]
    # Without named namespaces, Longhorn's own pods alone.
    plain = _run(_config(ssh_key_file))
    specs = {p.inputs["metadata"]["name"]: p.inputs["spec"] for p in plain.of_type("NetworkPolicy")}
    assert specs["hk3s-longhorn-ui"]["ingress"] == [{"from": [own]}]


def test_a_longhorn_api_client_that_is_no_namespace_name_is_refused() -> None:
    from cluster_settings.models import StorageSettings  # noqa: PLC0415

    with pytest.raises(ValueError, match="'Monitoring!' is not a namespace name"):
        StorageSettings(longhorn_api_clients=["Monitoring!"])
