"""What the Hetzner project must offer and hold, checked before anything is registered,
and the names and firewalls the stack's Hetzner resources get.

The engine is Pulumi's mocks (no resource is really made: the mocks plan no replacements; what
is tested is what the program asks for). Hetzner is the lab's Hetzner API stand-in
(lab/hcloud_standin.py, a real HTTP server), read through Hetzner's own library as in a real
run, seeded with tests/components/mock_engine.py's catalogue, which follows Hetzner's changelog
(CX Gen 2 and CPX Gen 1 removed at the end of 2025; CX and CAX offered in the EU only), and with
the servers, networks and firewalls each test puts in the project.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from cluster_settings import SettingsError, load_settings
from cluster_settings.models import StackSettings
from components import hetzner_project
from components.hetzner_project import NODE_LABEL, check_hetzner_project, hetzner_name, planned_names
from components.hetzner_ssh_key import OWNER_LABEL
from components.program import build_cluster, read_credentials
from lab.hcloud_standin import HcloudStandin, SwitchedMachine, running_standin
from remote_access.hetzner_api import HetznerAccess
from tests.components.mock_engine import (
    HETZNER_SERVER_TYPES,
    ClusterMocks,
    Recording,
    api_image,
    api_server_type,
    run_with_mocks,
)

# The reads themselves (the mock engine's runs swap this module's for one bound to their stand-in).
read_hetzner_project = hetzner_project.read_hetzner_project

REPO = Path(__file__).resolve().parents[2]
K3S = "v1.36.1+k3s1"


def _config(key_file: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "cluster": {"name": "shop", "k3s_version": K3S},
        "server": {"name": "srv"},
        "ssh": {"private_key_file": str(key_file)},
        "workers": [{"name": "w1"}, {"name": "w2", "server_type": "cax11"}],
    }
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def _run(config: dict[str, Any], stack: str = "dev", mocks: ClusterMocks | None = None) -> Recording:
    settings = load_settings(config)
    recording = Recording()
    run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), recording, mocks=mocks, stack=stack)
    return recording


def _refused(config: dict[str, Any], mocks: ClusterMocks | None = None) -> tuple[str, Recording]:
    recording = Recording()
    settings = load_settings(config)
    with pytest.raises(SettingsError) as refused:
        run_with_mocks(lambda: build_cluster(settings, read_credentials(settings)), recording, mocks=mocks, stack="dev")
    return str(refused.value), recording


def _offered(name: str, location: str) -> bool:
    return any(t[0] == name and location in t[2] and not t[3] for t in HETZNER_SERVER_TYPES)


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_the_example_stacks_and_the_defaults_use_types_hetzner_offers(stack: str, ssh_key_file: Path) -> None:
    document = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())
    config = {key.split(":", 1)[1]: value for key, value in document["config"].items() if key.startswith("hk3s:")}
    location = config["cluster"].get("location", "fsn1")
    types = [config["cluster"].get("server_type")] + [w.get("server_type") for w in config["workers"]]
    assert all(_offered(t, location) for t in types if t), types
    settings = {
        "cluster": {"k3s_version": K3S},
        "server": {"name": "s"},
        "ssh": {"private_key_file": str(ssh_key_file)},
    }
    default = load_settings(settings).cluster.server_type
    assert _offered(default, "fsn1") and _offered(default, "nbg1") and _offered(default, "hel1")


def test_an_unknown_server_type_is_refused_naming_the_setting_and_the_offers(ssh_key_file: Path) -> None:
    message, recording = _refused(_config(ssh_key_file, cluster={"server_type": "cx32"}))
    assert "hk3s:cluster.server_type: Hetzner has no server type 'cx32'" in message
    assert "fsn1 offers: cax11, ccx13, cpx22, cx23, cx33, cx43" in message
    assert recording.registrations == []  # refused before anything was registered


def test_a_cx_type_in_ash_is_refused_naming_the_setting(ssh_key_file: Path) -> None:
    config = _config(
        ssh_key_file,
        cluster={"location": "ash"},
        workers=[{"name": "w1", "server_type": "ccx13"}, {"name": "w2", "server_type": "cx23"}],
    )
    message, recording = _refused(config)
    assert "hk3s:cluster.server_type: server type 'cx33' is not offered in ash (for srv); ash offers: ccx13, cpx22" in (
        message
    )
    assert "hk3s:workers[1].server_type: server type 'cx23' is not offered in ash" in message
    assert "workers[0]" not in message
    assert recording.registrations == []


def test_a_removed_type_and_an_image_missing_for_the_architecture_are_refused(ssh_key_file: Path) -> None:
    config = _config(
        ssh_key_file,
        workers=[{"name": "w1", "server_type": "cpx21"}, {"name": "w2", "server_type": "cax11", "image": "rocky-9"}],
    )
    message, _ = _refused(config)
    assert "hk3s:workers[0].server_type: server type 'cpx21' cannot be ordered now in fsn1" in message
    assert "hk3s:workers[1].image: Hetzner has no arm image 'rocky-9'" in message


def test_a_deprecated_image_is_used_with_a_warning_until_hetzner_stops_offering_it(
    ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mock of Hetzner's API (it cannot be reached from here). Hetzner keeps creating servers from
    a deprecated image until its `unavailable_after` date; terraform-provider-hcloud warns and goes
    on (issue #1434, PR #1435: `allow_deprecated_images` removed, "if an image is deprecated, we
    raise a warning but continue, and once the image becomes unavailable, we raise an error"). So
    the run registers the servers with it and warns once, naming the image, the setting and the
    date; Hetzner's image list holds deprecated images only when asked (`include_deprecated`)."""
    warnings: list[str] = []
    monkeypatch.setattr(
        "components.hetzner_project.pulumi.log.warn", lambda message, resource=None: warnings.append(message)
    )
    mocks = ClusterMocks()
    mocks.hetzner_deprecated_images = {"ubuntu-22.04": "2099-01-31T00:00:00Z"}
    servers = _run(_config(ssh_key_file, cluster={"image": "ubuntu-22.04"}), "dev", mocks).of_type(
        "hcloud:index/server:Server"
    )
    assert {server.name for server in servers} == {"srv", "w1", "w2"}
    assert {server.inputs["image"] for server in servers} == {"ubuntu-22.04"}
    assert len(warnings) == 1, warnings
    assert "hk3s:cluster.image" in warnings[0] and "'ubuntu-22.04' is deprecated" in warnings[0]
    assert "2099-01-31" in warnings[0] and "srv, w1, w2" in warnings[0]


