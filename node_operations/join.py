"""Join a worker: preflight, prepare, join under a taint, validate, release.

Every step checks the real state first, so running the join
again after an interruption continues where it stopped (one Node, no step
done twice) and a rejoin of a registered node leaves its pods in place.

Join tokens: created on the server for this node at join time,
ten-minute TTL, described by the node name, carried to the host over SSH into
a root-only file, never printed and never returned; deleted on the server as
soon as the node is registered. The host keeps the dead token in that file,
which its agent's config names: k3s parses the configured token at every agent
start and refuses an empty one, so without it the worker would not come back
after a reboot (why that is safe: Joiner._forget_token). A token can only
register the node it was made for: Node creation by a kubelet is admitted only
for names holding a join permit (a ValidatingAdmissionPolicy the program
installs); the program grants the permit when it joins that node and keeps it
while the Node exists, since its kubelet creates the Node at every start; a removal
or a give-up revokes it with the Node (node_operations.join_permits says why).
A rejoin makes no token while the agent's client certificate authenticates it;
one whose certificate expired or is gone gets a fresh one, deleted once the agent
holds a new certificate (k3s's agent renews it only through an authenticated
request, and the dead token authenticates nothing).

The checks of the tainted node live in node_operations.join_validation, what
the agent's log says went wrong in node_operations.agent_log.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

# agent_since: where the join reads the agent's log from, kept importable here for the lab tests
# that start an agent the way the join does.
from node_operations.agent_log import agent_log, agent_log_diagnosis, agent_since, log_message  # noqa: F401
from node_operations.firewall_plan import PortRule, listening_ports
from node_operations.health import FENCE_ANNOTATION, read_node  # noqa: F401 - read_node lived here
from node_operations.host_facts import HostFacts, interface_of
from node_operations.host_firewall.operator_firewall import evaluate_operator_firewall
from node_operations.join_host import (
    READ_DEADLINE_SECONDS,
    AgentBinary,
    JoiningHost,
    agent_binary,
    client_certificate_dead,
    install_agent,
    prepare_joining_host,
    read_joining_host,
    upload_agent_binary,
)
from node_operations.join_permits import (  # noqa: F401
    JOIN_PERMIT_POLICY,
    PERMITS_CONFIGMAP,
    grant_join_permits,
    revoke_join_permit,
)
from node_operations.join_server import ClusterReading, JoinGrant, grant_join, read_cluster, release_node
from node_operations.join_validation import POLL_SECONDS, TaintedNodeValidation, ValidatedNode, ValidationError
from node_operations.k3s_install import INSTALL_DEADLINE_SECONDS, K3sBinary, agent_config
from node_operations.network_mode import check_connection
from node_operations.node_access import NodeAccessError, RecordedNode, check_recorded_nodes
from node_operations.node_metadata import MANAGED_LABEL
from node_operations.preflight import PreflightRequirements, container_engine_notice, evaluate_preflight
from node_operations.refusal import tagged
from node_operations.volume_copies import single_copies_for_join
from remote_access.kube import API_WAIT_SECONDS, ClusterApi, JoinToken, NodeStatus, Taint
from remote_access.ssh import SshError, SshSession, SshTarget, open_session

Progress = Callable[[str], None]
T = TypeVar("T")

TOKEN_FILE = "/etc/rancher/k3s/hk3s-join-token"
# A live bootstrap token is wider than a join needs (k3s's server hands the `system:bootstrappers`
# group the agent's certificates for any name), so it lives no longer than the join that uses it
# could: it is deleted once the agent registered or the join failed, and it expires, on the
# server's own clock, when the join would have given up anyway (the agent's start, its install
# command's deadline, plus the wait that needs it, plus a minute for an API restart on the way).
# A join that never deletes it (a killed run, a server that could not delete it) and is never
# retried leaves no live token past that.
TOKEN_TTL_MARGIN_SECONDS = 60.0
AGENT_START_DEADLINE_SECONDS = 3 * READ_DEADLINE_SECONDS + INSTALL_DEADLINE_SECONDS
REGISTER_DEADLINE_SECONDS = 120.0
READY_DEADLINE_SECONDS = 120.0
# The longest single watch of the Node while waiting for it to turn Ready (kubectl's own request
# timeout ends a watch after as long).
READY_WATCH_SECONDS = 30.0


def join_token_ttl(wait_seconds: float, start_seconds: float = AGENT_START_DEADLINE_SECONDS) -> str:
    """How long a join token lives (`k3s token create --ttl`): the agent's start and the
    wait that needs the token (`wait_seconds`), plus TOKEN_TTL_MARGIN_SECONDS."""
    return f"{math.ceil(start_seconds + wait_seconds + TOKEN_TTL_MARGIN_SECONDS)}s"


class JoinError(RuntimeError):
    """The join stopped: which host, which check, what to do."""

    def __init__(self, node: str, check: str, message: str) -> None:
        self.node = node
        self.check = check
        text = f"{node}: join stopped at {check}: {message}"
        # Preflight reads the host and changes nothing on it: stopping there is a refusal.
        super().__init__(tagged(text, "preflight") if check == "preflight" else text)


class WorkerFencedError(JoinError):
    """The worker's Node carries the fence record: a join would rewrite the agent's configuration
    and start the agent the fence's drop-in holds down, so it stops before the host changes."""

    def __init__(self, node: str, recorded_at: str) -> None:
        self.recorded_at = recorded_at
        super().__init__(
            node,
            "preflight",
            f"{node} is fenced (recorded {recorded_at}), and a join changes nothing on a fenced host. Lift the "
            f"fence first (remove hk3s:fences.{node} and run up), then run up again to join it",
        )


