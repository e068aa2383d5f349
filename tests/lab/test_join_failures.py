"""Each way a join fails in the field (wrong cluster's CA, expired or used token, a
kubelet that never reports, blocked ports, unmanaged firewalls) that can happen here,
provoked for real on lab hosts against the k3s stand-in and a real API server.
The join stops with the host, the failed check and the fix."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import re
import shutil
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from cluster_settings.models import ClusterSettings
from host_scripts import script_path
from lab.hosts import Host, Lab
from lab.registration_attempts import start_agent
from lab.stack_harness import (
    LONGHORN_PACKAGES,
    k3s_snapshot,
    k3s_version,
    server_spec,
    skip_without_lab_binaries,
    wait_until,
    worker_spec,
)
from node_operations.join import (
    JOIN_PERMIT_POLICY,
    PERMITS_CONFIGMAP,
    Joiner,
    JoinError,
    JoinSpec,
    join_worker,
)
from node_operations.join_host import READ_DEADLINE_SECONDS
from node_operations.k3s_install import (
    INSTALL_DEADLINE_SECONDS,
    K3sBinary,
    ServerInstalled,
    ServerSpec,
    install_k3s,
    install_server,
)
from remote_access.kube import ClusterApi
from remote_access.ssh import SshError, SshTarget, open_session

pytestmark = pytest.mark.lab
TAINT = "hk3s.dev/validating=true:NoSchedule"


def target(lab: Lab, host: Host) -> SshTarget:
    assert host.public_ip
    return SshTarget(node=host.name, address=host.public_ip, private_key=lab.ssh_private_key_path.read_text())


def binary() -> K3sBinary:
    path, digest = k3s_snapshot()
    return K3sBinary(version=k3s_version(), local_path=path, sha256=digest)


def install(lab: Lab, host: Host) -> ServerInstalled:
    assert host.public_ip
    spec = ServerSpec(
        node=host.name,
        node_ip=host.public_ip,
        external_ip=host.public_ip,
        pod_cidr="10.42.0.0/16",
        service_cidr="10.43.0.0/16",
        flannel_backend="vxlan",
        binary=binary(),
    )
    return asyncio.run(install_server(target(lab, host), spec, lambda _line: None))


@dataclasses.dataclass
class Cluster:
    server: Host
    installed: ServerInstalled
    other_server: Host
    other_installed: ServerInstalled


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("jf-server"))
    other = lab.add_host(server_spec("jf-other"))
    lab.wait_ssh_ready([server, other])
    yield Cluster(server, install(lab, server), other, install(lab, other))


def kubectl_create(cluster: Cluster, manifest: str) -> None:
    cluster.server.run(["sh", "-c", 'printf "%s" "$1" | /usr/local/bin/k3s kubectl create -f -', "-", manifest])


def spec_for(cluster: Cluster, worker: Host, **overrides: Any) -> JoinSpec:
    assert worker.public_ip and cluster.server.public_ip
    values: dict[str, Any] = dict(
        node=worker.name,
        node_ip=worker.public_ip,
        external_ip=worker.public_ip,
        server_url=f"https://{cluster.server.public_ip}:6443",
        ca_hash=cluster.installed.ca_hash,
        binary=binary(),
        pod_network="vxlan",
        network_mode="public",
        validation_taint=TAINT,
        validation_image=ClusterSettings.model_fields["validation_image"].default,
        recorded_nodes=(cluster.server.name, worker.name),
        register_deadline=30,
        ready_deadline=15,
    )
    values.update(overrides)
    return JoinSpec(**values)


def fresh_worker(lab: Lab, name: str) -> Host:
    host = lab.add_host(worker_spec(name))
    lab.wait_ssh_ready([host])
    return host


def join(
    lab: Lab, cluster: Cluster, worker: Host, on_line: Callable[[str], None] | None = None, **overrides: Any
) -> JoinError:
    lines: list[str] = []
    with pytest.raises(JoinError) as caught:
        asyncio.run(
            join_worker(
                target(lab, worker),
                target(lab, cluster.server),
                spec_for(cluster, worker, **overrides),
                on_line or lines.append,
            )
        )
    return caught.value


def token_life_seconds(cluster: Cluster, line: str) -> float | None:
    """For a progress line announcing a join token, how long the server will honour it: its
    Secret's expiration less its creation, read on the server the moment the line is shown."""
    found = re.search(r"join token (\w+) created", line)
    if found is None:
        return None
    secret = json.loads(
        cluster.server.run(
            [
                "/usr/local/bin/k3s",
                "kubectl",
                "get",
                "secret",
                "-n",
                "kube-system",
                f"bootstrap-token-{found[1]}",
                "-o",
                "json",
            ]
        ).stdout
    )
    expiration = base64.b64decode(secret["data"]["expiration"]).decode()
    created = secret["metadata"]["creationTimestamp"]
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return (datetime.strptime(expiration, stamp) - datetime.strptime(created, stamp)).total_seconds()