def test_an_image_past_its_unavailable_date_is_refused_naming_the_setting(ssh_key_file: Path) -> None:
    """A mock of Hetzner's API (it cannot be reached from here): after `unavailable_after`
    Hetzner creates no server from the image, so the run is refused before anything is registered."""
    mocks = ClusterMocks()
    mocks.hetzner_deprecated_images = {"ubuntu-22.04": "2025-12-31T00:00:00Z"}
    config = _config(ssh_key_file, workers=[{"name": "w1", "image": "ubuntu-22.04"}])
    message, recording = _refused(config, mocks)
    assert "hk3s:workers[0].image: image 'ubuntu-22.04' (for w1) is deprecated and Hetzner creates no server" in message
    assert "since 2025-12-31" in message
    assert recording.registrations == []


def test_two_stacks_in_one_project_get_distinct_names(ssh_key_file: Path) -> None:
    config = _config(ssh_key_file)

    def hetzner_names(recording: Recording) -> set[str]:
        # The SSH key is left out: one key with the operator's fingerprint serves every stack.
        return {
            r.inputs["name"]
            for r in recording.registrations
            if r.type.startswith("hcloud:") and "name" in r.inputs and r.type != "hcloud:index/sshKey:SshKey"
        }

    dev, staging = hetzner_names(_run(config, "dev")), hetzner_names(_run(config, "staging"))
    assert {"shop-dev-srv", "shop-dev-w1", "shop-dev-network", "shop-dev-servers", "shop-dev-ssh-only"} <= dev
    assert {"shop-staging-srv", "shop-staging-w1", "shop-staging-network"} <= staging
    assert not dev & staging


def test_a_name_another_owner_holds_is_refused_and_our_own_is_not(ssh_key_file: Path) -> None:
    mocks = ClusterMocks()
    mocks.hetzner_servers = [("shop-dev-w1", {})]
    mocks.hetzner_networks = [("shop-dev-network", {"hk3s-cluster": "shop", "hk3s-stack": "dev"})]
    message, recording = _refused(_config(ssh_key_file), mocks)
    assert "hk3s:workers[0].name: the Hetzner project already has a server named 'shop-dev-w1'" in message
    assert "network" not in message  # this stack's own network, by its labels
    assert recording.registrations == []
    mocks.hetzner_servers = [("shop-dev-w1", {"hk3s-cluster": "shop", "hk3s-stack": "dev"})]
    servers = _run(_config(ssh_key_file), "dev", mocks).of_type("hcloud:index/server:Server")
    assert "shop-dev-w1" in {server.inputs["name"] for server in servers}