@dataclass(frozen=True)
class JoinSpec:
    """Everything the join of one worker needs."""

    node: str
    node_ip: str
    external_ip: str
    server_url: str  # https://<server address in the cluster's mode>:6443
    ca_hash: str
    binary: K3sBinary
    pod_network: str
    network_mode: str
    validation_taint: str
    # The validation pod's image (hk3s:cluster.validation_image); pulled only when absent.
    validation_image: str
    labels: dict[str, str] = field(default_factory=dict)
    recorded_nodes: tuple[str, ...] = ()  # the server and every worker of the stack
    # The address the other nodes reach this one at (its node IP, or behind a 1:1 NAT the
    # public address the NAT forwards); empty: the node IP.
    cluster_address: str = ""
    registry: str | None = None
    removed_labels: tuple[str, ...] = ()  # labels an earlier config set and this one drops
    # The stack's taints (key=value:Effect), registered with the validation taint; and those an
    # earlier config set and this one drops (key:Effect). Taints set by anyone else stay.
    taints: tuple[str, ...] = ()
    removed_taints: tuple[str, ...] = ()
    # Every other recorded node (not the server): the program must reach each over SSH,
    # since a join changes their firewalls too.
    peers: tuple[SshTarget, ...] = ()
    # The server and the peers whose firewall the operator runs: an active UFW there stops
    # the join even with the ports open, since the new node's peer rules cannot be added.
    unmanaged_firewall_nodes: tuple[str, ...] = ()
    # The node's inbound rules when the operator runs its firewall (None: the program does).
    operator_firewall_rules: tuple[PortRule, ...] | None = None
    # With operator_firewall_rules: the stack accepts a node with no active host firewall at all
    # (hk3s:firewall.none_acknowledged); without it such a node stops the join.
    no_firewall_acknowledged: bool = False
    register_deadline: float = REGISTER_DEADLINE_SECONDS
    ready_deadline: float = READY_DEADLINE_SECONDS
    # How long an API call waits for the API through an outage (hk3s:cluster.api_wait_seconds).
    api_wait: float = API_WAIT_SECONDS