def test_ca_hash_mismatch_stops_the_join(lab: Lab, cluster: Cluster) -> None:
    # The token comes from one cluster, the agent is sent to another server: the classic
    # "couldn't validate the identity of the API Server".
    worker = fresh_worker(lab, "jf-ca")
    assert cluster.other_server.public_ip
    lives: list[float] = []

    def on_line(line: str) -> None:
        life = token_life_seconds(cluster, line)
        if life is not None:
            lives.append(life)

    error = join(lab, cluster, worker, on_line, server_url=f"https://{cluster.other_server.public_ip}:6443")
    # The token lives no longer than the join that made it could last: the agent's start (its
    # install command's deadline) and the wait for its registration, plus a minute for an API
    # restart on the way. A join that fails, however it fails (a killed run that never deletes
    # the token, a server that cannot delete it), leaves no live token past its own deadlines.
    spec = spec_for(cluster, worker)
    bound = 3 * READ_DEADLINE_SECONDS + INSTALL_DEADLINE_SECONDS + spec.register_deadline + 60
    assert len(lives) == 1 and spec.register_deadline < lives[0] <= bound, (lives, bound)
    assert error.check == "ca-hash"
    message = str(error)
    assert message.startswith("jf-ca: join stopped at ca-hash")
    assert cluster.installed.ca_hash in message and cluster.other_installed.ca_hash in message
    # Advice names only commands the host has: this program writes its own units, so k3s's
    # install.sh uninstall scripts do not exist there.
    assert "systemctl stop k3s-agent" in message and "uninstall" not in message
    # No token is left behind, on the host or in the cluster.
    assert worker.run(["test", "-e", "/etc/rancher/k3s/hk3s-join-token"], check=False).returncode != 0
    tokens = cluster.server.run(
        ["/usr/local/bin/k3s", "kubectl", "get", "secrets", "-n", "kube-system", "-o", "json"]
    ).stdout
    assert "bootstrap.kubernetes.io/token" not in tokens


def test_api_unreachable_names_the_port(lab: Lab, cluster: Cluster) -> None:
    worker = fresh_worker(lab, "jf-noapi")
    assert cluster.server.public_ip
    worker.run(["nft", "add table inet lab_block"])
    worker.run(["nft", "add chain inet lab_block out { type filter hook output priority 0; }"])
    worker.run(
        ["nft", f"add rule inet lab_block out ip daddr {cluster.server.public_ip} tcp dport 6443 reject with tcp reset"]
    )
    error = join(lab, cluster, worker)
    assert error.check == "api-reachable", str(error)
    assert "open 6443/tcp" in str(error) and str(error).startswith("jf-noapi:")
    # The agent's log names no server (it reaches it through its load balancer on 127.0.0.1,
    # whose dial errors are debug-level, as k3s's): the join's own connection from the node
    # to the API port names the address and the port.
    assert f"cannot reach the Kubernetes API at {cluster.server.public_ip}:6443" in str(error), str(error)

    # Real k3s logs the dial errors of a bootstrapped agent (through its local load balancer) at
    # debug level only, so the diagnosis also asks the network itself: a connection from the
    # node to the API port, which fails here whatever the agent's log says.
    async def asked_from_the_node() -> JoinError | None:
        async with open_session(target(lab, worker)) as w, open_session(target(lab, cluster.server)) as s:
            return await Joiner(spec_for(cluster, worker), w, s, lambda _line: None)._api_unreachable_from_node()

    blocked = asyncio.run(asked_from_the_node())
    assert blocked is not None and blocked.check == "api-reachable"
    assert f"{cluster.server.public_ip}:6443" in str(blocked) and "open 6443/tcp" in str(blocked)
    worker.run(["nft", "delete table inet lab_block"])
    assert asyncio.run(asked_from_the_node()) is None