def test_every_server_carries_an_ssh_only_cloud_firewall_from_creation(ssh_key_file: Path) -> None:
    recording = _run(_config(ssh_key_file))
    firewall = recording.by_name("shop-ssh-only")
    # The plan's SSH rule and its ICMP (node_operations.firewall_plan.bootstrap_rules, ICMP_RULE).
    assert [(r["direction"], r["protocol"], r.get("port")) for r in firewall.inputs["rules"]] == [
        ("in", "tcp", "22"),
        ("in", "icmp", None),
    ]
    servers = recording.of_type("hcloud:index/server:Server")
    assert {s.name for s in servers} == {"srv", "w1", "w2"}
    for server in servers:
        assert server.inputs["firewallIds"], server.name
        assert firewall.urn in server.dependencies, server.name
        # Set at creation only: the cluster's firewalls are attached later and must stay.
        assert "firewallIds" in server.ignore_changes or "firewall_ids" in server.ignore_changes, server.name
        assert server.inputs["labels"]["hk3s-stack"] == "dev" and server.inputs["labels"]["hk3s-cluster"] == "shop"


def test_no_creation_firewall_when_the_cloud_firewall_is_off(ssh_key_file: Path) -> None:
    recording = _run(_config(ssh_key_file, firewall={"cloud_firewall": False}))
    assert not [r for r in recording.registrations if r.name == "shop-ssh-only"]
    assert all(not s.inputs.get("firewallIds") for s in recording.of_type("hcloud:index/server:Server"))


def test_names_stay_hostnames_of_at_most_63_characters() -> None:
    long_name = hetzner_name("a" * 40, "production-eu", "worker-with-a-long-name-17")
    assert len(long_name) <= 63 and long_name == long_name.lower() and not long_name.endswith("-")
    assert long_name != hetzner_name("a" * 40, "production-eu", "worker-with-a-long-name-18")


def _ours(name: str, stack: str = "dev") -> tuple[str, dict[str, str]]:
    return (name, {"hk3s-cluster": "shop", "hk3s-stack": stack})


def test_servers_that_exist_are_not_refused_when_hetzner_stops_offering_their_type(
    ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mock of Hetzner's API (it cannot be reached from here): the project already holds this
    stack's servers srv and w1 (named and labelled by the stack), and their type cpx21 has since
    been removed from the catalogue. Their type, location and image are creation-only inputs
    (ignored after creation), so the run changes nothing about them: a fence, a removal or an
    upgrade must not be refused for it. The run goes ahead with one warning line; w2, not yet
    created, is still checked and is fine on cax11."""
    warnings: list[str] = []
    monkeypatch.setattr(
        "components.hetzner_project.pulumi.log.warn", lambda message, resource=None: warnings.append(message)
    )
    mocks = ClusterMocks()
    mocks.hetzner_servers = [_ours("shop-dev-srv"), _ours("shop-dev-w1")]
    config = _config(
        ssh_key_file,
        cluster={"server_type": "cpx21"},
        workers=[{"name": "w1"}, {"name": "w2", "server_type": "cax11"}],
    )
    servers = _run(config, "dev", mocks).of_type("hcloud:index/server:Server")
    assert {server.name for server in servers} == {"srv", "w1", "w2"}
    assert len(warnings) == 1, warnings
    assert "srv, w1" in warnings[0] and "cpx21" in warnings[0] and "hk3s:cluster.server_type" in warnings[0]


def test_a_server_the_run_will_create_is_still_refused_beside_existing_ones(ssh_key_file: Path) -> None:
    """A mock of Hetzner's API (it cannot be reached from here): srv exists (this stack's name and
    labels), w3 is new and asks for the removed cpx21, so it alone is refused. Another stack's
    server of the same node name does not count as this stack's."""
    mocks = ClusterMocks()
    mocks.hetzner_servers = [_ours("shop-dev-srv"), _ours("shop-staging-w3", "staging")]
    config = _config(
        ssh_key_file,
        cluster={"server_type": "cpx21"},
        workers=[{"name": "w3", "server_type": "cpx21"}],
    )
    message, recording = _refused(config, mocks)
    assert "hk3s:workers[0].server_type: server type 'cpx21' cannot be ordered now in fsn1 (for w3)" in message
    assert "(for srv)" not in message and "hk3s:cluster.server_type" not in message
    assert recording.registrations == []