@dataclass(frozen=True)
class JoinResult:
    """The worker after a successful join."""

    name: str
    addresses: list[str]
    network_mode: str
    k3s_version: str
    state: str
    checks: dict[str, str]
    # The joined host's /etc/machine-id as its kubelet reported it: the next run tells a host
    # rebuilt under the node's name (another machine-id, or no agent at all) from this one.
    machine_id: str = ""


def diagnose_agent_log(node: str, lines: Sequence[str]) -> JoinError | None:
    """The most specific diagnosis the agent's log lines support, if any."""
    found = agent_log_diagnosis(lines)
    return None if found is None else JoinError(node, *found)


class Joiner:
    """One worker's join, over two pinned SSH sessions (worker and server)."""

    def __init__(self, spec: JoinSpec, worker: SshSession, server: SshSession, progress: Progress) -> None:
        self.spec = spec
        self.worker = worker
        self.server = server
        self.progress = progress
        # Every API call rides through a brief outage (a k3s restart on the server) and says so.
        self.cluster = ClusterApi(server, progress, spec.api_wait)
        self.checks: dict[str, str] = {}
        self.host: JoiningHost | None = None  # what preflight read on the worker
        self.cluster_reading: ClusterReading | None = None  # and on the server
        self.forget_node_password = False  # preflight found k3s's record of it must go
        self.binary: asyncio.Task[AgentBinary] | None = None  # started once preflight read the host

    async def _agent_binary(self) -> AgentBinary:
        if self.binary is None:
            self.binary = asyncio.create_task(agent_binary(self.spec.binary, None))
        return await self.binary

    def close(self) -> None:
        """A join stopped before its install leaves the binary's preparation: stop it, or take its
        error, so nothing is reported later as never retrieved."""
        if self.binary is not None:
            if not self.binary.done():
                self.binary.cancel()
            elif not self.binary.cancelled():
                self.binary.exception()

    # --- preflight ---------------------------------------------------------------
    async def preflight(self) -> tuple[HostFacts, NodeStatus | None]:
        self.progress("preflight")
        # The worker's reads go in one command (join_host), beside the server's list of nodes.
        host, cluster = await asyncio.gather(
            read_joining_host(
                self.worker,
                k3s_checksum=self.spec.binary.local_path is not None,
                operator_firewall=self.spec.operator_firewall_rules is not None,
            ),
            read_cluster(self.cluster, server_ufw=self.server.target.node in self.spec.unmanaged_firewall_nodes),
        )
        self.host, self.cluster_reading, facts = host, cluster, host.facts
        existing = next((n for n in cluster.nodes if n.name == self.spec.node), None)
        if existing is not None and FENCE_ANNOTATION in existing.annotations:
            raise WorkerFencedError(self.spec.node, existing.annotations[FENCE_ANNOTATION])
        # Hashed and compressed while the host is checked and prepared (join_host.agent_binary).
        self.binary = asyncio.create_task(agent_binary(self.spec.binary, host.k3s_sha256))
        unrecorded = sorted(n.name for n in cluster.nodes if n.name not in self.spec.recorded_nodes)
        if unrecorded:
            raise JoinError(
                self.spec.node,
                "unrecorded-workers",
                f"the cluster has worker(s) the program has not recorded: {', '.join(unrecorded)}. "
                "Add each to hk3s:workers (kind: existing, with its address) to adopt it, then run pulumi up",
            )
        await self._check_peers()
        own_state = existing is not None or host.joined_cluster_before(self.spec.ca_hash)
        problems = evaluate_preflight(
            self.spec.node,
            facts,
            PreflightRequirements(
                pod_network=self.spec.pod_network,
                own_k3s_state_expected=own_state,
                binary_architecture=self.spec.binary.local_architecture(),
            ),
        )
        if problems:
            raise JoinError(self.spec.node, "preflight", "; ".join(f"{p.check}: {p.message}" for p in problems))
        notice = container_engine_notice(self.spec.node, facts)
        if notice is not None:
            self.progress(notice)
        if self.spec.operator_firewall_rules is not None:
            self._check_operator_firewall(self.spec.operator_firewall_rules)
        if interface_of(facts, self.spec.node_ip) is None:
            raise JoinError(
                self.spec.node,
                "preflight",
                f"node IP {self.spec.node_ip} is on none of the host's interfaces "
                f"({', '.join(facts.ipv4_addresses)}); check the worker's address settings",
            )
        # Before the host changes: a host rebuilt under a live node's name stops here.
        await self._settle_node_password(existing)
        self.checks["preflight"] = "passed"
        return facts, existing

    def _check_operator_firewall(self, required: tuple[PortRule, ...]) -> None:
        """A firewall the program does not manage must already allow the cluster's traffic
        (an active firewall the program does not run would silently drop the new node's
        traffic, so it stops the join); list what to add. No active firewall at all stops it
        too, unless the stack acknowledges it: every port the node listens on would be open."""
        assert self.host is not None, "preflight reads the host first"
        report = evaluate_operator_firewall(
            self.host.firewall_inspection(),
            required,
            listening=listening_ports("worker", self.spec.pod_network),
            none_acknowledged=self.spec.no_firewall_acknowledged,
        )
        if report.stops_join:
            raise JoinError(self.spec.node, "firewall", report.message())
        self.checks["operator-firewall"] = (
            f"{report.firewall}: nothing missing, nothing that must stay closed open"
            if report.active
            else "none active (acknowledged): every port the node listens on is open to whoever reaches it"
        )

    async def _check_peers(self) -> None:
        """SSH access to the peers this join was given (a program run checks its recorded
        nodes once, before its joins, and gives none), and the server's UFW when the
        operator runs it there."""
        peers = [
            RecordedNode(peer, firewall_managed=peer.node not in self.spec.unmanaged_firewall_nodes)
            for peer in self.spec.peers
        ]
        # The server's UFW, when the operator runs it there, was read with the cluster (preflight).
        server_ufw = self.cluster_reading is not None and self.cluster_reading.server_ufw_active
        try:
            await check_recorded_nodes(
                peers, joining=self.spec.node, ufw_active_on=(self.server.target.node,) if server_ufw else ()
            )
        except NodeAccessError as error:
            raise JoinError(self.spec.node, error.check, str(error)) from None
        if self.spec.peers:
            self.checks["ssh-peers"] = f"{len(self.spec.peers)} reachable"

    # --- prepare -----------------------------------------------------------------
    async def prepare(self) -> None:
        """The journal entry (from here on, k3s state on this host is this program's, for this
        cluster), then node_prepare.sh: one command."""
        self.progress("preparing the host")
        await prepare_joining_host(self.worker, self.spec.ca_hash, self.spec.pod_network, self.progress)
        self.checks["prepare"] = "done"

    # --- join --------------------------------------------------------------------
    async def join(self, facts: HostFacts, existing: NodeStatus | None) -> NodeStatus:
        spec = self.spec
        rejoin = existing is not None
        # A rejoin needs no token while the agent's client certificate authenticates it; one whose
        # certificate expired (or is gone) has nothing else (its join token was spent), and k3s's
        # agent renews the certificate only through an authenticated request: it gets a fresh
        # one-time token, deleted once the agent holds a new certificate.
        dead_certificate = await client_certificate_dead(self.worker) if rejoin else None
        if rejoin:
            # Rejoin: checks run cordoned; running pods stay where they are.
            self.progress("already registered: cordoning for the checks (running pods stay)")
        if dead_certificate is not None:
            self.progress(f"{dead_certificate}: a fresh join token brings it a new certificate")
        # The permit stays while the Node exists: a kubelet creates its Node at every start (and
        # takes "already exists" as registered), and admission runs before that check, so a
        # revoked permit would refuse a joined node's restart. A node joined before this rule
        # gets it back here. Tokens an interrupted earlier join made for this node go first.
        assert self.cluster_reading is not None, "preflight reads the cluster first"
        # The binary goes up before the token is made: its upload is no part of the token's life.
        prepared = await upload_agent_binary(self.worker, spec.binary, await self._agent_binary(), self.progress)
        # The token is needed until the agent registered, and (a dead certificate) until it holds
        # a new certificate: two waits then.
        ttl = join_token_ttl(spec.register_deadline * (2 if dead_certificate is not None else 1))
        token = await grant_join(
            self.cluster,
            JoinGrant(
                node=spec.node,
                server_node=self.server.target.node,
                cordon=rejoin,
                forget_node_password=self.forget_node_password,
                stale_tokens=tuple(
                    token_id
                    for token_id, description in self.cluster_reading.token_ids.items()
                    if description == spec.node
                ),
                token_ttl=None if rejoin and dead_certificate is None else ttl,
            ),
        )
        if self.forget_node_password and rejoin:
            self.progress("node password record removed: this machine registered the node and lost its password")
        if token is not None:
            self.progress(f"join token {token.token_id} created (valid {ttl}, for {spec.node} only)")
        elif not await self._keeps_dead_token():
            await self._write_dead_token()

        def config(token_file: str | None) -> str:
            return agent_config(
                node=spec.node,
                server_url=spec.server_url,
                node_ip=spec.node_ip,
                external_ip=spec.external_ip,
                flannel_iface=interface_of(facts, spec.node_ip),
                labels={**spec.labels, MANAGED_LABEL: "true"},
                taints=[spec.validation_taint, *spec.taints],
                token_file=token_file,
            )

        try:
            installed = await install_agent(
                self.worker,
                binary=spec.binary,
                prepared=prepared,
                config_text=config(TOKEN_FILE),
                token_file=TOKEN_FILE,
                token=token,
                progress=self.progress,
            )
            if installed.results.get("fence_drop_in") == "removed":
                self.progress(
                    "removed a fence's drop-in left on the host (hk3s-fence.conf, from a fence that ended with the "
                    "worker given up), which kept its agent from starting"
                )
            if token is not None and (installed.results.get("service") == "running" or dead_certificate is not None):
                # A new token with an unchanged config: the running agent must read it (an agent
                # whose certificate expired is still starting, retrying with the spent token it read).
                await self.worker.run(["systemctl", "restart", "--no-block", "k3s-agent"], deadline=30)
            node = await self.wait_registered(installed.since)
            if dead_certificate is not None:
                # Its Node is there already: the token may go only once the agent used it.
                await self._wait_new_certificate(installed.since)
        except BaseException:
            if token is not None:
                await self._forget_token(token, ttl, registered=False)
            raise
        if token is not None:
            # Registered: the agent authenticates with its node certificate from now on. The token
            # stays in the file its config names, dead (see _forget_token): every k3s agent start
            # parses its configured token first and refuses an empty one, node certificate or not.
            await self._forget_token(token, ttl, registered=True)
        self.checks["registered"] = "yes"
        return node

    async def _settle_node_password(self, existing: NodeStatus | None) -> None:
        """k3s keeps a hash of each node's /etc/rancher/node/password and refuses an agent of that
        name with another password ("Node password rejected"). Its record is removed here only
        when it can belong to no other live host: the Node is gone (a record left by a refused
        join or a deleted node), or the Node was registered from this very machine (same
        machine-id) whose password file is lost (the grant removes it: forget_node_password). A live
        Node registered from another machine is a conflict the operator must resolve: the join
        stops naming it."""
        if existing is None:
            self.forget_node_password = True
            return
        assert self.host is not None, "preflight reads the host first"
        machine_id = self.host.machine_id
        if existing.machine_id and machine_id and existing.machine_id != machine_id:
            raise JoinError(
                self.spec.node,
                "node-password",
                f"a Node named {self.spec.node} is registered from another machine (machine-id "
                f"{existing.machine_id}, this host has {machine_id}): k3s would refuse this host (Node password "
                f"rejected, duplicate hostname). If the old host is gone, delete its Node (kubectl delete node "
                f"{self.spec.node}) and run pulumi up again; if it still runs, give this host another name in "
                "hk3s:workers",
            )
        # Removed with the join's grant (join_server), before the agent starts.
        self.forget_node_password = not self.host.keeps_node_password

    async def _revoke_permit(self) -> None:
        await revoke_join_permit(self.cluster, self.spec.node)

    async def _forget_token(self, token: JoinToken, ttl: str, *, registered: bool) -> None:
        """Delete the token's Secret on the server (and, for a join that failed, its file on the
        host and the node's permit); a failure here must not hide the join's own error.

        A registered node keeps the file: real k3s parses the configured token at every agent
        start, before it uses the node's certificate, and never starts with an empty one
        ("token must not be empty"), so without it the worker would not come back after a
        reboot or a restart. Keeping it is safe: the server deleted the token's Secret, so it
        authenticates nothing and can join nothing; what the agent still uses is the CA hash in
        it, which pins the server's CA at every start. The file is root-only (0600)."""
        try:
            await self.cluster.delete_token(token.token_id)
        except SshError as error:
            # Say the truth: the token lives until it expires, and it can join the node's name.
            self.progress(
                f"join token {token.token_id} could NOT be deleted ({error}); it stays valid until it expires "
                f"({ttl} after it was made): delete it sooner with "
                f"`kubectl -n kube-system delete secret bootstrap-token-{token.token_id}` on the server"
            )
        else:
            self.progress(
                f"join token {token.token_id} deleted" + (" (the agent keeps it, dead)" if registered else "")
            )
        if not registered:
            with contextlib.suppress(SshError):
                await self.worker.run(["rm", "-f", TOKEN_FILE], deadline=15)
            with contextlib.suppress(SshError):
                await self._revoke_permit()

    async def _wait_new_certificate(self, since: str) -> None:
        """Wait until the agent holds a client certificate that has not expired (the server signed
        it through the fresh token), diagnosing from the agent's log as the registration does."""
        deadline = self.paused_clock(self.spec.register_deadline)
        while (dead := await client_certificate_dead(self.worker)) is not None:
            lines = await agent_log(self.worker, since)
            diagnosis = diagnose_agent_log(self.spec.node, lines)
            if diagnosis is not None and diagnosis.check in ("ca-hash", "token-node", "node-password"):
                raise diagnosis
            if time.monotonic() > deadline():
                tail = " | ".join(log_message(line) for line in lines[-3:]) or "no agent log lines"
                raise JoinError(
                    self.spec.node,
                    "register",
                    f"the agent got no new client certificate within {self.spec.register_deadline:.0f}s ({dead}; "
                    f"agent log: {tail}); see journalctl -u k3s-agent on the host, then run up again",
                )
            await asyncio.sleep(POLL_SECONDS)
        self.progress("the agent holds a new client certificate")

    async def _keeps_dead_token(self) -> bool:
        """Whether the host's token file holds a token pinning this cluster's CA (only the
        hash is compared, on the host; the token itself is never read back)."""
        result = await self.worker.run(
            ["sh", "-c", 'grep -q "^K10$1::" "$2"', "-", self.spec.ca_hash, TOKEN_FILE], deadline=15, check=False
        )
        return result.exit_status == 0

    async def _write_dead_token(self) -> None:
        """A registered node whose host holds no token (joined by an earlier release that deleted
        it): give its agent one that k3s accepts at start-up, made for this node and deleted on
        the server before the host gets it, so it is never live while in use (see _forget_token)."""
        # Deleted before the host gets it: a minute is plenty.
        token = await self.cluster.create_join_token(self.spec.node, join_token_ttl(0, start_seconds=0))
        # Interrupted here, the next run deletes it as a stale token of this node (and it expires).
        await self.cluster.delete_token(token.token_id)
        await self.worker.upload(token.value.encode() + b"\n", TOKEN_FILE, deadline=30, mode=0o600)
        self.progress(f"the agent's token file restored (token {token.token_id}, deleted on the server)")

    async def wait_registered(self, since: str) -> NodeStatus:
        """Wait for the Node, diagnosing from the agent's log what keeps it away.

        The Node is watched for a poll interval at a time (it is there the moment it registers,
        with no interval to wait out), the agent's log read between: a diagnosis that never
        heals stops the wait within an interval, as when the Node was polled."""
        deadline = self.paused_clock(self.spec.register_deadline)
        self.progress("waiting for the node to register")
        while True:
            looked = time.monotonic()
            node = await self.cluster.watch_node(self.spec.node, POLL_SECONDS)
            if node is not None:
                return node
            lines = await agent_log(self.worker, since)
            diagnosis = diagnose_agent_log(self.spec.node, lines)
            # A CA mismatch or a refused node never heals by waiting (k3s would retry forever).
            if diagnosis is not None and diagnosis.check in ("ca-hash", "token-node", "node-password"):
                raise diagnosis
            if time.monotonic() > deadline():
                if diagnosis is not None:
                    raise diagnosis
                # The agent's log need not say it: once bootstrapped, k3s dials the server through its
                # local load balancer and logs those dial errors at debug level only. So ask the network.
                unreachable = await self._api_unreachable_from_node()
                if unreachable is not None:
                    raise unreachable
                tail = " | ".join(log_message(line) for line in lines[-3:]) or "no agent log lines"
                raise JoinError(
                    self.spec.node,
                    "register",
                    f"the node did not register within {self.spec.register_deadline:.0f}s (agent log: {tail}); "
                    "see journalctl -u k3s-agent on the host",
                )
            # What of the interval the watch did not wait (it ended early, without the Node).
            await asyncio.sleep(max(0.0, POLL_SECONDS - (time.monotonic() - looked)))

    async def _api_unreachable_from_node(self) -> JoinError | None:
        """A TCP connection from the node to the server's API port; the api-reachable diagnosis
        when it fails."""
        address, _, port = self.spec.server_url.removeprefix("https://").rpartition(":")
        why = await check_connection(self.worker, address, int(port or 6443))
        if why is None:
            return None
        return JoinError(
            self.spec.node,
            "api-reachable",
            f"the node cannot reach the Kubernetes API at {address}:{port} ({why}): open {port}/tcp from this "
            "node to the server in the cloud and host firewalls, and check its route to the server",
        )

    def paused_clock(self, seconds: float) -> Callable[[], float]:
        """A wait's deadline that stands still while the API is away: time spent waiting for
        the API (a k3s restart on the server) is no evidence that the node is not coming."""
        started, waited = time.monotonic(), self.cluster.waited_seconds
        return lambda: started + seconds + (self.cluster.waited_seconds - waited)

    async def wait_ready(self, registered: NodeStatus | None = None) -> NodeStatus:
        """Wait for the Node to be Ready (`registered`: as its registration showed it, no need to
        look again when it was Ready then). Watched, not polled: it returns the moment the Node
        turns Ready, each look lasting up to what is left of the deadline (at most
        READY_WATCH_SECONDS)."""
        deadline = self.paused_clock(self.spec.ready_deadline)
        node = registered
        while node is None or not node.ready:
            looked = time.monotonic()
            window = min(max(deadline() - looked, POLL_SECONDS), READY_WATCH_SECONDS)
            node = await self.cluster.watch_node(self.spec.node, window, lambda seen: seen.ready)
            if node is not None and node.ready:
                break
            if time.monotonic() > deadline():
                reason = node.ready_reason if node is not None else "node gone"
                raise JoinError(
                    self.spec.node,
                    "ready",
                    f"the node registered but was not Ready within {self.spec.ready_deadline:.0f}s ({reason}): "
                    "the kubelet is not healthy or the pod network ports are blocked; see journalctl -u k3s-agent "
                    "and check 51820/udp or 8472/udp between the nodes",
                )
            # What of the interval the watch did not wait (it ended early, the Node not Ready).
            await asyncio.sleep(max(0.0, POLL_SECONDS - (time.monotonic() - looked)))
        self.checks["ready"] = "yes"
        return node

    # --- validate while tainted ---------------------------------------------------------
    async def validate(self, node: NodeStatus) -> None:
        target = ValidatedNode(
            node=self.spec.node,
            server_url=self.spec.server_url,
            registry=self.spec.registry,
            validation_taint=self.spec.validation_taint,
            validation_image=self.spec.validation_image,
            kubelet_address=self.kubelet_address,
        )
        try:
            await TaintedNodeValidation(target, self).run(node)
        except ValidationError as failure:
            raise JoinError(self.spec.node, failure.check, failure.message) from None

    @property
    def kubelet_address(self) -> str:
        """Where the other nodes dial this node's kubelet: its cluster address (behind a 1:1 NAT
        the forwarded public address, not the node IP the NAT hides)."""
        return self.spec.cluster_address or self.spec.node_ip

    # --- release ------------------------------------------------------------------
    async def release(self, rejoin: bool) -> NodeStatus:
        self.progress("releasing: removing the validation taint")
        return await release_node(self.cluster, self.spec, Taint.parse(self.spec.validation_taint), rejoin=rejoin)


