"""The lab's k3s stand-in (lab/k3s_standin), run directly on this machine.

One server and a few agents, each with its own data directory under a temporary
directory and ports on loopback: no lab hosts are needed.  Needs the stand-in built
by ``lab/build/k3s_standin.sh`` and the control-plane binaries built by
``lab/build/kube.sh`` in ``$HK3S_LAB_CACHE/bin`` (default /var/cache/hk3s-lab/bin);
skips only when they are absent.

On one machine the server's node and the agents would all want the kubelet port
10250, so each gets its own through ``--kubelet-arg port=N`` (a real k3s flag that
the stand-in honours); a product install never sets it.  The tests run in order and
share one cluster: the last one stops the server.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509

from lab.stack_harness import BIN, skip_without_lab_binaries
from tests.lab_itself.ports import free_port, port_pair

pytestmark = pytest.mark.lab

BIN_DIR = BIN
K3S = BIN_DIR / "k3s"
REPO = Path(__file__).resolve().parents[2]
GRACE_PERIOD = 20  # seconds; the server passes it to the controller-manager
TOKEN_RE = re.compile(r"^K10([0-9a-f]{64})::([a-z0-9]{6})\.([a-z0-9]{16})$")
T = TypeVar("T")


def _require_binaries() -> None:
    skip_without_lab_binaries("k3s", "kine", "kube-apiserver", "kube-controller-manager", "kubectl")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _children(pid: int) -> dict[int, str]:
    """Direct children of pid: {pid: comm}."""
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out[int(d.name)] = comm
    return out


def _unverified() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _https_get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=_unverified(), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, n: int = 30) -> str:
        return f"--- last lines of {self.log} ---\n" + "\n".join(self.text().splitlines()[-n:])

    def stop(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)


@dataclass
class Cluster:
    tmp: Path
    env: dict[str, str]
    https_port: int = 0
    kubeconfig: Path = Path()
    server: Proc | None = None
    procs: list[Proc] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)

    def spawn(
        self, name: str, *args: str, notify: socket.socket | None = None, env_extra: dict[str, str] | None = None
    ) -> Proc:
        """Start `k3s ARGS`; with notify, as a systemd Type=notify unit would (NOTIFY_SOCKET)."""
        log = self.tmp / f"{name}.log"
        env = {**self.env, **(env_extra or {})}
        if notify is not None:
            env["NOTIFY_SOCKET"] = str(notify.getsockname())
        with open(log, "ab") as out:
            p = subprocess.Popen(
                [str(K3S), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        proc = Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(K3S), *args], capture_output=True, text=True, env=self.env, check=check, timeout=timeout
        )

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # `k3s kubectl` runs the cached kubectl; the kubeconfig goes through the supervisor.
        return self.run("kubectl", "--kubeconfig", str(self.kubeconfig), *args, check=check)

    def get(self, *args: str) -> dict[str, Any] | None:
        r = self.kubectl("get", *args, "-o", "json", check=False)
        if r.returncode != 0:
            if "NotFound" in r.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)} failed: {r.stderr}")
        return dict(json.loads(r.stdout))

    def node(self, name: str) -> dict[str, Any] | None:
        return self.get("node", name)

    def agent_args(self, name: str, token: str, *extra: str) -> list[str]:
        data = self.tmp / name
        data.mkdir(exist_ok=True)
        config = data / "config.yaml"
        # Part of the settings come from the config file, as the product writes them.
        port = self.state[f"{name}-kubelet-port"] = free_port()
        # Each agent's load balancer on a port of its own (on a host of its own, 6444).
        lb_port = self.state[f"{name}-lb-port"] = free_port()
        config.write_text(f"node-ip: 127.0.0.1\nlb-server-port: {lb_port}\nkubelet-arg:\n  - port={port}\n")
        return [
            "agent",
            "--config",
            str(config),
            "--data-dir",
            str(data),
            "--server",
            f"https://127.0.0.1:{self.https_port}",
            "--token",
            token,
            "--node-name",
            name,
            *extra,
        ]


NODE_CIDR_MASK = 20
ORPHAN_AGE = 10


def _ready(node: dict[str, Any] | None) -> str | None:
    if not node:
        return None
    for c in node.get("status", {}).get("conditions", []):
        if c["type"] == "Ready":
            return str(c["status"])
    return None


def _wait_for(what: str, fn: Callable[[], T | None], timeout: float, *watch: Proc) -> T:
    deadline = time.monotonic() + timeout
    while True:
        for p in watch:
            if p.popen.poll() is not None:
                raise AssertionError(f"{p.name} exited with {p.popen.returncode} while waiting for {what}\n{p.tail()}")
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(p.tail() for p in watch)
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{tails}")
        time.sleep(1)


def _notify_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0)
    return sock


def _notifications(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


def _kill_tree(proc: Proc, known: dict[int, str] | None = None) -> None:
    """Stop proc; then kill whatever of its children (now or `known` earlier) is left."""
    kids = {**(known or {}), **_children(proc.popen.pid)}
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(30)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(10)
    for pid, comm in kids.items():
        with contextlib.suppress(OSError):
            if _alive(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    _require_binaries()
    tmp = tmp_path_factory.mktemp("k3s-standin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("K3S_") and k != "KUBECONFIG"}
    env["HK3S_LAB_KUBE_BIN"] = str(BIN_DIR)
    env["HK3S_LAB_NODE_MONITOR_GRACE_PERIOD"] = f"{GRACE_PERIOD}s"
    # The agents' node password (k3s: /etc/rancher/node/password), kept off this machine's /etc.
    env["HK3S_LAB_NODE_PASSWORD_FILE"] = str(tmp / "node-password")
    # k3s's MinOrphanSecretAge (10 minutes), shortened for the orphan sweep's test.
    env["HK3S_LAB_NODE_PASSWORD_ORPHAN_AGE"] = f"{ORPHAN_AGE}s"
    # Nodes run on this machine itself: no kube-proxy/flannel iptables rules in its network.
    env["HK3S_LAB_NO_HOST_RULES"] = "1"
    c = Cluster(tmp=tmp, env=env)
    c.https_port = port_pair()
    c.kubeconfig = tmp / "k3s.yaml"
    server_dir = tmp / "server"
    server_dir.mkdir()
    (tmp / "server-config.yaml").write_text(
        "tls-san:\n  - k3s-standin.test\n"
        # Pod CIDRs of /20 in the cluster's /16: 16 nodes' worth, so a test can use them all up.
        f"kube-controller-manager-arg:\n  - secure-port={free_port()}\n  - node-cidr-mask-size={NODE_CIDR_MASK}\n"
        # As the program's servers: k3s's NodeRestriction plus DenyServiceExternalIPs.
        "kube-apiserver-arg:\n  - enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs\n"
        "flannel-backend: wireguard-native\n"
        "flannel-external-ip: true\n"
        "flannel-ipv6-masq: true\n"
    )
    c.state["server-notify"] = _notify_socket(tmp / "server-notify.sock")
    c.server = c.spawn(
        "server",
        "server",
        "--config",
        str(tmp / "server-config.yaml"),
        "--data-dir",
        str(server_dir),
        "--write-kubeconfig",
        str(c.kubeconfig),
        "--node-name",
        "srv",
        "--bind-address",
        "127.0.0.1",
        "--https-listen-port",
        str(c.https_port),
        "--kubelet-arg",
        f"port={free_port()}",
        notify=c.state["server-notify"],
    )
    try:
        server = c.server
        _wait_for("the server to be up", lambda: "k3s is up and running" in server.text(), 240, server)
        c.state["server-children"] = _children(server.popen.pid)
        yield c
    finally:
        for p in reversed(c.procs):
            _kill_tree(p, c.state.get("server-children") if p is c.server else None)
        for value in c.state.values():
            if isinstance(value, socket.socket):
                value.close()


def test_version_matches_the_api_server(cluster: Cluster) -> None:
    out = cluster.run("--version").stdout.splitlines()
    m = re.fullmatch(r"k3s version (v1\.\d+\.\d+)\+k3s1 \(([0-9a-f]{8})\)", out[0])
    assert m, out
    assert out[1].startswith("go version go1."), out
    api = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)
    assert m.group(1) == api["gitVersion"], (out[0], api["gitVersion"])
    cluster.state["version"] = m.group(1) + "+k3s1"


def test_a_component_arg_replaces_k3ss_default_of_the_same_name(cluster: Cluster) -> None:
    """k3s merges --kube-apiserver-arg with its own arguments by name (pkg/util/args.go GetArgs):
    enable-admission-plugins given in the config is the API server's only one, so the real
    kube-apiserver runs DenyServiceExternalIPs and refuses a Service with externalIPs."""
    logged = (cluster.tmp / "server" / "server" / "logs" / "kube-apiserver.log").read_text()
    command = [line for line in logged.splitlines() if line.startswith("==== ")][-1]
    assert command.count("--enable-admission-plugins=") == 1, command
    assert "--enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs" in command, command
    service = cluster.tmp / "external-ips.yaml"
    service.write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: hijack, namespace: default}\n"
        "spec: {ports: [{port: 6443}], externalIPs: [192.0.2.10]}\n"
    )
    refused = cluster.kubectl("create", "-f", str(service), check=False)
    assert refused.returncode != 0 and "Use of external IPs is denied by admission control" in refused.stderr, (
        refused.stdout + refused.stderr
    )


def test_server_is_up_with_its_own_node(cluster: Cluster) -> None:
    assert cluster.server is not None
    server_dir = cluster.tmp / "server"
    # Like k3s, it tells systemd (Type=notify) when it is up.
    assert _notifications(cluster.state["server-notify"]) == [b"READY=1"]
    kc = cluster.kubeconfig.read_text()
    assert f"server: https://127.0.0.1:{cluster.https_port}" in kc
    assert oct(cluster.kubeconfig.stat().st_mode & 0o777) == "0o600"
    for name in ("server-ca.crt", "client-ca.crt", "request-header-ca.crt", "service.key"):
        assert (server_dir / "server" / "tls" / name).is_file(), name

    # /ping and /cacerts come from the supervisor itself, without credentials.
    assert _https_get(cluster.https_port, "/ping") == (200, b"pong")
    status, cacerts = _https_get(cluster.https_port, "/cacerts")
    assert status == 200
    assert cacerts == (server_dir / "server" / "tls" / "server-ca.crt").read_bytes()
    # Everything else is the Kubernetes API, which wants credentials.
    assert _https_get(cluster.https_port, "/api")[0] == 401
    # The node token file, as k3s writes it.
    node_token = (server_dir / "server" / "node-token").read_text().strip()
    assert node_token.startswith(f"K10{hashlib.sha256(cacerts).hexdigest()}::server:"), node_token
    # The serving certificate carries the config file's tls-san.
    pem = ssl.get_server_certificate(("127.0.0.1", cluster.https_port))
    san = x509.load_pem_x509_certificate(pem.encode()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "k3s-standin.test" in san.value.get_values_for_type(x509.DNSName)

    srv = _wait_for("node srv Ready", lambda: n if _ready(n := cluster.node("srv")) == "True" else None, 90)
    labels = srv["metadata"]["labels"]
    assert labels.get("node-role.kubernetes.io/control-plane") == "true", labels
    assert labels.get("node-role.kubernetes.io/master") == "true", labels
    assert srv["status"]["nodeInfo"]["kubeletVersion"] == cluster.state["version"]
    lease = cluster.get("lease", "-n", "kube-node-lease", "srv")
    assert lease and lease["spec"]["holderIdentity"] == "srv"
    # The ignored flag from the config file was accepted and reported.
    assert "--flannel-ipv6-masq" in cluster.server.text()
    # The flannel backend is published on the Node, as flannel's kube subnet manager does.
    assert srv["metadata"]["annotations"].get("flannel.alpha.coreos.com/backend-type") == "wireguard-native"


def test_token_create_prints_a_secure_token_for_the_served_ca(cluster: Cluster) -> None:
    token = cluster.run(
        "token", "create", "--data-dir", str(cluster.tmp / "server"), "--ttl", "10m", "--description", "worker-1"
    ).stdout.strip()
    m = TOKEN_RE.fullmatch(token)
    assert m, token
    status, cacerts = _https_get(cluster.https_port, "/cacerts")
    assert status == 200
    assert m.group(1) == hashlib.sha256(cacerts).hexdigest()

    secret = cluster.get("secret", "-n", "kube-system", f"bootstrap-token-{m.group(2)}")
    assert secret is not None
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["token-id"] == m.group(2)
    assert data["token-secret"] == m.group(3)
    assert data["usage-bootstrap-authentication"] == "true"
    assert data["usage-bootstrap-signing"] == "true"
    assert data["description"] == "worker-1"
    assert data["auth-extra-groups"] == "system:bootstrappers:k3s:default-node-token"
    expires = dt.datetime.fromisoformat(data["expiration"].replace("Z", "+00:00"))
    left = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    assert 540 < left <= 600, left
    listed = cluster.run("token", "list", "--data-dir", str(cluster.tmp / "server")).stdout
    assert f"{m.group(2)}.{m.group(3)}" in listed and "worker-1" in listed, listed
    cluster.state["token"] = token


def test_agent_joins_with_the_bootstrap_token(cluster: Cluster) -> None:
    token = cluster.state["token"]
    args = cluster.agent_args(
        "worker-1", token, "--node-label", "a=b", "--node-taint", "hk3s.dev/validating=true:NoSchedule"
    )
    cluster.state["worker-1-args"] = args
    notify = cluster.state["worker-1-notify"] = _notify_socket(cluster.tmp / "worker-1-notify.sock")
    agent = cluster.spawn("worker-1", *args, notify=notify)
    cluster.state["worker-1"] = agent
    node = _wait_for(
        "node worker-1 Ready",
        lambda: n if _ready(n := cluster.node("worker-1")) == "True" else None,
        120,
        agent,
    )
    assert node["metadata"]["labels"].get("a") == "b", node["metadata"]["labels"]
    assert {"key": "hk3s.dev/validating", "value": "true", "effect": "NoSchedule"} in node["spec"].get("taints", [])
    # The agent has no flannel setting of its own: it runs the server's backend, read from the
    # agent configuration at its start (k3s's pkg/agent/config get()), and publishes it.
    assert node["metadata"]["annotations"].get("flannel.alpha.coreos.com/backend-type") == "wireguard-native"
    assert node["status"]["nodeInfo"]["kubeletVersion"] == cluster.state["version"]
    addresses = {(a["type"], a["address"]) for a in node["status"]["addresses"]}
    assert ("InternalIP", "127.0.0.1") in addresses, addresses  # node-ip from the config file
    _wait_for("the agent to notify READY=1", lambda: _notifications(notify) == [b"READY=1"], 10, agent)

    # As k3s: the client certificate comes from the supervisor (/v1-k3s/client-kubelet.crt,
    # signed by the client CA once the node password is verified), not from a CSR.
    csrs = cluster.get("csr")
    assert csrs is not None
    tid = TOKEN_RE.fullmatch(token).group(2)  # type: ignore[union-attr]
    assert not [c for c in csrs["items"] if c["spec"]["username"] == f"system:bootstrap:{tid}"], csrs["items"]
    crt = x509.load_pem_x509_certificate((cluster.tmp / "worker-1" / "agent" / "client-kubelet.crt").read_bytes())
    assert crt.subject.rfc4514_string() == "CN=system:node:worker-1,O=system:nodes"
    client_ca = x509.load_pem_x509_certificate(
        (cluster.tmp / "server" / "server" / "tls" / "client-ca.crt").read_bytes()
    )
    assert crt.issuer == client_ca.subject
    assert "Issued kubelet client certificate for node worker-1" in cluster.server.text()  # type: ignore[union-attr]
    # Through the agent's load balancer on 127.0.0.1:<lb-server-port> (k3s's 6444).
    lb = f"127.0.0.1:{cluster.state['worker-1-lb-port']}"
    assert f"Running load balancer k3s-agent-load-balancer {lb} -> [] [default: 127.0.0.1:{cluster.https_port}]" in (
        agent.text()
    ), agent.tail()
    kubeconfig = (cluster.tmp / "worker-1" / "agent" / "kubelet.kubeconfig").read_text()
    assert f"server: https://{lb}" in kubeconfig, kubeconfig

    # The kubelet port answers /healthz over TLS.
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    assert port == cluster.state["worker-1-kubelet-port"] != 10250  # kubelet-arg from the config file
    assert _https_get(port, "/healthz") == (200, b"ok")
    # (The API server's node proxy is not tried: it refuses loopback node addresses.)
    # No container runtime, and it says so.
    assert node["status"]["nodeInfo"].get("containerRuntimeVersion", "") == ""

    # The Lease in kube-node-lease is renewed.
    first = cluster.get("lease", "-n", "kube-node-lease", "worker-1")
    assert first and first["spec"]["holderIdentity"] == "worker-1"
    _wait_for(
        "the lease of worker-1 to be renewed",
        lambda: (
            (lease := cluster.get("lease", "-n", "kube-node-lease", "worker-1"))
            and lease["spec"]["renewTime"] > first["spec"]["renewTime"]
        ),
        40,
        agent,
    )


def test_the_agent_configuration_carries_what_agents_read_only_at_start(cluster: Cluster) -> None:
    """As k3s's /v1-k3s/config (config.Control, read by pkg/agent/config get() once, at the
    agent's start): besides the flannel backend, flannel-external-ip, the cluster DNS (the tenth
    address of the service CIDR) and whether kube-proxy is disabled. worker-1 read
    flannel-external-ip and, having no external address, said so as k3s's agent does."""
    token = cluster.state["token"]
    tid, secret = TOKEN_RE.fullmatch(token).group(2, 3)  # type: ignore[union-attr]
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.https_port, context=_unverified(), timeout=10)
    try:
        conn.request("GET", "/v1-k3s/config", headers={"Authorization": f"Bearer {tid}.{secret}"})
        resp = conn.getresponse()
        status, body = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 200, body
    served = json.loads(body)
    assert served["FlannelBackend"] == "wireguard-native", served
    assert served["FlannelExternalIP"] is True and served["DisableKubeProxy"] is False, served
    assert served["ClusterDNS"] == "10.43.0.10", served
    warning = "Server has flannel-external-ip flag set but this node does not set node-external-ip"
    assert warning in cluster.state["worker-1"].text(), cluster.state["worker-1"].tail()