# A control plane renamed: the stack's prior state as the Hetzner project records it. Under a stub
# of Hetzner's listing (the API cannot be reached from here). terraform-provider-hcloud's
# hcloud_server (internal/server/resource.go) updates `name` and `labels` in place
# (resourceServerUpdate), so a renamed cluster keeps every server; a new hk3s:server.name is a new
# Pulumi resource, which Pulumi creates before it refuses the protected old one's delete.
OWNER = "hk3s.dev"


def _seeded(standin: HcloudStandin, servers: list[dict[str, Any]]) -> HetznerAccess:
    """One type (cx23 in fsn1), one image, and `servers`, in the stand-in; how to read it."""
    standin.catalog["server_types"] = [api_server_type("cx23", "x86", ("fsn1",), "")]
    standin.catalog["images"] = [api_image("ubuntu-24.04", "x86")]
    for server in servers:
        standin.add_server(server["name"], SwitchedMachine(), private_ips=(), labels=server["labels"])
    return HetznerAccess(standin.token, standin.url)


def _check(key_file: Path, servers: list[dict[str, Any]], **overrides: Any) -> list[str]:
    overrides = {"workers": [], **overrides}
    overrides["cluster"] = {"server_type": "cx23", "image": "ubuntu-24.04", **overrides.get("cluster", {})}
    config = _config(key_file, **overrides)
    settings = load_settings(config)
    with running_standin() as standin:
        access = _seeded(standin, servers)
        try:
            check_hetzner_project(
                settings, "dev", planned_names(settings, "dev", False), lambda: read_hetzner_project(access), OWNER
            )
        except SettingsError as refused:
            return [str(problem) for problem in refused.problems]
    return []


def _control_plane(name: str, **labels: str) -> dict[str, Any]:
    return {"name": name, "labels": {"hk3s-cluster": "shop", "hk3s-stack": "dev", "hk3s-role": "server", **labels}}


def test_a_new_server_name_is_refused_naming_the_one_to_set_back(ssh_key_file: Path) -> None:
    held = [_control_plane("shop-dev-srv", **{OWNER_LABEL: OWNER, NODE_LABEL: "srv"})]
    (problem,) = _check(ssh_key_file, held, server={"name": "cp"})
    assert problem.startswith("hk3s:server.name: this stack's control plane is the Hetzner server 'shop-dev-srv'")
    assert "second control-plane server" in problem and "set hk3s:server.name back to 'srv'" in problem
    # Made before the owner and node labels: known by its cluster and stack labels and its name.
    (problem,) = _check(ssh_key_file, [_control_plane("shop-dev-srv")], server={"name": "cp"})
    assert "set hk3s:server.name back to 'srv'" in problem
    # The control plane now an existing host: the Hetzner one would be dropped.
    existing = {"name": "srv", "kind": "existing", "address": "198.51.100.7"}
    (problem,) = _check(ssh_key_file, held, server=existing, workers=[{"name": "w1"}])
    assert "an existing host as hk3s:server" in problem


def test_a_renamed_cluster_and_other_stacks_control_planes_are_not_refused(ssh_key_file: Path) -> None:
    ours = _control_plane("shop-dev-srv", **{OWNER_LABEL: OWNER, NODE_LABEL: "srv"})
    assert _check(ssh_key_file, [ours], cluster={"name": "shop2"}) == []
    assert _check(ssh_key_file, [ours]) == []
    # Another Pulumi project's stack "dev" in the same Hetzner project: its owner label says so, or
    # (made before that label) its cluster label.
    other = _control_plane("web-dev-cp", **{OWNER_LABEL: "web.dev", NODE_LABEL: "cp"})
    legacy_other = {**_control_plane("web-dev-cp"), "labels": {**_control_plane("x")["labels"], "hk3s-cluster": "web"}}
    assert _check(ssh_key_file, [other, legacy_other]) == []


def test_renaming_the_server_is_refused_before_anything_is_registered(ssh_key_file: Path) -> None:
    """Under Pulumi mocks: the project holds this stack's control plane `srv`; with hk3s:server.name
    `cp` the program would register a second control-plane server (a new resource) and Pulumi
    would create it before refusing the protected one's delete. The servers the program makes
    carry the owner and node labels this check reads."""
    first = _run(_config(ssh_key_file), "dev")
    (srv,) = [s for s in first.of_type("hcloud:index/server:Server") if s.name == "srv"]
    assert srv.inputs["labels"][OWNER_LABEL] == OWNER and srv.inputs["labels"][NODE_LABEL] == "srv"
    mocks = ClusterMocks()
    mocks.hetzner_servers = [("shop-dev-srv", srv.inputs["labels"])]
    message, recording = _refused(_config(ssh_key_file, server={"name": "cp"}), mocks)
    assert "hk3s:server.name" in message and "back to 'srv'" in message
    assert recording.registrations == []