async def join_worker(worker: SshTarget, server: SshTarget, spec: JoinSpec, progress: Progress) -> JoinResult:
    """Preflight, prepare, join under the validation taint, validate, release."""
    started = time.monotonic()

    def timed(line: str) -> None:  # every line says how far into the join it is
        progress(f"{line} (at {time.monotonic() - started:.1f}s)")

    async with open_session(worker, shared=True) as worker_session, open_session(server, shared=True) as server_session:
        joiner = Joiner(spec, worker_session, server_session, timed)
        sessions = (worker_session, server_session)
        phases: dict[str, int] = {}  # commands sent in each phase

        async def phase(name: str, step: Awaitable[T]) -> T:
            before = sum(s.commands for s in sessions)
            done = await step
            phases[name] = sum(s.commands for s in sessions) - before
            return done

        try:
            facts, existing = await phase("preflight", joiner.preflight())
            await phase("prepare", joiner.prepare())
            rejoin = existing is not None
            node = await phase("ready", joiner.wait_ready(await phase("join", joiner.join(facts, existing))))
            await phase("validate", joiner.validate(node))
            node = await phase("release", joiner.release(rejoin))
        finally:
            joiner.close()
        # One machine-readable line for benchmarks: what the join cost in SSH terms.
        commands = sum(s.commands for s in sessions)
        remote = sum(s.remote_seconds for s in sessions)
        timed(
            f"join stats: ssh_connections={len(sessions)} commands={commands} "
            f"remote_seconds={remote:.2f} total_seconds={time.monotonic() - started:.2f} "
            f"commands_by_phase={','.join(f'{name}:{count}' for name, count in phases.items())}"
        )
        timed("joined and released")
        # The summary names each volume whose only copy sits on a worker, as status does. The
        # worker has joined by now: a failed read is said, not a failed join.
        try:
            for line in await single_copies_for_join(joiner.cluster, server.node):
                timed(line)
        except SshError as error:
            timed(f"the volumes' copies could not be read ({error}); status --check names single copies on workers")
        return JoinResult(
            name=node.name,
            addresses=sorted(set(node.addresses.get(kind, "") for kind in ("InternalIP", "ExternalIP")) - {""}),
            network_mode=spec.network_mode,
            k3s_version=node.kubelet_version,
            state="ready" if node.ready else "not-ready",
            checks=dict(joiner.checks),
            machine_id=node.machine_id,
        )