def test_a_node_password_secret_without_its_node_is_deleted_once_old_enough(cluster: Cluster) -> None:
    """As recent k3s (pkg/nodepassword/controller.go sync, every minute): a node-password Secret
    whose Node does not exist is deleted once older than MinOrphanSecretAge (here ORPHAN_AGE);
    one whose Node exists stays."""
    ghost = "ghost.node-password.k3s"
    cluster.kubectl("create", "secret", "generic", ghost, "-n", "kube-system", "--from-literal=hash=none")
    created = cluster.get("secret", "-n", "kube-system", ghost)
    assert created is not None
    born = dt.datetime.fromisoformat(created["metadata"]["creationTimestamp"])
    _wait_for(
        "the orphaned secret to be deleted",
        lambda: cluster.get("secret", "-n", "kube-system", ghost) is None,
        ORPHAN_AGE * 3 + 30,
        cluster.server,  # type: ignore[arg-type]
    )
    gone = dt.datetime.now(dt.UTC)
    assert (gone - born).total_seconds() >= ORPHAN_AGE, f"deleted {gone - born} after its creation"
    assert f"Deleted orphaned node-password secret {ghost} created" in cluster.server.text()  # type: ignore[union-attr]
    assert cluster.get("secret", "-n", "kube-system", "worker-1.node-password.k3s") is not None