def _agent_with_token(lab: Lab, cluster: Cluster, worker: Host, token_value: str, node_name: str) -> JoinError:
    """Start the agent on `worker` with a given token, then wait for its registration."""
    since = start_agent(lab, worker, cluster.server, token_value, node_name)

    async def scenario() -> None:
        async with open_session(target(lab, worker)) as session, open_session(target(lab, cluster.server)) as server:
            joiner = Joiner(spec_for(cluster, worker, node=node_name), session, server, lambda _line: None)
            await joiner.wait_registered(since)

    with pytest.raises(JoinError) as caught:
        asyncio.run(scenario())
    return caught.value


def _make_token(cluster: Cluster, description: str) -> str:
    return cluster.server.run(
        ["/usr/local/bin/k3s", "token", "create", "--ttl", "10m", "--description", description]
    ).stdout.strip()


def test_deleted_token_is_diagnosed(lab: Lab, cluster: Cluster) -> None:
    # A token that expired or was already used is refused. A used token is deleted.
    worker = fresh_worker(lab, "jf-used")
    token = _make_token(cluster, "jf-used")
    token_id = token.split("::")[1].split(".")[0]
    cluster.server.run(["/usr/local/bin/k3s", "token", "delete", token_id])
    error = _agent_with_token(lab, cluster, worker, token, "jf-used")
    assert error.check == "token", str(error)
    assert "expired" in str(error) and "already used" in str(error)


def test_token_made_for_another_node_cannot_register_it(lab: Lab, cluster: Cluster) -> None:
    worker = fresh_worker(lab, "jf-intruder")

    async def permit_only(name: str) -> None:
        async with open_session(target(lab, cluster.server)) as server:
            api = ClusterApi(server)
            await api.apply(JOIN_PERMIT_POLICY)
            patch = json.dumps({"data": {name: "now"}})
            await api.kubectl(
                ["patch", "configmap", PERMITS_CONFIGMAP, "-n", "kube-system", "--type", "merge", "-p", patch]
            )

    # The program is joining jf-rightful: the token and the permit are for it alone.
    asyncio.run(permit_only("jf-rightful"))
    token = _make_token(cluster, "jf-rightful")
    error = _agent_with_token(lab, cluster, worker, token, "jf-intruder")
    assert error.check == "token-node", str(error)
    assert "made for another node" in str(error)
    nodes = cluster.server.run(["/usr/local/bin/k3s", "kubectl", "get", "nodes", "-o", "name"]).stdout
    assert "jf-intruder" not in nodes


def test_kubelet_unreachable_fails_validation(lab: Lab, cluster: Cluster) -> None:
    worker = fresh_worker(lab, "jf-nokubelet")
    worker.run(["nft", "add table inet lab_block"])
    worker.run(["nft", "add chain inet lab_block in { type filter hook input priority 0; }"])
    worker.run(["nft", "add rule inet lab_block in tcp dport 10250 reject with tcp reset"])
    error = join(lab, cluster, worker)
    assert error.check == "kubelet-reachable", str(error)
    assert "10250" in str(error)


def test_registered_but_never_ready(lab: Lab, cluster: Cluster) -> None:
    # A Node whose kubelet never reports ("Waiting for a healthy kubelet").
    manifest = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "jf-ghost"}})
    kubectl_create(cluster, manifest)

    async def scenario() -> None:
        async with open_session(target(lab, cluster.server)) as server:
            joiner = Joiner(spec_for(cluster, cluster.server, node="jf-ghost"), server, server, lambda _line: None)
            await joiner.wait_ready()

    with pytest.raises(JoinError) as caught:
        asyncio.run(scenario())
    assert caught.value.check == "ready"
    assert str(caught.value).startswith("jf-ghost: join stopped at ready: the node registered but was not Ready")


