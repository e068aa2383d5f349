"""The lab's Hetzner API stand-in (lab/hcloud_standin.py), called by Hetzner's own Python
client (`hcloud`, the version requirements.txt pins), as Hetzner's API reference documents each
call: the catalogue, networks and subnets, firewalls, placement groups, servers and their
actions, pagination, the rate limit and the documented errors.

Two stand-ins for the module:
- `api`: servers created through it are power switches alone (`switched_boot`): the API's
  rules (pagination, uniqueness, limits, a full placement group, protection, unknown ids)
  without booting anything.
- `cloud`: servers created through it are lab hosts (lab/hcloud_servers.py). One server is
  created as the program creates one (image, type, location, SSH key, user data from the
  program's own `cloud_config`, firewall, placement group, labels, public_net), then attached
  to a network: the one lab host of the module. It shows real cloud-init ran on the user data
  (the host serves exactly the key the user data pinned; the server's SSH key lets root in),
  its addresses, power off and on, the protection refusals, and that deleting it removes the
  host.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from hcloud import APIException, Client
from hcloud.actions import ActionFailedException
from hcloud.firewalls import FirewallResource, FirewallRule
from hcloud.images import Image
from hcloud.locations import Location
from hcloud.networks import NetworkSubnet
from hcloud.server_types import ServerType
from hcloud.servers import ServerCreatePublicNetwork
from hcloud.ssh_keys import BoundSSHKey

from lab.hcloud_servers import LabServer, LabServers
from lab.hcloud_standin import PLACEMENT_GROUP_SERVERS, HcloudStandin, SwitchedMachine, switched_boot
from lab.hosts import HostSpec, Lab
from providers.host_key_pair import cloud_config, generate_host_key

pytestmark = pytest.mark.lab

CX33, DEBIAN = ServerType(name="cx33"), Image(name="debian-12")
FSN1 = Location(name="fsn1")
SSH_RULE = FirewallRule(direction="in", protocol="tcp", port="22", source_ips=["0.0.0.0/0", "::/0"])


def _client(standin: HcloudStandin) -> Any:
    """Hetzner's client, typed Any here: its fields are Optional for every call, and each test
    reads what the stand-in answered (an absent field fails the test as an AttributeError)."""
    return Client(token=standin.token, api_endpoint=standin.url, poll_interval=0.2)


def refused(code: str, call: Callable[[], object]) -> APIException:
    """The APIException `call` raised; its code must be `code`."""
    with pytest.raises(APIException) as caught:
        call()
    assert caught.value.code == code, caught.value
    return caught.value


def _public_key(tmp: Path, name: str) -> str:
    key = tmp / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    return (tmp / f"{name}.pub").read_text().strip()


@dataclass
class Api:
    standin: HcloudStandin
    client: Any


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    standin = HcloudStandin(boot=switched_boot).start()
    try:
        yield Api(standin, _client(standin))
    finally:
        standin.stop()


def _create(api: Api, name: str, **options: Any) -> Any:
    created = api.client.servers.create(name, server_type=CX33, image=DEBIAN, location=FSN1, **options)
    created.action.wait_until_finished()
    return api.client.servers.get_by_id(created.server.id)


def test_catalogue_serves_the_dev_stack_names(api: Api) -> None:
    client = api.client
    assert client.server_types.get_by_name("cx33").cores == 4
    assert client.server_types.get_by_name("cx22").locations[0].deprecation is not None
    assert client.locations.get_by_name("nbg1").network_zone == "eu-central"
    image = client.images.get_by_name_and_architecture("debian-12", "x86")
    assert (image.os_flavor, image.os_version, image.deprecation) == ("debian", "12", None)
    refused("not_found", lambda: client.images.get_by_id(1))
    refused("not_found", lambda: client.server_types.get_by_id(1))


def test_a_deprecated_image_is_listed_on_request_and_still_creates_servers(api: Api) -> None:
    api.standin.deprecate_image("ubuntu-22.04", "2026-01-01T00:00:00+00:00")
    names = {image.name for image in api.client.images.get_all()}
    assert "ubuntu-22.04" not in names and "debian-12" in names
    listed = {image.name: image for image in api.client.images.get_all(include_deprecated=True)}
    assert listed["ubuntu-22.04"].deprecation is not None
    created = api.client.servers.create(
        "on-old-ubuntu", server_type=CX33, image=Image(name="ubuntu-22.04"), location=FSN1
    )
    created.action.wait_until_finished()
    assert api.client.servers.get_by_id(created.server.id).image.deprecation is not None


def test_create_runs_an_action_then_succeeds_and_unknown_ids_are_not_found(api: Api) -> None:
    created = api.client.servers.create("actions-1", server_type=CX33, image=DEBIAN, location=FSN1)
    assert created.server.status == "initializing"
    assert created.action.command == "create_server" and created.action.status == "running"
    assert [a.command for a in created.next_actions] == ["start_server"]
    assert created.root_password  # no SSH key given: Hetzner mails a root password
    created.action.wait_until_finished()
    assert api.client.actions.get_by_id(created.action.id).status == "success"
    assert api.client.servers.get_by_id(created.server.id).status == "running"
    # hcloud-go's action waiter polls the list: GET /actions?id=..&id=..&sort=status&sort=id.
    ids = [created.action.id, created.next_actions[0].id]
    listed = requests.get(
        f"{api.standin.url}/actions",
        params={"id": ids, "sort": ["status", "id"]},
        headers={"Authorization": f"Bearer {api.standin.token}"},
        timeout=10,
    ).json()
    assert sorted((a["id"], a["status"]) for a in listed["actions"]) == sorted((i, "success") for i in ids)
    for call in (
        lambda: api.client.servers.get_by_id(999999),
        lambda: api.client.networks.get_by_id(999999),
        lambda: api.client.firewalls.get_by_id(999999),
        lambda: api.client.placement_groups.get_by_id(999999),
        lambda: api.client.actions.get_by_id(999999),
        lambda: api.client.ssh_keys.get_by_id(999999),
    ):
        refused("not_found", call)
    refused(
        "invalid_input", lambda: api.client.servers.create("bad", server_type=ServerType(name="cx99"), image=DEBIAN)
    )
    big = "#cloud-config\n" + "#" * 32 * 1024
    refused("invalid_input", lambda: api.client.servers.create("big", server_type=CX33, image=DEBIAN, user_data=big))


def test_names_are_unique_per_project(api: Api, tmp_path: Path) -> None:
    client = api.client
    client.networks.create("uniq", ip_range="10.9.0.0/16")
    refused("uniqueness_error", lambda: client.networks.create("uniq", ip_range="10.8.0.0/16"))
    client.firewalls.create("uniq")
    refused("uniqueness_error", lambda: client.firewalls.create("uniq"))
    client.placement_groups.create("uniq", "spread")
    refused("uniqueness_error", lambda: client.placement_groups.create("uniq", "spread"))
    client.ssh_keys.create("uniq", _public_key(tmp_path, "a"))
    refused("uniqueness_error", lambda: client.ssh_keys.create("uniq", _public_key(tmp_path, "b")))
    _create(api, "uniq")
    refused("uniqueness_error", lambda: client.servers.create("uniq", server_type=CX33, image=DEBIAN))


def test_lists_are_paged(api: Api) -> None:
    for n in range(27):
        api.client.placement_groups.create(f"paged-{n:02d}", "spread", labels={"paged": "yes"})
    first = api.client.placement_groups.get_list(label_selector="paged=yes")
    meta = first.meta.pagination
    assert (len(first.placement_groups), meta.page, meta.per_page, meta.next_page, meta.last_page) == (25, 1, 25, 2, 2)
    assert meta.total_entries == 27
    second = api.client.placement_groups.get_list(label_selector="paged=yes", page=2)
    assert len(second.placement_groups) == 2 and second.meta.pagination.previous_page == 1
    assert len(api.client.placement_groups.get_all(label_selector="paged=yes")) == 27
    raw = requests.get(
        f"{api.standin.url}/placement_groups",
        params={"per_page": 500},
        headers={"Authorization": f"Bearer {api.standin.token}"},
        timeout=10,
    ).json()
    assert raw["meta"]["pagination"]["per_page"] == 50  # Hetzner's most per page


def test_a_spread_group_holds_ten_servers_and_a_server_one_group(api: Api) -> None:
    group = api.client.placement_groups.create("full", "spread").placement_group
    created = [
        api.client.servers.create(f"spread-{n}", server_type=CX33, image=DEBIAN, placement_group=group)
        for n in range(PLACEMENT_GROUP_SERVERS)
    ]
    for each in created:
        each.action.wait_until_finished()
    assert len(api.client.placement_groups.get_by_id(group.id).servers) == PLACEMENT_GROUP_SERVERS
    before = len(api.standin.servers)
    refused(
        "placement_error",
        lambda: api.client.servers.create("spread-10", server_type=CX33, image=DEBIAN, placement_group=group),
    )
    assert len(api.standin.servers) == before  # nothing was created
    other = api.client.placement_groups.create("other", "spread").placement_group
    member = api.client.servers.get_by_name("spread-0")
    member.power_off().wait_until_finished()
    refused("already_in_placement_group", lambda: member.add_to_placement_group(other))


def test_the_project_limit_refuses_one_server_more(api: Api) -> None:
    api.standin.limits["servers"] = len(api.standin.servers)
    try:
        refused("resource_limit_exceeded", lambda: api.client.servers.create("over", server_type=CX33, image=DEBIAN))
    finally:
        api.standin.limits["servers"] = 1000


def test_firewalls_take_rules_and_resources_as_documented(api: Api) -> None:
    client = api.client
    server = _create(api, "fw-target")
    refused(
        "invalid_input",
        lambda: client.firewalls.create("no-port", rules=[FirewallRule("in", "tcp", source_ips=["0.0.0.0/0"])]),
    )
    firewall = client.firewalls.create("fw", rules=[SSH_RULE]).firewall
    [action] = firewall.apply_to_resources([FirewallResource(type="server", server=server)])
    assert action.command == "apply_firewall"
    refused("firewall_already_applied", lambda: firewall.apply_to_resources([FirewallResource("server", server)]))
    assert [f.firewall.id for f in client.servers.get_by_id(server.id).public_net.firewalls] == [firewall.id]
    icmp = FirewallRule("in", "icmp", source_ips=["0.0.0.0/0"])
    firewall.set_rules([SSH_RULE, icmp])
    assert [r.protocol for r in client.firewalls.get_by_id(firewall.id).rules] == ["tcp", "icmp"]
    refused("resource_in_use", firewall.delete)
    firewall.remove_from_resources([FirewallResource("server", server)])
    refused("firewall_resource_not_found", lambda: firewall.remove_from_resources([FirewallResource("server", server)]))
    assert firewall.delete() is True


def test_networks_and_subnets(api: Api) -> None:
    client = api.client
    refused("invalid_input", lambda: client.networks.create("public", ip_range="8.8.0.0/16"))
    network = client.networks.create("net", ip_range="10.0.0.0/16")
    network.add_subnet(NetworkSubnet(type="cloud", ip_range="10.0.1.0/24", network_zone="eu-central"))
    network.add_subnet(NetworkSubnet(type="cloud", ip_range="10.0.2.0/24", network_zone="eu-central"))
    refused(
        "invalid_input",
        lambda: network.add_subnet(NetworkSubnet(type="cloud", ip_range="10.1.0.0/24", network_zone="eu-central")),
    )
    server = _create(api, "net-member")
    server.attach_to_network(network).wait_until_finished()
    refused("server_already_attached", lambda: server.attach_to_network(network))
    [private] = client.servers.get_by_id(server.id).private_net
    # The last subnet created (terraform-provider-hcloud: "the Server will be assigned an IP in
    # the last created subnet"), its first address.
    assert private.network.id == network.id and private.ip == "10.0.2.1"
    refused("resource_in_use", lambda: network.delete_subnet(NetworkSubnet(ip_range="10.0.2.0/24")))
    network.delete_subnet(NetworkSubnet(ip_range="10.0.1.0/24")).wait_until_finished()
    other = _create(api, "net-member-2")
    refused("ip_not_available", lambda: other.attach_to_network(network, ip="10.0.2.1"))
    other.attach_to_network(network, ip="10.0.2.9").wait_until_finished()
    assert client.servers.get_by_id(other.id).private_net[0].ip == "10.0.2.9"
    other.detach_from_network(network).wait_until_finished()
    assert client.servers.get_by_id(other.id).private_net == []
    network.change_protection(delete=True)
    refused("protected", network.delete)
    network.change_protection(delete=False)
    assert network.delete() is True  # attached servers are detached
    assert client.servers.get_by_id(server.id).private_net == []


def test_rate_limit_headers_count_down_and_an_empty_budget_is_refused() -> None:
    standin = HcloudStandin(boot=switched_boot, rate_limit=3).start()
    try:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {standin.token}"
        answers = [session.get(f"{standin.url}/locations", timeout=10) for _ in range(4)]
        assert [a.headers["RateLimit-Remaining"] for a in answers[:3]] == ["2", "1", "0"]
        assert {a.headers["RateLimit-Limit"] for a in answers} == {"3"}
        assert int(answers[0].headers["RateLimit-Reset"]) >= int(time.time())
        assert answers[3].status_code == 429 and answers[3].json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        standin.stop()


# The lab: one server created through the API is one lab host.


@dataclass
class Cloud:
    lab: Lab
    standin: HcloudStandin
    client: Any
    servers: LabServers
    server: Any
    machine: LabServer
    pinned_key: str  # the host key the user data gives
    login_key: Path  # the private half of the server's SSH key
    network_id: int
    firewall_id: int
    group_id: int
    seconds: dict[str, float]


@pytest.fixture(scope="module")
def cloud(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    tmp = tmp_path_factory.mktemp("hcloud")
    servers = LabServers(lab)
    standin = HcloudStandin(boot=servers).start()
    try:
        client = _client(standin)
        key = client.ssh_keys.create("operator", _public_key(tmp, "login"))
        network = client.networks.create("dev-dev-network", ip_range="10.0.0.0/16")
        network.add_subnet(NetworkSubnet(type="cloud", ip_range="10.0.1.0/24", network_zone="eu-central"))
        firewall = client.firewalls.create("dev-dev-ssh-only", rules=[SSH_RULE]).firewall
        group = client.placement_groups.create("dev-dev-batch-fsn1-1", "spread").placement_group
        private, public = generate_host_key()
        started = time.monotonic()
        created = client.servers.create(
            "dev-dev-worker-1",
            server_type=ServerType(name="cx23"),
            image=DEBIAN,
            location=FSN1,
            ssh_keys=[BoundSSHKey(client.ssh_keys, {"id": key.id})],
            user_data=cloud_config(private, public),
            labels={"hk3s.cluster": "dev"},
            firewalls=[firewall],
            placement_group=group,
            public_net=ServerCreatePublicNetwork(enable_ipv4=True, enable_ipv6=True),
        )
        created.action.wait_until_finished(max_retries=600)
        booted = time.monotonic() - started
        server = client.servers.get_by_id(created.server.id)
        server.attach_to_network(network).wait_until_finished()
        machine = servers.booted[server.id]
        yield Cloud(
            lab,
            standin,
            client,
            servers,
            server,
            machine,
            public,
            tmp / "login",
            network.id,
            firewall.id,
            group.id,
            {"create action": booted},
        )
    finally:
        standin.stop()


def _ssh(cloud: Cloud, address: str, command: str, known_hosts: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh", "-i", str(cloud.login_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "ConnectTimeout=3", f"root@{address}", command,
        ],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_a_created_server_is_a_lab_host_whose_keys_cloud_init_wrote(cloud: Cloud, tmp_path: Path) -> None:
    server = cloud.client.servers.get_by_id(cloud.server.id)
    host = cloud.machine.host
    assert server.status == "running" and host.is_running and host.public_ip is not None
    assert server.public_net.ipv4.ip == host.public_ip
    assert server.server_type.name == "cx23" and server.image.name == "debian-12"
    assert server.placement_group.id == cloud.group_id and server.labels == {"hk3s.cluster": "dev"}
    assert [f.firewall.id for f in server.public_net.firewalls] == [cloud.firewall_id]
    [private] = server.private_net
    assert private.network.id == cloud.network_id and private.ip == "10.0.1.1"
    assert any(a.startswith("10.0.1.1/") for a in host.addresses()["enp7s0"])
    # Only the key the user data pinned: a login that trusts it alone gets in with the server's
    # SSH key (cloud-init put it in root's authorized_keys from the metadata).
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.public_ip} {cloud.pinned_key}\n")
    deadline = time.monotonic() + 180
    login = _ssh(cloud, host.public_ip, "hostname; cloud-init status --wait", known)
    while login.returncode == 255 and time.monotonic() < deadline:  # ssh's own failure: not up yet
        time.sleep(1)
        login = _ssh(cloud, host.public_ip, "hostname; cloud-init status --wait", known)
    assert login.returncode == 0, (login.stdout, login.stderr)
    assert login.stdout.split()[0] == "dev-dev-worker-1"  # cloud-init set the server's name
    assert "status: done" in login.stdout
    served = subprocess.run(
        ["ssh-keyscan", "-T", "5", host.public_ip], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    offered = {" ".join(line.split()[1:3]) for line in served.splitlines() if line and not line.startswith("#")}
    assert offered == {" ".join(cloud.pinned_key.split()[:2])}
    cloud.machine.wait_cloud_init()
    assert host.run(["cat", "/var/lib/cloud/data/instance-id"]).stdout.strip() == str(server.id)


def test_protection_refuses_delete_and_rebuild(cloud: Cloud) -> None:
    server = cloud.client.servers.get_by_id(cloud.server.id)
    refused("invalid_input", lambda: server.change_protection(delete=True, rebuild=False))
    server.change_protection(delete=True, rebuild=True).wait_until_finished()
    refused("protected", server.delete)
    refused("protected", lambda: server.rebuild(DEBIAN))
    assert cloud.machine.host.is_running
    server.change_protection(delete=False, rebuild=False).wait_until_finished()


def test_power_off_stops_the_host_and_power_on_boots_it(cloud: Cloud) -> None:
    server = cloud.client.servers.get_by_id(cloud.server.id)
    server.power_off().wait_until_finished()
    assert not cloud.machine.host.is_running
    assert cloud.client.servers.get_by_id(server.id).status == "off"
    server.power_on().wait_until_finished()
    assert cloud.machine.host.is_running
    assert cloud.client.servers.get_by_id(server.id).status == "running"
    cloud.lab.wait_ssh_ready([cloud.machine.host], timeout=120)


def test_a_server_of_an_image_the_lab_cannot_boot_ends_its_action_in_error(cloud: Cloud) -> None:
    created = cloud.client.servers.create("ubuntu-1", server_type=CX33, image=Image(name="ubuntu-24.04"))
    with pytest.raises(ActionFailedException):
        created.action.wait_until_finished()
    action = cloud.client.actions.get_by_id(created.action.id)
    assert action.status == "error" and "Debian 12" in action.error["message"]
    assert created.server.id not in cloud.servers.booted


def test_deleting_the_server_removes_the_host(cloud: Cloud) -> None:
    server = cloud.client.servers.get_by_id(cloud.server.id)
    host = cloud.machine.host
    server.delete().wait_until_finished()
    refused("not_found", lambda: cloud.client.servers.get_by_id(server.id))
    assert host.name not in cloud.lab.hosts and not host.dir.exists()
    left = cloud.lab.leftovers()
    assert host.netns not in left.netns
    assert not {cloud.lab._veth(host.index, kind) for kind in "prv"} & set(left.links)
    assert not any(str(host.dir) in mount for mount in left.mounts)
    assert not any(str(host.dir) in process for process in left.processes)
    assert cloud.client.firewalls.get_by_id(cloud.firewall_id).applied_to == []
    assert cloud.client.placement_groups.get_by_id(cloud.group_id).servers == []
    assert cloud.client.networks.get_by_id(cloud.network_id).servers == []


def test_registered_switched_servers_are_unchanged(api: Api) -> None:
    """The stand-in's first users register machines (`add_server`): their view is as before."""
    machine = SwitchedMachine()
    server = api.standin.add_server("registered", machine, public_ipv4="198.51.100.7", private_ips=("10.0.0.7",))
    view = api.client.servers.get_by_id(server)
    assert view.public_net.ipv4.ip == "198.51.100.7" and view.public_net.ipv6 is None
    assert [(p.network.id, p.ip) for p in view.private_net] == [(1, "10.0.0.7")]


def test_a_plain_lab_host_runs_no_cloud_init(lab: Lab) -> None:
    """cloud-init is in every host's base tree, but off (/etc/cloud/cloud-init.disabled) unless the
    host is a created server: the rest of the lab's hosts boot as they did without it."""
    host = lab.add_host(HostSpec("plain-1"))
    lab.wait_ssh_ready([host], timeout=180)
    status = host.run(["cloud-init", "status"], check=False)
    assert "status: disabled" in status.stdout, (status.stdout, status.stderr)
    assert not (host.root / "var/lib/cloud/instance").exists()