def test_agent_holds_a_tunnel_the_api_server_reaches_kubelets_through(cluster: Cluster) -> None:
    """As k3s's egress-selector mode "agent": the kube-apiserver's "cluster" egress is HTTP
    CONNECT to the supervisor, and each agent keeps a tunnel to it over the server port.
    (The node proxy itself is shown on lab hosts, tests/lab/test_kubelet_port.py: the API
    server refuses loopback node addresses, which these agents have.)"""
    agent: Proc = cluster.state["worker-1"]
    server = cluster.server
    assert server is not None
    _wait_for(
        "the server to accept worker-1's tunnel",
        lambda: "Tunnel server: agent worker-1 connected" in server.text(),
        30,
        agent,
    )
    assert f"wss://127.0.0.1:{cluster.https_port}/v1-k3s/connect" in agent.text(), agent.tail()
    egress = (cluster.tmp / "server" / "server" / "etc" / "egress-selector-config.yaml").read_text()
    assert "name: cluster" in egress and "proxyProtocol: HTTPConnect" in egress, egress
    assert f"url: https://127.0.0.1:{cluster.https_port}" in egress, egress
    # Only the API server's certificate may CONNECT: anyone else is refused.
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.https_port, context=_unverified(), timeout=10)
    try:
        conn.request("CONNECT", f"127.0.0.1:{cluster.state['worker-1-kubelet-port']}")
        assert conn.getresponse().status == 401
    finally:
        conn.close()