def test_unrecorded_worker_is_refused(lab: Lab, cluster: Cluster) -> None:
    # jf-ghost (above) or any node the stack does not list stops the next join.
    manifest = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "jf-stray"}})
    kubectl_create(cluster, manifest)
    worker = fresh_worker(lab, "jf-next")
    error = join(lab, cluster, worker)
    assert error.check == "unrecorded-workers"
    assert "jf-stray" in str(error) and "hk3s:workers" in str(error)
    cluster.server.run(
        ["/usr/local/bin/k3s", "kubectl", "delete", "node", "jf-stray", "jf-ghost", "--ignore-not-found"]
    )


def test_foreign_kubernetes_state_is_refused(lab: Lab, cluster: Cluster) -> None:
    worker = fresh_worker(lab, "jf-stale")
    worker.run(["mkdir", "-p", "/var/lib/rancher/k3s/agent"])
    cluster.server.run(
        ["/usr/local/bin/k3s", "kubectl", "delete", "node", "jf-stray", "jf-ghost", "--ignore-not-found"]
    )
    error = join(lab, cluster, worker, recorded_nodes=_recorded(cluster, worker))
    assert error.check == "preflight"
    assert "/var/lib/rancher/k3s/agent" in str(error) and "CA hash mismatch" in str(error)
    # Preflight changed nothing on the host: no k3s installed.
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0


def _recorded(cluster: Cluster, worker: Host) -> tuple[str, ...]:
    names = cluster.server.run(["/usr/local/bin/k3s", "kubectl", "get", "nodes", "-o", "name"]).stdout.split()
    return tuple({name.removeprefix("node/") for name in names} | {worker.name})


def test_unreachable_recorded_node_stops_the_join(lab: Lab, cluster: Cluster) -> None:
    # Commands that update every node stop at a powered-off one.
    down = fresh_worker(lab, "jf-down")
    peer = target(lab, down)
    down.power_off()
    worker = fresh_worker(lab, "jf-blocked")
    error = join(lab, cluster, worker, peers=(peer,), recorded_nodes=_recorded(cluster, worker))
    assert error.check == "ssh-peers", str(error)
    assert "jf-down" in str(error) and "fence" in str(error)
    # Nothing was changed on the joining host.
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0


def test_unmanaged_active_firewall_stops_the_join_listing_rules(lab: Lab, cluster: Cluster) -> None:
    # A firewall the program does not manage stops the join; the operator gets the rules to add.
    from node_operations.firewall_plan import inbound_rules  # noqa: PLC0415

    worker = fresh_worker(lab, "jf-opfw")
    assert worker.public_ip and cluster.server.public_ip
    worker.run(["nft", "add table inet operator"])
    worker.run(["nft", "add chain inet operator input { type filter hook input priority 0; policy drop; }"])
    worker.run(["nft", "add rule inet operator input ct state established,related accept"])
    worker.run(["nft", "add rule inet operator input iif lo accept"])
    worker.run(["nft", "add rule inet operator input tcp dport 22 accept"])
    required = tuple(
        inbound_rules(
            role="worker",
            node=worker.name,
            peers={cluster.server.name: cluster.server.public_ip, worker.name: worker.public_ip},
            server=cluster.server.name,
            pod_network="vxlan",
        )
    )
    error = join(lab, cluster, worker, operator_firewall_rules=required, recorded_nodes=_recorded(cluster, worker))
    assert error.check == "firewall", str(error)
    assert "10250" in str(error) and "8472" in str(error) and cluster.server.public_ip in str(error)
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0