def _settings(key_file: Path) -> StackSettings:
    return load_settings(_config(key_file, workers=[], cluster={"server_type": "cx23", "image": "ubuntu-24.04"}))


def test_the_project_is_read_from_hetzners_api_with_get_calls_only(ssh_key_file: Path) -> None:
    """A type location Hetzner marks not `available` (sold out, or withdrawn there) cannot be
    ordered, whatever its deprecation says; the check only reads (a preview changes nothing)."""
    settings = _settings(ssh_key_file)
    with running_standin() as standin:
        access = _seeded(standin, [])
        standin.catalog["server_types"].append(api_server_type("cx33", "x86", ("fsn1",), ""))
        standin.catalog["server_types"][0]["locations"][0]["available"] = False
        with pytest.raises(SettingsError) as refused:
            check_hetzner_project(settings, "dev", [], lambda: read_hetzner_project(access), OWNER)
        assert "hk3s:cluster.server_type: server type 'cx23' cannot be ordered now in fsn1 (for srv); " in str(
            refused.value
        )
        assert "fsn1 offers: cx33" in str(refused.value)
        assert {method for method, _ in standin.requests} == {"GET"}, standin.requests
        assert ("GET", "/v1/server_types") in standin.requests and ("GET", "/v1/images") in standin.requests


def test_a_wrong_token_is_refused_naming_the_setting_and_the_fix(ssh_key_file: Path) -> None:
    settings = _settings(ssh_key_file)
    with running_standin() as standin:
        _seeded(standin, [])
        wrong = HetznerAccess("not-the-projects-token-0123456789", standin.url)
        with pytest.raises(SettingsError) as refused:
            check_hetzner_project(settings, "dev", [], lambda: read_hetzner_project(wrong), OWNER)
    (problem,) = refused.value.problems
    assert str(problem).startswith("hcloud:token: Hetzner's API at ")
    assert "answered unauthorized" in str(problem)
    assert "pulumi config set --secret hcloud:token" in str(problem)
    assert "not-the-projects-token" not in str(refused.value)


def test_an_unreachable_endpoint_is_refused_naming_the_setting(ssh_key_file: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    unreachable = HetznerAccess("a-token-0123456789", f"http://127.0.0.1:{port}/v1")
    with pytest.raises(SettingsError) as refused:
        check_hetzner_project(_settings(ssh_key_file), "dev", [], lambda: read_hetzner_project(unreachable), OWNER)
    (problem,) = refused.value.problems
    assert str(problem).startswith(f"hcloud:endpoint: the Hetzner API at http://127.0.0.1:{port}/v1 did not answer")
    assert "check hcloud:endpoint" in str(problem)
    assert "a-token-0123456789" not in str(refused.value)


def test_without_a_token_the_check_names_the_setting(ssh_key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HCLOUD_TOKEN", raising=False)
    with pytest.raises(SettingsError) as refused:
        check_hetzner_project(_settings(ssh_key_file), "dev", [], hetzner_project.read_hetzner_project, OWNER)
    assert "hcloud:token: the Hetzner project is read before anything is made, and there is no token" in str(
        refused.value
    )


def test_the_token_and_endpoint_are_the_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    """hcloud:token and hcloud:endpoint, else HCLOUD_TOKEN and HCLOUD_ENDPOINT, as the provider reads them."""
    monkeypatch.setenv("HCLOUD_TOKEN", "env-token")
    monkeypatch.setenv("HCLOUD_ENDPOINT", "http://127.0.0.1:1/v1")
    access = hetzner_project.hetzner_access()
    assert (access.token, access.endpoint) == ("env-token", "http://127.0.0.1:1/v1")
    monkeypatch.delenv("HCLOUD_ENDPOINT")
    assert hetzner_project.hetzner_access().endpoint == "https://api.hetzner.cloud/v1"
    # The stack's configuration comes first.
    pulumi.runtime.set_all_config({"hcloud:token": "config-token", "hcloud:endpoint": "http://h/v1"}, ["hcloud:token"])
    try:
        access = hetzner_project.hetzner_access()
    finally:
        pulumi.runtime.set_all_config({}, [])
    assert (access.token, access.endpoint) == ("config-token", "http://h/v1")
    assert "config-token" not in repr(access)