def test_wrong_ca_hash_is_refused_and_retried_without_joining(cluster: Cluster) -> None:
    good = cluster.run(
        "token", "create", "--data-dir", str(cluster.tmp / "server"), "--ttl", "10m", "--description", "worker-bad"
    ).stdout.strip()
    m = TOKEN_RE.fullmatch(good)
    assert m, good
    wrong_hash = "0" * 64
    bad = f"K10{wrong_hash}::{m.group(2)}.{m.group(3)}"
    agent = cluster.spawn("worker-bad", *cluster.agent_args("worker-bad", bad))
    line = f"token CA hash does not match the Cluster CA certificate hash: {wrong_hash} != {m.group(1)}"
    _wait_for("the mismatch to be logged twice", lambda: agent.text().count(line) >= 2, 60, agent)
    assert agent.popen.poll() is None, "the agent must keep retrying"
    assert cluster.node("worker-bad") is None
    # The token was never used: no CSR from its bootstrap user.
    csrs = cluster.get("csr")
    assert csrs is not None
    assert not [c for c in csrs["items"] if c["spec"]["username"] == f"system:bootstrap:{m.group(2)}"]
    assert not (cluster.tmp / "worker-bad" / "agent" / "client-kubelet.crt").exists()
    assert agent.stop() == 0