def test_unmanaged_host_with_no_firewall_at_all_stops_the_join_before_anything_changes(
    lab: Lab, cluster: Cluster
) -> None:
    # The operator runs this node's firewall (hk3s:firewall.managed false) but none is active:
    # every port the host listens on is open to whoever reaches it. The join stops, naming the
    # host and the fix, unless the stack acknowledges running without one.
    from node_operations.firewall_plan import inbound_rules  # noqa: PLC0415

    worker = fresh_worker(lab, "jf-nofw")
    assert worker.public_ip and cluster.server.public_ip
    assert worker.run(["nft", "list", "ruleset"]).stdout.strip() == "", "the lab host runs a firewall"
    required = tuple(
        inbound_rules(
            role="worker",
            node=worker.name,
            peers={cluster.server.name: cluster.server.public_ip, worker.name: worker.public_ip},
            server=cluster.server.name,
            pod_network="vxlan",
        )
    )
    error = join(lab, cluster, worker, operator_firewall_rules=required, recorded_nodes=_recorded(cluster, worker))
    assert error.check == "firewall", str(error)
    message = str(error)
    assert worker.name in message and "no active host firewall" in message
    assert "hk3s:firewall.managed" in message and "hk3s:firewall.none_acknowledged" in message
    # Nothing was changed on the host: no k3s, no firewall.
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0
    assert worker.run(["nft", "list", "ruleset"]).stdout.strip() == ""


def _server_props(lab: Lab, host: Host, *, firewall_managed: bool) -> dict[str, Any]:
    """A K3sServer resource's inputs for `host` in public mode, as ClusterServer builds them."""
    from providers.inputs import K3sRelease, NodeLogin  # noqa: PLC0415
    from providers.k3s_server import K3sServerInputs  # noqa: PLC0415

    assert host.public_ip
    path, digest = k3s_snapshot()
    return K3sServerInputs(
        login=NodeLogin(
            node=host.name,
            address=host.public_ip,
            private_key=lab.ssh_private_key_path.read_text(),
            recorded_host_key=host.ssh_host_public_key,
        ),
        k3s=K3sRelease(k3s_version=k3s_version(), k3s_binary=str(path), k3s_sha256=digest),
        pod_cidr="10.42.0.0/16",
        service_cidr="10.43.0.0/16",
        flannel_backend="vxlan",
        pod_network="vxlan",
        node_ip=host.public_ip,
        node_external_ip=host.public_ip,
        network_mode="public",
        firewall_managed=firewall_managed,
    ).props()


def test_a_server_with_no_firewall_at_all_is_refused_before_anything_changes(lab: Lab) -> None:
    # The server too: the operator runs its firewall (hk3s:firewall.managed false) and none is
    # active. The K3sServer resource's create stops before the host preparation, naming the
    # host and the setting; with the acknowledgement it goes on (the lab harness's stacks).
    from providers.k3s_server import K3sServerProvider  # noqa: PLC0415

    host = lab.add_host(server_spec("jf-srv-nofw"))
    lab.wait_ssh_ready([host])
    assert host.public_ip
    host.run(["touch", "/run/hk3s-test-before"])
    props = _server_props(lab, host, firewall_managed=False)
    with pytest.raises(SshError) as caught:
        K3sServerProvider().create(props)
    message = str(caught.value)
    assert host.name in message and "no active host firewall" in message
    assert "hk3s:firewall.none_acknowledged" in message and "hk3s:firewall.managed" in message
    assert host.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0
    # No file of the host preparation or the install: nothing under /etc, /usr/local or k3s's
    # data is newer than the attempt.
    changed = host.run("find /etc /usr/local /var/lib/rancher -newer /run/hk3s-test-before 2>/dev/null", check=False)
    assert changed.stdout.strip() == ""


