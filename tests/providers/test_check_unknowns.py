"""Every dynamic provider's `check` in a preview, where inputs that come from resources not yet
created or updated are unknown: what is known is validated, the unknown passes, and known bad
values are still refused.

An input the engine does not know yet comes over the wire as the SDK's placeholder string
(`pulumi.runtime.rpc.UNKNOWN`), whole or inside a list or map; the SDK's provider host
(`pulumi/dynamic/__main__.py`) deserializes the check request with `keep_unknowns=True`, which
hands the provider an `Unknown()` object in its place. Both forms are tried. A check that judges the placeholder as a
value refuses the preview of a routine change, e.g. adding a worker to a stack with Longhorn:
"holds_copies must be true or false". Each provider's check sees here the inputs its component
builds (the typed `*Inputs` dataclasses), then each input unknown in turn: as a whole, and each
item or field of a list or map. Hosts are reached only where a check would log in: the
worker roster's members sit on a closed loopback port, so a check that wrongly judged a removal
fails at once instead of waiting for a host.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from pulumi.dynamic import ResourceProvider
from pulumi.output import Unknown
from pulumi.runtime.rpc import UNKNOWN

import providers
from providers.base import NodeProvider
from providers.bootstrap_firewall import BootstrapFirewallReleaseInputs, BootstrapFirewallReleaseProvider
from providers.connectivity_check import ConnectivityCheckInputs, ConnectivityCheckProvider
from providers.copies_offer import CopiesOfferInputs, CopiesOfferProvider
from providers.disk_probe import DiskProbeInputs, DiskProbeProvider
from providers.host_firewall import HostFirewallInputs, HostFirewallProvider
from providers.host_key_pair import HostKeyPairInputs, HostKeyPairProvider
from providers.host_probe import HostProbeInputs, HostProbeProvider
from providers.inputs import K3sRelease, NodeLogin
from providers.k3s_server import K3sServerInputs, K3sServerProvider
from providers.k3s_upgrade import K3sUpgradeInputs, K3sUpgradeProvider, UpgradedWorker
from providers.login_key import (
    NodeLoginKeyInputs,
    NodeLoginKeyProvider,
    RetiredLoginKeysInputs,
    RetiredLoginKeysProvider,
)
from providers.longhorn_node_role import LonghornNodeRoleInputs, LonghornNodeRoleProvider
from providers.network_plan import NetworkPlanInputs, NetworkPlanProvider, PlanHost
from providers.network_ranges import NetworkRangesInputs, NetworkRangesProvider
from providers.node_access_check import NodeAccessCheckInputs, NodeAccessCheckProvider, RecordedHost
from providers.node_fence import NodeFenceInputs, NodeFenceProvider
from providers.node_join import NodeJoinInputs, NodeJoinProvider
from providers.project_ssh_key import ProjectSshKeyInputs, ProjectSshKeyProvider
from providers.stack_identity import StackIdentityProvider
from providers.teardown_guard import TeardownGuardInputs, TeardownGuardProvider
from providers.worker_roster import RosterMember, WorkerRosterInputs, WorkerRosterProvider


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


CLOSED_PORT = _closed_port()
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk3cz9wcmV2aWV3LXVua25vd25zLXRlc3Qtb25seQ"
WORKER = NodeLogin(node="w2", address="198.51.100.8", private_key="key", recorded_host_key=HOST_KEY)
SERVER = NodeLogin(node="srv", address="198.51.100.2", private_key="key", recorded_host_key=HOST_KEY)
RELEASE = K3sRelease(k3s_version="v1.36.1+k3s1")


@dataclasses.dataclass(frozen=True)
class CheckCase:
    """One provider's check: the inputs its component builds, the state of the resource once
    created (None: the same inputs), and known bad values with the input the failure names."""

    provider: ResourceProvider
    news: dict[str, Any]
    state: dict[str, Any] | None = None
    bad: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return type(self.provider).__name__


_FENCE = NodeFenceInputs(
    login=WORKER,
    powered_off=True,
    accept_stale_data=False,
    kubeconfig="apiVersion: v1",
    server_node="srv",
    server_address="198.51.100.2",
    kubelet_address="198.51.100.8",
    network_mode="public",
    server_url="https://198.51.100.2:6443",
    validation_taint="hk3s.dev/validating=true:NoSchedule",
).props()
_JOIN = NodeJoinInputs(
    login=WORKER,
    server_node="srv",
    server_address="198.51.100.2",
    server_url="https://198.51.100.2:6443",
    ca_hash="ab" * 32,
    k3s=RELEASE,
    recorded_nodes=["srv", "w1"],
    network_mode="public",
    node_ip="198.51.100.8",
    node_external_ip="198.51.100.8",
    labels={"tier": "web"},
    taints=["dedicated=db:NoSchedule"],
    validation_taint="hk3s.dev/validating=true:NoSchedule",
    pod_network="vxlan",
).props()
_SERVER = K3sServerInputs(
    login=SERVER,
    k3s=RELEASE,
    pod_cidr="10.42.0.0/16",
    service_cidr="10.43.0.0/16",
    flannel_backend="vxlan",
    node_ip="198.51.100.2",
    node_external_ip="198.51.100.2",
    network_mode="public",
).props()
_RULES = [
    {"port": "22", "protocol": "tcp", "sources": ["0.0.0.0/0"], "purpose": "SSH"},
    {"port": "8472", "protocol": "udp", "sources": ["198.51.100.2/32", "198.51.100.7/32"], "purpose": "VXLAN"},
]


def _plan_host(node: str, address: str) -> PlanHost:
    return PlanHost(node=node, ssh_address=address, public_address=address, ipv4_addresses=[f"{address}/24"])


def _roster_member(node: str) -> RosterMember:
    return RosterMember(node=node, address="127.0.0.1", ssh_port=CLOSED_PORT)


CASES = [
    CheckCase(
        LonghornNodeRoleProvider(),
        LonghornNodeRoleInputs(login=SERVER, longhorn_node="w2", holds_copies=True, join_run="run-1").props(),
        bad=(("holds_copies", "yes"), ("server", "no")),
    ),
    CheckCase(
        ConnectivityCheckProvider(),
        ConnectivityCheckInputs(
            login=WORKER, target_node="srv", target_address="10.0.0.2", target_port=6443, network_mode="private"
        ).props(),
        bad=(("target_port", 70000), ("node", "W2_worker"), ("ssh_port", 0)),
    ),
    CheckCase(
        CopiesOfferProvider(),
        CopiesOfferInputs(login=SERVER, max_copies=3).props(),
        bad=(("address", ""),),
    ),
    CheckCase(
        DiskProbeProvider(),
        DiskProbeInputs(login=WORKER, disk_path="/var/lib/longhorn", join_run="run-1").props(),
        bad=(("disk_path", "var/lib/longhorn"), ("threshold_ms", 1e9)),
    ),
    CheckCase(
        HostFirewallProvider(),
        HostFirewallInputs(login=WORKER, role="worker", rules=_RULES).props(),
        bad=(
            ("role", "router"),
            ("rules", [{**_RULES[0], "protocol": "icmp"}]),
            ("rules", [{**_RULES[1], "sources": ["not-a-network"]}]),
        ),
    ),
    CheckCase(HostKeyPairProvider(), HostKeyPairInputs(node="srv").props()),
    CheckCase(
        HostProbeProvider(),
        HostProbeInputs(login=WORKER, expected_address="198.51.100.8", created_by_program=True).props(),
        bad=(("node", "W2"),),
    ),
    CheckCase(
        K3sServerProvider(),
        _SERVER,
        bad=(("pod_cidr", "10.52.0.0/16"), ("service_cidr", "10.53.0.0/16"), ("k3s_version", "v1.35.0+k3s1")),
    ),
    CheckCase(
        K3sUpgradeProvider(),
        K3sUpgradeInputs(
            login=SERVER,
            k3s=RELEASE,
            target_version="v1.36.1+k3s1",
            workers=[
                UpgradedWorker(node="w1", address="198.51.100.7"),
                UpgradedWorker(node="w2", address="198.51.100.8"),
            ],
        ).props(),
        bad=(("node", "Srv"),),
    ),
    CheckCase(NodeLoginKeyProvider(), NodeLoginKeyInputs(login=WORKER).props(), bad=(("private_key", ""),)),
    CheckCase(
        RetiredLoginKeysProvider(),
        RetiredLoginKeysInputs(login=WORKER, retiring_keys=["old-key"]).props(),
        bad=(("ssh_port", 65536),),
    ),
    CheckCase(
        NetworkPlanProvider(),
        NetworkPlanInputs(
            mode_setting="auto",
            private_network="10.0.0.0/16",
            pod_cidr="10.42.0.0/16",
            service_cidr="10.43.0.0/16",
            private_key="key",
            server=PlanHost(node="srv", ssh_address="198.51.100.2", public_address="198.51.100.2"),
            workers=[_plan_host("w1", "198.51.100.7"), _plan_host("w2", "198.51.100.8")],
        ).props(),
        bad=(("mode_setting", "wireguard"),),
    ),
    CheckCase(
        NetworkRangesProvider(),
        NetworkRangesInputs(network_range="10.0.0.0/16", subnet_range="10.0.1.0/24").props(),
        bad=(("network_range", "10.1.0.0/16"), ("subnet_range", "10.0.2.0/24")),
    ),
    CheckCase(
        NodeAccessCheckProvider(),
        NodeAccessCheckInputs(
            login=SERVER,
            nodes=[RecordedHost(node="w1", address="198.51.100.7"), RecordedHost(node="w2", address="198.51.100.8")],
        ).props(),
        bad=(("node", "srv."),),
    ),
    CheckCase(
        NodeFenceProvider(),
        _FENCE,
        bad=(("powered_off", "yes"), ("accept_stale_data", 1)),
    ),
    CheckCase(
        NodeJoinProvider(),
        _JOIN,
        state={**_JOIN, "network_mode_in_use": "public"},
        bad=(("k3s_version", "1.36"), ("network_mode", "mesh"), ("network_mode", "private")),
    ),
    CheckCase(
        WorkerRosterProvider(),
        WorkerRosterInputs(
            workers=["w1", "w2"],
            server=_roster_member("srv"),
            members=[_roster_member("w1"), _roster_member("w2")],
            private_key="key",
            longhorn=True,
            pod_network="vxlan",
        ).props(),
        # w1 leaves but its host does not answer: refused.
        bad=(("workers", ["w2"]),),
    ),
    CheckCase(TeardownGuardProvider(), TeardownGuardInputs(teardown_allowed=False, stack="dev").props()),
    CheckCase(
        BootstrapFirewallReleaseProvider(),
        BootstrapFirewallReleaseInputs(
            node="w2", server_id="4711", bootstrap_firewall_id="12", full_firewall_id="13", hcloud_token="t"
        ).props(),
        bad=(("server_id", "w2-server"),),
    ),
    CheckCase(
        ProjectSshKeyProvider(),
        ProjectSshKeyInputs(
            name="shop-aabbccddeeff",
            public_key=HOST_KEY,
            fingerprint="aa:bb",
            labels={"hk3s-owner": "hk3s.dev", "hk3s-stack-id": "5eed0f57ac1d0000"},
            hcloud_token="t",
        ).props(),
        bad=(("public_key", "not-a-key"),),
    ),
    # No inputs: its one output is made at create.
    CheckCase(StackIdentityProvider(), {"stack_id": None}),
]


# The unknown as the provider host hands it over, and as the wire carries it.
UNKNOWNS = {"Unknown": Unknown(), "placeholder": UNKNOWN}


def unknown_variants(news: dict[str, Any], unknown: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """`news` with one input `unknown`: each input as a whole, each item of a list and each field
    of a map (or of a list's maps); then every input at once."""
    for key, value in news.items():
        yield key, {**news, key: unknown}
        if isinstance(value, dict):
            for field in value:
                yield f"{key}.{field}", {**news, key: {**value, field: unknown}}
        if isinstance(value, list):
            for index, item in enumerate(value):
                items = list(value)
                items[index] = unknown
                yield f"{key}[{index}]", {**news, key: items}
                for field in item if isinstance(item, dict) else ():
                    items = list(value)
                    items[index] = {**item, field: unknown}
                    yield f"{key}[{index}].{field}", {**news, key: items}
    yield "every input", dict.fromkeys(news, unknown)


def _with_unknowns() -> Iterator[Any]:
    for case in CASES:
        for form, unknown in UNKNOWNS.items():
            for where, news in unknown_variants(case.news, unknown):
                for olds_name in ("new", "existing"):
                    yield pytest.param(case, news, olds_name, id=f"{case.name}-{olds_name}-{form}-{where}")


def _olds(case: CheckCase, which: str) -> dict[str, Any]:
    """A resource the preview creates has no olds; one it updates has its state."""
    return {} if which == "new" else dict(case.state if case.state is not None else case.news)


def _defined_providers() -> set[type[ResourceProvider]]:
    found: set[type[ResourceProvider]] = set()
    for module_info in pkgutil.iter_modules(providers.__path__, "providers."):
        module = importlib.import_module(module_info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, ResourceProvider) and cls.__module__ == module.__name__ and cls is not NodeProvider:
                found.add(cls)
    return found


def test_every_dynamic_provider_is_covered() -> None:
    assert {type(case.provider) for case in CASES} == _defined_providers()


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
@pytest.mark.parametrize("olds_name", ["new", "existing"])
def test_the_inputs_a_component_builds_pass(case: CheckCase, olds_name: str) -> None:
    """The starting point of every other test here: with every input known and valid, no failure."""
    result = case.provider.check(_olds(case, olds_name), dict(case.news))
    assert result.failures == []


@pytest.mark.parametrize(("case", "news", "olds_name"), list(_with_unknowns()))
def test_an_unknown_input_passes_the_check_of_a_preview(case: CheckCase, news: dict[str, Any], olds_name: str) -> None:
    result = case.provider.check(_olds(case, olds_name), dict(news))
    assert [(failure.property, failure.reason) for failure in result.failures] == []
    # The unknown input goes on to diff and create as the engine sent it (but for the inputs the
    # check itself decides: the pinned host key, whether the server encrypts Secrets and whether
    # its API server refuses Services' externalIPs).
    for key, value in news.items():
        assert result.inputs[key] == value or key in DECIDED_BY_CHECK


DECIDED_BY_CHECK = {"recorded_host_key", "secrets_encryption", "deny_service_external_ips"}


# Inputs from other resources (a host's address, the login key, its recorded host key, a join's
# run): being unknown beside a known bad value does not let the bad value through.
FROM_OTHER_RESOURCES = {"address", "private_key", "recorded_host_key", "join_run"}


def _bad_values() -> Iterator[Any]:
    for case in CASES:
        for index, (key, value) in enumerate(case.bad):
            yield pytest.param(case, key, value, id=f"{case.name}-{key}-{index}")


@pytest.mark.parametrize(("case", "key", "value"), list(_bad_values()))
def test_a_known_bad_value_is_still_refused(case: CheckCase, key: str, value: Any) -> None:
    olds = _olds(case, "existing")
    result = case.provider.check(olds, {**case.news, key: value})
    assert result.failures, f"{key}={value!r} passed"
    assert all(failure.property.split("[")[0] == key for failure in result.failures), result.failures
    for unknown in UNKNOWNS.values():
        others = {name: unknown for name in case.news if name in FROM_OTHER_RESOURCES - {key}}
        if others:
            assert case.provider.check(olds, {**case.news, **others, key: value}).failures, f"{key}={value!r} passed"