def test_an_unreachable_server_is_named_at_debug_level_only(cluster: Cluster) -> None:
    """As k3s (pkg/agent/loadbalancer): the agent reaches the server through its load
    balancer on 127.0.0.1; a server it cannot dial shows at the default level only as the
    agent's own request failing on the local address, and the dial error naming the server
    is logged at debug level."""
    closed = free_port()  # nothing listens there
    args = cluster.agent_args("worker-nolb", "K10" + "0" * 64 + "::abcdef.0123456789abcdef")
    args[args.index("--server") + 1] = f"https://127.0.0.1:{closed}"
    lb = f"127.0.0.1:{cluster.state['worker-nolb-lb-port']}"
    failed = f"Failed to validate connection to cluster at https://127.0.0.1:{closed}: failed to get CA certs"
    quiet = cluster.spawn("worker-nolb", *args)
    _wait_for("two failed attempts", lambda: quiet.text().count(failed) >= 2, 30, quiet)
    lines = [line for line in quiet.text().splitlines() if failed in line]
    assert all(f"https://{lb}/cacerts" in line and "level=error" in line for line in lines), lines
    assert f"127.0.0.1:{closed}: connect" not in quiet.text() and "connection refused" not in quiet.text()
    assert quiet.stop() == 0

    loud = cluster.spawn("worker-nolb-debug", "--debug", *args)
    dial = f"Dial error from server 127.0.0.1:{closed}@STANDBY* after "
    _wait_for("the dial error at debug level", lambda: dial in loud.text(), 30, loud)
    lines = [line for line in loud.text().splitlines() if dial in line]
    assert all("level=debug" in line and "connect: connection refused" in line for line in lines), lines
    assert "error dialing load balancer servers: all servers failed" in loud.text(), loud.tail()
    assert loud.stop() == 0