def test_unmanaged_ufw_on_a_peer_stops_the_join_even_with_ports_open(lab: Lab, cluster: Cluster) -> None:
    # A UFW the program does not manage on an existing node stops the join, even
    # with the ports open, because the new node's peer rules cannot be added there.
    peer_host = lab.add_host(worker_spec("jf-ufw-peer", extra_packages=(*LONGHORN_PACKAGES, "ufw")))
    lab.wait_ssh_ready([peer_host])
    peer_host.run(["ufw", "default", "allow", "incoming"])
    peer_host.run(["ufw", "--force", "enable"])
    assert peer_host.run(["ufw", "status"]).stdout.startswith("Status: active")
    worker = fresh_worker(lab, "jf-ufw-new")
    peer = target(lab, peer_host)
    recorded = (*_recorded(cluster, worker), peer_host.name)
    error = join(
        lab, cluster, worker, peers=(peer,), unmanaged_firewall_nodes=(peer_host.name,), recorded_nodes=recorded
    )
    assert error.check == "firewall", str(error)
    assert "UFW is active on jf-ufw-peer" in str(error) and "even if the ports are open" in str(error)
    assert worker.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0
    # The same UFW run by the program (not in the unmanaged list) passes this check.
    lines: list[str] = []
    joiner_spec = spec_for(cluster, worker, peers=(peer,), recorded_nodes=recorded)

    async def preflight_only() -> None:
        async with open_session(target(lab, worker)) as w, open_session(target(lab, cluster.server)) as s:
            await Joiner(joiner_spec, w, s, lines.append).preflight()

    asyncio.run(preflight_only())


def test_objects_applied_by_joins_side_by_side_are_created_once(lab: Lab, cluster: Cluster) -> None:
    # Joins run in parallel and each applies the join-permit objects; the first two
    # creating them at the same moment must not fail with AlreadyExists.
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hk3s-apply-race\n  namespace: kube-system\n"

    async def apply_side_by_side() -> None:
        async with open_session(target(lab, cluster.server)) as session:
            api = ClusterApi(session)
            await asyncio.gather(*(api.apply(manifest) for _ in range(8)))

    try:
        asyncio.run(apply_side_by_side())
        listed = cluster.server.run(["/usr/local/bin/k3s", "kubectl", "get", "configmap", "-n", "kube-system"])
        assert "hk3s-apply-race" in listed.stdout
    finally:
        cluster.server.run(
            ["/usr/local/bin/k3s", "kubectl", "delete", "configmap", "-n", "kube-system", "hk3s-apply-race"],
            check=False,
        )


FAKE_UNAME = """#!/bin/sh
# This host says it is an arm64 machine (the lab's hosts are x86_64).
if [ "${1:-}" = -m ]; then echo aarch64; else exec /usr/bin/uname "$@"; fi
"""
# GitHub's releases cannot be reached from the lab: a stand-in for curl that records each URL
# and serves a release whose checksum list names the arm64 binary with another sum.
FAKE_CURL = """#!/bin/sh
out=
for arg in "$@"; do
  if [ "$prev" = -o ]; then out=$arg; fi
  prev=$arg
  url=$arg
done
echo "$url" >> /root/curl-urls
case "$url" in
  */k3s-arm64) printf 'not k3s' > "$out" ;;
  */sha256sum-arm64.txt) printf '%064d  k3s-arm64\\n%064d  k3s\\n' 1 2 ;;
  *) exit 22 ;;
esac
"""


def test_an_arm64_host_downloads_the_arm64_assets(lab: Lab, cluster: Cluster) -> None:
    """k3s's release assets per architecture: k3s + sha256sum-amd64.txt on x86_64, k3s-arm64 +
    sha256sum-arm64.txt on aarch64 (the host's uname and GitHub are faked here: the lab's hosts
    are x86_64 and cannot reach GitHub). The real install script, on a real host: the arm64
    binary is fetched and checked against the arm64 list's line for k3s-arm64, and a binary
    that does not match is refused before anything is installed."""
    host = fresh_worker(lab, "jf-arm64")
    (host.root / "opt/fake").mkdir(parents=True)
    for name, text in (("uname", FAKE_UNAME), ("curl", FAKE_CURL)):
        (host.root / "opt/fake" / name).write_text(text)
        (host.root / "opt/fake" / name).chmod(0o755)
    (host.root / "root/k3s_install.sh").write_text(script_path("k3s_install.sh").read_text())
    path = "PATH=/opt/fake:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    run = host.run(["env", path, "bash", "/root/k3s_install.sh", "agent", "v1.36.1+k3s1", "-"], check=False)
    assert run.returncode != 0
    base = "https://github.com/k3s-io/k3s/releases/download/v1.36.1%2Bk3s1"
    assert (host.root / "root/curl-urls").read_text().split() == [f"{base}/k3s-arm64", f"{base}/sha256sum-arm64.txt"]
    assert f"downloaded k3s has SHA-256 {hashlib.sha256(b'not k3s').hexdigest()}, expected {1:064d}" in run.stderr
    assert host.run(["test", "-e", "/usr/local/bin/k3s"], check=False).returncode != 0