def test_deleted_token_is_unauthorized(cluster: Cluster) -> None:
    server_dir = str(cluster.tmp / "server")
    token = cluster.run("token", "create", "--data-dir", server_dir, "--ttl", "10m").stdout.strip()
    m = TOKEN_RE.fullmatch(token)
    assert m, token
    out = cluster.run("token", "delete", "--data-dir", server_dir, m.group(2)).stdout
    assert m.group(2) in out
    assert m.group(2) not in cluster.run("token", "list", "--data-dir", server_dir).stdout
    agent = cluster.spawn("worker-gone", *cluster.agent_args("worker-gone", token))
    # As the configured version's agent words the supervisor's 401 (agentauth.go): the decoded
    # Status message from v1.31, the URL and the HTTP status before; info level, every 5 s.
    minor = int(cluster.state["version"].split(".")[1])
    why = (
        "not authorized"
        if minor >= 31
        else f"https://127.0.0.1:{cluster.state['worker-gone-lb-port']}/v1-k3s/config: 401 Unauthorized"
    )
    refused = f"Waiting to retrieve agent configuration; server is not ready: failed to retrieve configuration from server: {why}"
    _wait_for("the agent to log that the token is refused twice", lambda: agent.text().count(refused) >= 2, 60, agent)
    assert agent.popen.poll() is None
    assert all("level=info" in line for line in agent.text().splitlines() if refused in line), agent.tail()
    assert cluster.node("worker-gone") is None
    assert not (cluster.tmp / "worker-gone" / "agent" / "client-kubelet.crt").exists()
    assert agent.stop() == 0


def test_token_file_is_waited_for_even_after_joining(cluster: Cluster) -> None:
    """As k3s: a missing --token-file is waited for (up to 4 minutes) before anything
    else, even when the agent already holds its credentials."""
    token_file = cluster.tmp / "worker-2-token"
    args = cluster.agent_args("worker-2", "")
    args[args.index("--token") : args.index("--token") + 2] = ["--token-file", str(token_file)]
    agent = cluster.spawn("worker-2", *args)
    waiting = f"Waiting for {token_file} to be available"
    _wait_for("the agent to wait for its token file", lambda: agent.text().count(waiting) >= 2, 30, agent)
    assert cluster.node("worker-2") is None
    token = cluster.run(
        "token", "create", "--data-dir", str(cluster.tmp / "server"), "--ttl", "10m", "--description", "worker-2"
    ).stdout.strip()
    token_file.write_text(token + "\n")
    _wait_for("node worker-2 Ready", lambda: _ready(cluster.node("worker-2")) == "True", 120, agent)
    assert agent.stop() == 0

    # The file is gone now: a restart waits for it again instead of starting.
    token_file.unlink()
    again = cluster.spawn("worker-2-restart", *args)
    _wait_for("the restarted agent to wait for its token file", lambda: again.text().count(waiting) >= 3, 30, again)
    assert "Starting k3s agent" not in again.text(), again.tail()
    assert again.stop() == 0


def test_stopped_agent_goes_not_ready_and_restarts_without_its_token(cluster: Cluster) -> None:
    agent: Proc = cluster.state["worker-1"]
    assert _ready(cluster.node("worker-1")) == "True"
    stopped_at = time.monotonic()
    assert agent.stop(timeout=20) == 0, agent.tail()
    node = _wait_for(
        "node worker-1 NotReady",
        lambda: n if _ready(n := cluster.node("worker-1")) not in ("True", None) else None,
        GRACE_PERIOD + 60,
    )
    took = time.monotonic() - stopped_at
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "Unknown" and ready["reason"] == "NodeStatusUnknown", ready
    assert took >= 5, f"NotReady after {took:.0f}s: faster than any heartbeat gap"

    # The join token is gone now; the stored credentials are enough for a restart.
    cert_file = cluster.tmp / "worker-1" / "agent" / "client-kubelet.crt"
    before = x509.load_pem_x509_certificate(cert_file.read_bytes())
    tid = TOKEN_RE.fullmatch(cluster.state["token"]).group(2)  # type: ignore[union-attr]
    cluster.run("token", "delete", "--data-dir", str(cluster.tmp / "server"), tid)
    again = cluster.spawn("worker-1-restart", *cluster.state["worker-1-args"])
    _wait_for(
        "node worker-1 Ready again",
        lambda: _ready(cluster.node("worker-1")) == "True",
        90,
        again,
    )
    # As k3s (pkg/agent/config get: getNodeNamedHostFile at every start): a new client
    # certificate, asked for with the one it holds (its token is gone).
    assert "Kubelet client certificate for system:node:worker-1 stored in" in again.text(), again.tail()
    renewed = x509.load_pem_x509_certificate(cert_file.read_bytes())
    assert renewed.serial_number != before.serial_number
    assert again.stop() == 0


def test_restart_with_an_empty_token_is_refused_even_with_stored_credentials(cluster: Cluster) -> None:
    """As k3s (pkg/clientaccess/token.go parseToken, pkg/agent/run.go): every start parses
    the configured token first; an empty one is refused every 2 s forever, so a joined
    node whose config names no token never comes back, certificate or not."""
    assert (cluster.tmp / "worker-1" / "agent" / "client-kubelet.crt").exists()
    args = list(cluster.state["worker-1-args"])
    args[args.index("--token") + 1] = ""
    agent = cluster.spawn("worker-1-no-token", *args)
    refused = "Failed to validate connection to cluster at"
    _wait_for(
        "the empty token to be refused three times",
        lambda: agent.text().count("token must not be empty") >= 3,
        30,
        agent,
    )
    lines = [line for line in agent.text().splitlines() if "token must not be empty" in line]
    assert all("level=error" in line and refused in line for line in lines), lines
    assert "Running kubelet stand-in" not in agent.text(), agent.tail()
    assert "Kubelet client certificate for" not in agent.text(), agent.tail()
    assert agent.stop() == 0