def test_a_retried_join_restarts_the_agent_its_failure_left_activating(lab: Lab, cluster: Cluster) -> None:
    """k3s's units are Type=notify and its agent sends READY=1 only at the end of its start
    (k3s pkg/agent/run.go, once the Node is configured), so an agent stuck at the CA check, on an
    unreachable API or on a refused token stays `activating`, retrying with the token it read at
    its start; `systemctl start` does nothing to such a unit. A retried join writes a new token:
    the agent must be restarted to read it, or it keeps the dead one (the failed join deleted
    it) and every retry fails at token. One host, its join failing at ca-hash, then at
    api-reachable, then at token, then retried to the end."""
    worker = fresh_worker(lab, "jf-retry")
    assert cluster.server.public_ip and cluster.other_server.public_ip
    # Nodes the tests before this one left in the cluster are recorded, as the stack would have them.
    recorded = _recorded(cluster, worker)

    def agent_state() -> str:
        return worker.run(["systemctl", "is-active", "k3s-agent"], check=False).stdout.strip()

    # ca-hash: the agent is sent to another cluster's server.
    error = join(
        lab, cluster, worker, server_url=f"https://{cluster.other_server.public_ip}:6443", recorded_nodes=recorded
    )
    assert error.check == "ca-hash", str(error)
    assert agent_state() == "activating"

    # api-reachable: the retry (the right server now) cannot reach its API port.
    worker.run(["nft", "add table inet lab_block"])
    worker.run(["nft", "add chain inet lab_block out { type filter hook output priority 0; }"])
    worker.run(
        ["nft", f"add rule inet lab_block out ip daddr {cluster.server.public_ip} tcp dport 6443 reject with tcp reset"]
    )
    error = join(lab, cluster, worker, register_deadline=10, recorded_nodes=recorded)
    assert error.check == "api-reachable", str(error)
    assert agent_state() == "activating"

    # token: the port opens; the agent left running reaches the API with the token the failed
    # join deleted, is refused (401) and retries it, still activating, as real k3s does.
    worker.run(["nft", "delete table inet lab_block"])
    since = worker.run(["date", "+%Y-%m-%d %H:%M:%S"]).stdout.strip()

    async def wait_registered() -> None:
        async with open_session(target(lab, worker)) as session, open_session(target(lab, cluster.server)) as server:
            await Joiner(
                spec_for(cluster, worker, register_deadline=10, recorded_nodes=recorded),
                session,
                server,
                lambda _line: None,
            ).wait_registered(since)

    with pytest.raises(JoinError) as caught:
        asyncio.run(wait_registered())
    assert caught.value.check == "token", str(caught.value)
    assert agent_state() == "activating"

    # The retry the token's advice asks for: its new token is read by a restarted agent.
    lines: list[str] = []
    try:
        asyncio.run(
            join_worker(
                target(lab, worker),
                target(lab, cluster.server),
                spec_for(cluster, worker, recorded_nodes=recorded),
                lines.append,
            )
        )
    except JoinError as failure:
        pytest.fail(f"{failure}\n" + "\n".join(lines))
    assert any("service restarted" in line for line in lines), lines
    assert agent_state() == "active"
    worker.run(["systemctl", "disable", "--now", "k3s-agent"])
    cluster.server.run(["/usr/local/bin/k3s", "kubectl", "delete", "node", worker.name, "--ignore-not-found"])


def test_a_run_killed_after_the_binary_swap_restarts_k3s_when_resumed(lab: Lab, cluster: Cluster) -> None:
    """k3s_install.sh moves the wanted binary over /usr/local/bin/k3s, then restarts the unit. A
    run killed in between (the program's SSH session cut ends its script) leaves k3s running the
    release it started with, from a file that is gone. The run that resumes it finds the wanted
    binary in place: the program uploads nothing (the host's SHA-256 matches) and the script has
    nothing to swap. It must still restart k3s, or the node keeps the old release (an upgrade then
    waits for a version that never comes). The second server of the module (no test uses it after
    this one), upgraded to the next patch release as the killed run left it, then the program's
    install resumed on it: k3s runs the binary on disk and reports the new release."""
    host = cluster.other_server
    path, digest = k3s_snapshot("k3s-patch")
    wanted = K3sBinary(version=k3s_version("k3s-patch"), local_path=path, sha256=digest)

    def running_executable() -> str:
        pid = host.run(["systemctl", "show", "-p", "MainPID", "--value", "k3s"]).stdout.strip()
        return host.run(["readlink", f"/proc/{pid}/exe"], check=False).stdout.strip()

    assert running_executable() == "/usr/local/bin/k3s"
    # The killed run: the program's upload, then the real script, killed as the step after the
    # swap starts (an `ln` that kills the script that runs it).
    shutil.copyfile(path, host.root / "usr/local/bin/k3s.hk3s-upload")
    (host.root / "opt/kill-at-ln").mkdir(parents=True, exist_ok=True)
    (host.root / "opt/kill-at-ln/ln").write_text("#!/bin/sh\nkill -KILL $PPID\n")
    (host.root / "opt/kill-at-ln/ln").chmod(0o755)
    (host.root / "root/k3s_install.sh").write_text(script_path("k3s_install.sh").read_text())
    path_env = "PATH=/opt/kill-at-ln:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    killed = host.run(["env", path_env, "bash", "/root/k3s_install.sh", "server", wanted.version, digest], check=False)
    assert killed.returncode != 0 and "result service" not in killed.stdout, killed.stdout
    assert running_executable().endswith("(deleted)")

    async def resume(config: str | None) -> dict[str, str]:
        """The program's install on the host, as the run that resumes the killed one makes it."""
        async with open_session(target(lab, host)) as session:
            return await install_k3s(session, "server", wanted, config, lambda _line: None)

    results = asyncio.run(resume(None))
    assert results.get("binary") == "unchanged", results
    assert results.get("service") == "restarted", results

    def new_release_runs() -> bool:
        node = host.run(
            [
                "/usr/local/bin/k3s",
                "kubectl",
                "get",
                "node",
                host.name,
                "-o",
                "jsonpath={.status.nodeInfo.kubeletVersion}",
            ],
            check=False,
        ).stdout.strip()
        return running_executable() == "/usr/local/bin/k3s" and node == wanted.version

    wait_until(f"{host.name} runs {wanted.version}", new_release_runs, timeout=120)

    # The same for the config: a run killed just after it moved the new config in place (at the
    # `chmod` that follows), then resumed with that config: k3s is restarted to read it.
    config = host.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout + "# written by the killed run\n"
    (host.root / "etc/rancher/k3s/config.yaml.hk3s-new").write_text(config)
    (host.root / "opt/kill-at-ln/ln").unlink()
    (host.root / "opt/kill-at-ln/chmod").write_text("#!/bin/sh\nkill -KILL $PPID\n")
    (host.root / "opt/kill-at-ln/chmod").chmod(0o755)
    killed = host.run(["env", path_env, "bash", "/root/k3s_install.sh", "server", wanted.version, digest], check=False)
    assert killed.returncode != 0 and "result config" not in killed.stdout, killed.stdout
    assert host.run(["cat", "/etc/rancher/k3s/config.yaml"]).stdout == config
    before = host.run(["systemctl", "show", "-p", "MainPID", "--value", "k3s"]).stdout.strip()

    results = asyncio.run(resume(config))
    assert results.get("config") == "unchanged", results
    assert results.get("service") == "restarted", results
    wait_until(
        f"{host.name}'s k3s started again",
        lambda: host.run(["systemctl", "show", "-p", "MainPID", "--value", "k3s"]).stdout.strip() not in ("0", before),
        timeout=60,
    )