def test_another_hosts_password_is_refused_until_the_node_is_deleted(cluster: Cluster) -> None:
    """As k3s (pkg/nodepassword, the agent's config retrieval): the first agent of a name
    leaves a hash of its password in kube-system/<node>.node-password.k3s; an agent with
    another password (a host rebuilt under that name) is refused every 5 s and starts no
    kubelet; the Secret goes with the Node, and then the name is free again."""
    secret = cluster.get("secret", "-n", "kube-system", "worker-1.node-password.k3s")
    assert secret is not None and secret.get("immutable") is True, secret
    rebuilt = {"HK3S_LAB_NODE_PASSWORD_FILE": str(cluster.tmp / "rebuilt-node-password")}
    agent = cluster.spawn("worker-1-rebuilt", *cluster.state["worker-1-args"], env_extra=rebuilt)
    rejected = (
        "Waiting to retrieve agent configuration; server is not ready: Node password rejected, duplicate "
        f"hostname or contents of '{rebuilt['HK3S_LAB_NODE_PASSWORD_FILE']}' may not match server node-passwd entry"
    )
    _wait_for("the password to be refused twice", lambda: agent.text().count(rejected) >= 2, 30, agent)
    assert all("level=info" in line for line in agent.text().splitlines() if "Node password rejected" in line)
    assert "Running kubelet stand-in" not in agent.text(), agent.tail()
    assert agent.stop() == 0

    # A fresh host under the name, with a live token: refused before any certificate is
    # issued, as k3s checks the password in the handlers that issue them.
    token = cluster.run(
        "token", "create", "--data-dir", str(cluster.tmp / "server"), "--ttl", "10m", "--description", "worker-1"
    ).stdout.strip()
    fresh_args = cluster.agent_args("worker-1-fresh", token)
    fresh_args[fresh_args.index("--node-name") + 1] = "worker-1"
    issued = cluster.server.text().count("Issued kubelet client certificate for node worker-1")  # type: ignore[union-attr]
    fresh = cluster.spawn("worker-1-fresh", *fresh_args, env_extra=rebuilt)
    _wait_for("the fresh host to be refused twice", lambda: fresh.text().count(rejected) >= 2, 30, fresh)
    assert not (cluster.tmp / "worker-1-fresh" / "agent" / "client-kubelet.crt").exists()
    assert cluster.server.text().count("Issued kubelet client certificate for node worker-1") == issued  # type: ignore[union-attr]
    assert "Running kubelet stand-in" not in fresh.text(), fresh.tail()
    assert fresh.stop() == 0

    cluster.kubectl("delete", "node", "worker-1")
    _wait_for(
        "the node password secret to go with its node",
        lambda: cluster.get("secret", "-n", "kube-system", "worker-1.node-password.k3s") is None,
        30,
    )
    # The fresh host again, with its live token: the name is free. (Not worker-1's own data
    # directory: its certificate names a Node that is gone, which k3s refuses with 401, and its
    # join token is spent.)
    again = cluster.spawn("worker-1-rebuilt-again", *fresh_args, env_extra=rebuilt)
    _wait_for(
        "node worker-1 Ready from the rebuilt host", lambda: _ready(cluster.node("worker-1")) == "True", 90, again
    )
    assert again.stop() == 0


def test_an_agent_whose_node_gets_no_pod_cidr_does_not_notify_ready(cluster: Cluster) -> None:
    """As k3s (pkg/agent/run.go: READY=1 only after startNetwork, whose flannel waits for the
    Node's PodCIDR): with every pod CIDR of the cluster taken (Node objects no kubelet runs), a
    new agent registers its Node, which goes Ready, but its unit would stay `activating`."""
    nodes = cluster.get("nodes")
    assert nodes is not None
    free = 2 ** (NODE_CIDR_MASK - 16) - sum(1 for n in nodes["items"] if n["spec"].get("podCIDR"))
    fillers = [f"cidr-filler-{i}" for i in range(free)]
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in fillers],
    }
    manifest = cluster.tmp / "cidr-fillers.json"
    manifest.write_text(json.dumps(listing))
    created = cluster.kubectl("create", "-f", str(manifest), check=False)
    assert created.returncode == 0, created.stderr
    try:
        _wait_for(
            "every pod CIDR taken",
            lambda: all((n := cluster.node(f)) and n["spec"].get("podCIDR") for f in fillers),
            60,
        )
        token = cluster.run("token", "create", "--data-dir", str(cluster.tmp / "server"), "--ttl", "10m").stdout.strip()
        notify = cluster.state["nocidr-notify"] = _notify_socket(cluster.tmp / "nocidr-notify.sock")
        agent = cluster.spawn("nocidr", *cluster.agent_args("nocidr", token), notify=notify)
        _wait_for("node nocidr Ready", lambda: _ready(cluster.node("nocidr")) == "True", 120, agent)
        waiting = "Waiting for node nocidr CIDR not assigned yet"
        notified: list[bytes] = []

        def settled() -> bool:
            notified.extend(_notifications(notify))
            return bool(notified) or agent.text().count(waiting) >= 2

        _wait_for("the agent to notify READY=1 or to wait for its pod CIDR twice", settled, 30, agent)
        assert notified == [], agent.tail()
        node = cluster.node("nocidr")
        assert node is not None and not node["spec"].get("podCIDR"), node
        assert "k3s agent is up and running" not in agent.text(), agent.tail()
        assert agent.stop() == 0
    finally:
        cluster.kubectl("delete", "node", "--ignore-not-found", "nocidr", *fillers)


def test_server_sigterm_leaves_no_child_process(cluster: Cluster) -> None:
    server = cluster.server
    assert server is not None
    kids = _children(server.popen.pid)
    # kube-controller-manager and kube-scheduler (as k3s's server runs them), by their 15-character comm.
    assert sorted(kids.values()) == ["kine", "kube-apiserver", "kube-controller", "kube-scheduler"], kids
    assert server.stop(timeout=60) == 0, server.tail()
    left = {pid: comm for pid, comm in kids.items() if _alive(pid)}
    assert not left, f"still running after the server stopped: {left}"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", cluster.https_port), timeout=2).close()
