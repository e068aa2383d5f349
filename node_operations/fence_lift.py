"""Lift a worker's fence (its entry removed from hk3s:fences): the worker rejoins.

The fence started the worker's workloads elsewhere; the worker comes back the way a join
brings a node in, so no pod lands on it before its checks pass. The order, and why:

1. **It must answer over SSH**: only a host the program can log in to can be started and
   checked; one that does not answer keeps its fence (power it on first: a Hetzner worker the
   fence powered off too, since the run's access check of the recorded nodes, before any
   lift, needs every unfenced worker to answer).
2. **The validation taint goes on first** (`hk3s.dev/validating=true:NoSchedule`), before
   anything else changes: once the out-of-service taint comes off, no pod is scheduled there
   until the checks pass.
3. **The drop-in goes and the agent starts** (`host_scripts/k3s_unfence.sh`); the lift waits
   until the Node is Ready again, from a kubelet that runs now.
4. **The out-of-service taint comes off**, then the join's checks run on the tainted node
   (`TaintedNodeValidation`: DNS, the API from the node, the kubelet from the server, a
   validation pod), then the validation taint and the fence's record go.
Every step is idempotent, so a lift cut anywhere finishes on the next `up`; a worker whose
Node is gone (removed from the stack in the same run) has nothing left to lift.

The lift logs in at the address the fence last stored (hk3s:workers' address while fenced), and
restarts the agent with the configuration the fence found. A change of the worker's join made
while it was fenced (in private mode a new public address: the Node's external IP) waits for the
first `up` after the lift, since the engine runs the join before the fence's delete and a fenced
worker's join changes nothing (providers/node_join.py): the last line then says to run `up` again.

A worker whose agent client certificate expired (or is gone) while it was fenced cannot
authenticate with it, and its join token was spent at the join: the lift writes a fresh one-time
token where the agent's configuration names its token before the agent starts (as a join does for
such a worker), waits until the agent holds a new certificate, and deletes the token.

A worker fenced across an upgrade was left at its release (its agent held down): the lift restarts
the binary it has, and the last line says to run `up` again, whose K3sUpgrade moves it to the
server's release as an upgrade moves any worker (providers/k3s_upgrade.py, `left_behind`). A worker
left behind by more than Kubernetes' version-skew policy allows (its kubelet more than three minor
releases older than the API server: fenced across several upgrades) is not started at its release:
the lift is refused before anything changes, naming the fix (give it up and add it back, so that
its join installs the server's release). The plan of an upgrade that takes the server that far from
a fenced worker says so (providers/k3s_upgrade.py).

Before anything changes, the host must still carry the address its Node was recorded with (the
cluster address every peer's firewall admits and the agent's configured node IP). In public mode
an address that changed while the worker was fenced is refused: the peers' firewalls, the
kubelet's address and the agent's configuration all name the old one, so a rejoin there would
either fail its checks half-way or open the cluster to an address nobody approved. The fix is
to give the host its address back, or to give the worker up (`remove --force`) and add it again
at its new address.

Before step 2, a host the fence stopped over SSH that has not booted since (its boot marker
still the one the fence recorded, `FENCE_BOOT_ANNOTATION`) is rebooted and the lift waits for
its new boot: whatever the fence's stop left behind does not outlive the fence (the drop-in keeps
the agent down through that reboot). A host the fence did not reach over SSH records no boot: it
was off, so it has booted since.

Once the validation taint is gone, the workloads the fence kept stopped start again
(node_operations/fence_workloads.py `start_stopped`), judged by their volumes' copies with the
rejoined worker's counted again: its copy that failed last is the newest; a copy on another node
that is NotReady or fenced is not current. Each owner the fence stopped is started by its own
record (a CronJob the fence suspended above a Job is resumed as well as the Job). One still
without a copy it may start from stays stopped, named, with its record on its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

import yaml

from host_scripts import script_path
from node_operations.fence import FENCE_ANNOTATION, FENCE_BOOT_ANNOTATION, FENCE_STOPPED_BY_ANNOTATION, OUT_OF_SERVICE
from node_operations.fence_workloads import NODE_STOPPED_ANNOTATION, WorkloadDecision
from node_operations.host_facts import gather_facts, interface_of
from node_operations.join import TOKEN_FILE, join_token_ttl
from node_operations.join_host import client_certificate_dead, private_file
from node_operations.join_validation import TaintedNodeValidation, ValidatedNode, ValidationError
from node_operations.k3s_install import CONFIG_PATH, parse_results
from node_operations.k3s_release import beyond_skew
from node_operations.reboot import BOOT_MARKER_COMMAND
from node_operations.refusal import tagged
from node_operations.volume_copies import NODE_UNHELD_ANNOTATION
from node_operations.worker_removal import worker_answers
from remote_access.host_steps import run_steps
from remote_access.kube import ClusterApi, JoinToken, NodeStatus, Repeat, Taint
from remote_access.ssh import SshError, SshSession, SshTarget, open_session

READY_DEADLINE_SECONDS = 180.0
UNFENCE_SCRIPT_DEADLINE_SECONDS = 120.0
TOKEN_WRITE_DEADLINE_SECONDS = 60.0
RESTART_DEADLINE_SECONDS = 30.0
POLL_SECONDS = 2.0
# A rebooted host boots and starts sshd within a minute or two (Hetzner's images, the lab's hosts).
BOOT_WAIT_SECONDS = 180.0

Progress = Callable[[str], None]


class FenceLiftRefusedError(SshError):
    """The lift was refused before anything changed: the fence stays."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(node, tagged(f"lifting the fence is refused: {message}. Nothing was changed", "fence"))


class FenceLiftError(SshError):
    """The lift stopped part way (the worker stays under the validation taint); the next `up` resumes it."""


class FenceLift:
    """One worker's lift, over a session to it and one to the server (the join's checks use
    both, as `JoinSessions`)."""

    def __init__(
        self,
        target: ValidatedNode,
        worker: SshSession,
        server: SshSession,
        cluster: ClusterApi,
        progress: Progress,
        *,
        accept_stale_data: bool = False,
        external_ip: str = "",
    ) -> None:
        self.target, self.worker, self.server, self.cluster = target, worker, server, cluster
        self.progress, self.accept_stale_data, self.external_ip = progress, accept_stale_data, external_ip
        self.checks: dict[str, str] = {}
        self.ready_deadline = READY_DEADLINE_SECONDS

    @property
    def node(self) -> str:
        return self.target.node

    def paused_clock(self, seconds: float) -> Callable[[], float]:
        """A wait's deadline that stands still while the API is away."""
        started, waited = time.monotonic(), self.cluster.waited_seconds
        return lambda: started + seconds + (self.cluster.waited_seconds - waited)

    async def _wait_ready(self) -> NodeStatus:
        deadline = self.paused_clock(self.ready_deadline)
        while True:
            node = await self.cluster.get_node(self.node)
            if node is not None and node.ready:
                return node
            if time.monotonic() > deadline():
                reason = node.ready_reason if node is not None else "node gone"
                raise FenceLiftError(
                    self.node,
                    f"the agent started but the Node was not Ready within {self.ready_deadline:.0f} s ({reason}); it "
                    "stays under the validation taint. See journalctl -u k3s-agent on it, then run up again",
                )
            await asyncio.sleep(POLL_SECONDS)

    async def run(self) -> None:
        validation = Taint.parse(self.target.validation_taint)
        if await self.cluster.get_node(self.node) is None:
            self.progress("its Node is gone: no fence left to lift")
            return
        await self.cluster.add_taint(self.node, validation)
        self.progress(f"lifting the fence: {validation} on, then the drop-in removed and the agent started")
        token = await self._fresh_token()
        try:
            node = await self._restart_agent(token is not None)
        except BaseException:
            if token is not None:
                # A lift that stops leaves no live token: the next run makes a fresh one.
                with contextlib.suppress(SshError):
                    await self.cluster.delete_token(token.token_id)
            raise
        if token is not None:
            # Its Secret goes; the file stays on the host, dead (as after a join: k3s's agent parses
            # its configured token at every start and only the CA hash in it still counts).
            await self.cluster.delete_token(token.token_id)
            self.progress(f"join token {token.token_id} deleted (the agent keeps it, dead)")
        await self.cluster.remove_taint(self.node, OUT_OF_SERVICE.key, OUT_OF_SERVICE.effect)
        self.progress(f"Ready again; {OUT_OF_SERVICE.key} removed, the join's checks run under {validation.key}")
        try:
            await TaintedNodeValidation(self.target, self).run(node)
        except ValidationError as failure:
            raise FenceLiftError(
                self.node,
                f"the rejoin stopped at {failure.check}: {failure.message}. It stays under {validation.key} (no pod "
                "is scheduled there); fix it and run up again",
            ) from None
        await self.cluster.remove_taint(self.node, validation.key)
        # The workloads the fence stopped start once the worker takes pods again (their copy may be there).
        decision = WorkloadDecision(self.cluster, self.node, self.progress, accept_stale_data=self.accept_stale_data)
        for line in (await decision.start_stopped(worker_back=True)).lines():
            self.progress(line)
        out = await self.cluster.kubectl(["get", "node", self.node, "-o", "json"], repeat=Repeat.READ)
        if FENCE_ANNOTATION in (json.loads(out)["metadata"].get("annotations") or {}):
            # A merge patch to null: repeated after an outage it finds the annotation gone and changes nothing.
            records = (
                FENCE_ANNOTATION,
                FENCE_BOOT_ANNOTATION,
                FENCE_STOPPED_BY_ANNOTATION,
                NODE_STOPPED_ANNOTATION,
                NODE_UNHELD_ANNOTATION,
            )
            unset = json.dumps({"metadata": {"annotations": dict.fromkeys(records)}})
            await self.cluster.kubectl(
                ["patch", "node", self.node, "--type", "merge", "-p", unset], repeat=Repeat.IDEMPOTENT
            )
        lifted = f"fence lifted: rejoined ({', '.join(f'{k} {v}' for k, v in self.checks.items())})"
        self.progress(lifted + await self._pending_release() + await self._pending_join())

    async def _restart_agent(self, fresh_token: bool) -> NodeStatus:
        """The drop-in removed and the agent started; Ready, and with `fresh_token` holding a new
        client certificate (only then may the token go)."""
        result = await self.worker.run_script(script_path("k3s_unfence.sh"), deadline=UNFENCE_SCRIPT_DEADLINE_SECONDS)
        results = parse_results(result.stdout)
        self.progress(f"drop-in {results.get('drop_in', '?')}, k3s-agent {results.get('agent', '?')}")
        if fresh_token:
            # An agent already starting (a host powered on after a fence that found it off) retries
            # with the spent token it read at its start: it must read the fresh one.
            await self.worker.run(
                ["systemctl", "restart", "--no-block", "k3s-agent"], deadline=RESTART_DEADLINE_SECONDS
            )
        node = await self._wait_ready()
        if fresh_token:
            await self._wait_new_certificate()
        return node

    async def _fresh_token(self) -> JoinToken | None:
        """A fresh one-time join token, written where the agent's configuration names its token, when
        the agent's client certificate expired or is gone (it may have expired while the worker was
        fenced). Its join token was spent at the join, so that certificate is all the agent has, and
        k3s's agent gets a new one only through an authenticated request: without a fresh token the
        agent would retry for ever and the lift wait for a Ready that never comes. None otherwise (a
        rejoin with a valid certificate needs no token)."""
        dead = await client_certificate_dead(self.worker)
        if dead is None:
            return None
        self.progress(f"{dead}: a fresh join token brings it a new certificate")
        for token_id, description in (await self.cluster.token_ids()).items():
            if description == self.node:  # made by a lift or join of this node cut short
                await self.cluster.delete_token(token_id)
        # It lives no longer than the lift could use it (the join's rule, node_operations/join.py):
        # its write, the agent's start, the waits for Ready and for the new certificate.
        ttl = join_token_ttl(
            2 * self.ready_deadline,
            start_seconds=TOKEN_WRITE_DEADLINE_SECONDS + UNFENCE_SCRIPT_DEADLINE_SECONDS + RESTART_DEADLINE_SECONDS,
        )
        token = await self.cluster.create_join_token(self.node, ttl)
        await run_steps(
            self.worker,
            [private_file(TOKEN_FILE, token.value + "\n", f"writing {TOKEN_FILE}")],
            deadline=TOKEN_WRITE_DEADLINE_SECONDS,
        )
        self.progress(f"join token {token.token_id} created (valid {ttl}, for {self.node} only)")
        return token

    async def _wait_new_certificate(self) -> None:
        """Wait until the agent holds a client certificate that has not expired (the server signed it
        through the fresh token): only then may the token go."""
        deadline = self.paused_clock(self.ready_deadline)
        while (dead := await client_certificate_dead(self.worker)) is not None:
            if time.monotonic() > deadline():
                raise FenceLiftError(
                    self.node,
                    f"the agent got no new client certificate within {self.ready_deadline:.0f} s ({dead}); it stays "
                    "under the validation taint. See journalctl -u k3s-agent on it, then run up again",
                )
            await asyncio.sleep(POLL_SECONDS)
        self.progress("the agent holds a new client certificate")

    async def _pending_release(self) -> str:
        """What the operator still has to run when the rejoined worker runs another k3s release than
        the server: an upgrade made while it was fenced left it alone (its agent was held down), and
        the lift restarts the binary it has. K3sUpgrade moves it, as any worker, in the next run."""
        worker, server = await self.cluster.get_node(self.node), await self.cluster.get_node(self.server.target.node)
        if worker is None or server is None or worker.kubelet_version == server.kubelet_version:
            return ""
        return (
            f". It runs k3s {worker.kubelet_version} and the server {server.kubelet_version} (an upgrade left it alone "
            f"while it was fenced): run up again, which moves it to {server.kubelet_version} as an upgrade moves a "
            "worker"
        )

    async def _pending_join(self) -> str:
        """What the operator still has to run when the agent publishes another external address
        than the worker's join now has: the lift restarts the agent with its configuration as the
        fence found it, and the join (which the engine ran before this lift, leaving the fenced
        worker alone) writes the new one only in the next run."""
        if not self.external_ip:
            return ""
        result = await self.worker.run(["cat", CONFIG_PATH], deadline=30, check=False)
        config = _agent_config(result.stdout) if result.exit_status == 0 else {}
        # k3s publishes its node IP as the external one when no node-external-ip is set.
        published = str(config.get("node-external-ip") or config.get("node-ip") or "")
        if not published or published == self.external_ip:
            return ""
        return (
            f". Its Node still publishes {published} as its external address (the agent's {CONFIG_PATH}) and its "
            f"join now has {self.external_ip}: run up again, which joins it again so its Node publishes "
            f"{self.external_ip}"
        )


async def _boot(worker: SshTarget) -> str | None:
    """The host's boot marker, or None when it does not answer."""
    try:
        async with open_session(worker) as session:
            result = await session.run(["sh", "-c", BOOT_MARKER_COMMAND], deadline=20)
    except SshError:
        return None
    return " ".join(result.stdout.split())


async def reboot_unless_booted(worker: SshTarget, cluster: ClusterApi, progress: Progress) -> None:
    """Reboot the host when it is still in the boot the fence recorded, and wait for its new boot."""
    out = await cluster.kubectl(["get", "node", worker.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
    recorded = (
        ((json.loads(out).get("metadata") or {}).get("annotations") or {}).get(FENCE_BOOT_ANNOTATION)
        if out.strip()
        else None
    )
    if not recorded:
        return
    current = await _boot(worker)
    if current is None:
        raise FenceLiftError(worker.node, "its boot could not be read over SSH; the fence stays. Run up again")
    if current != recorded:
        progress("it has booted since the fence: no reboot needed")
        return
    progress(
        f"it has not booted since the fence (boot {recorded}): rebooting it first; the drop-in keeps the agent down"
    )
    try:
        async with open_session(worker) as session:
            await session.run(["systemctl", "reboot", "--no-block"], deadline=30)
    except SshError as error:
        # The host may cut the connection as it goes down; its boot marker below says whether it rebooted.
        progress(f"the connection ended with the reboot command ({error})")
    deadline = time.monotonic() + BOOT_WAIT_SECONDS
    while (boot := await _boot(worker)) in (None, recorded):
        if time.monotonic() > deadline:
            raise FenceLiftError(
                worker.node,
                f"the host did not come back from its reboot over SSH within {BOOT_WAIT_SECONDS:.0f} s; the "
                "fence stays (the drop-in keeps the agent down). Check its console, then run up again",
            )
        await asyncio.sleep(POLL_SECONDS)
    progress(f"rebooted (boot {boot})")


def _agent_config(text: str) -> dict[str, object]:
    """The agent's configuration file as a mapping ({} when it is not one)."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


async def address_refusal(worker: SshTarget, network_mode: str) -> str | None:
    """Why the lift may not go on because the host's address changed while it was fenced, or None.

    The address is the node IP its join wrote into the agent's configuration (the Node's
    InternalIP): behind a 1:1 NAT the address peers dial is another, so that one is not looked
    for on the host."""
    if network_mode != "public":
        return None
    async with open_session(worker) as session:
        config = await session.run(["cat", CONFIG_PATH], deadline=30, check=False)
        facts = await gather_facts(session)
    loaded = _agent_config(config.stdout) if config.exit_status == 0 else {}
    recorded = str(loaded.get("node-ip") or "")
    if not recorded or interface_of(facts, recorded) is not None:
        # No configuration of the program's left: the join's checks judge the host as they find it.
        return None
    found = ", ".join(" on ".join(reversed(entry.split(" ", 1))) for entry in facts.ipv4_addresses) or "no IPv4 address"
    return (
        f"{worker.node}'s address changed while it was fenced: it joined with node IP {recorded} ({CONFIG_PATH}), "
        f"and the host now has {found}. In public mode every peer's firewall, the kubelet's address and the agent's "
        f"configuration name the recorded one. Give the host {recorded} back and run up again (the lift logs in at "
        f"{worker.address}, the address the fence last stored: to log in at another, put hk3s:fences.{worker.node} "
        "back with that address in hk3s:workers for one run), or give the worker up "
        f"(`node remove {worker.node} --force`, or hk3s:fences.{worker.node}.force_remove with the worker removed) and "
        "add it again at its new address"
    )


async def lift_fence(
    server: SshTarget,
    worker: SshTarget,
    target: ValidatedNode,
    *,
    api_wait: float,
    progress: Progress,
    network_mode: str = "",
    accept_stale_data: bool = False,
    external_ip: str = "",
) -> None:
    """Lift `worker`'s fence through the server's API (see the module docstring). `external_ip`
    is the address the worker's join now publishes: the last line says to run `up` again when the
    agent still publishes another."""
    silent = await worker_answers(worker)
    if silent is not None:
        if await _node_gone(server, worker.node, api_wait, progress):
            # Given up (force_remove) or deregistered: no fence is left to lift on a host that is
            # often powered off for good.
            progress("its Node is gone (the worker was given up or removed): no fence left to lift")
            return
        raise FenceLiftRefusedError(
            worker.node,
            f"{worker.node} does not answer over SSH at {worker.address} ({silent}), and a fence is lifted by a "
            f"rejoin, which needs the host up; the fence stays. Power it on (or bring its SSH back) and run up "
            f"again, or put hk3s:fences.{worker.node} back. If its address changed, the fence lifts at the address "
            f"it last stored: put hk3s:fences.{worker.node} back, run up with the new address (the fence stores "
            "it), then remove the entry",
        )
    refusal = await address_refusal(worker, network_mode)
    if refusal is not None:
        raise FenceLiftRefusedError(worker.node, refusal)
    async with open_session(server) as server_session:
        cluster = ClusterApi(server_session, progress=progress, api_wait=api_wait)
        if (skew := await skew_refusal(cluster, worker.node, server.node)) is not None:
            raise FenceLiftRefusedError(worker.node, skew)
        await reboot_unless_booted(worker, cluster, progress)
        async with open_session(worker) as worker_session:
            lift = FenceLift(
                target,
                worker_session,
                server_session,
                cluster,
                progress,
                accept_stale_data=accept_stale_data,
                external_ip=external_ip,
            )
            await lift.run()


async def skew_refusal(cluster: ClusterApi, node: str, server_node: str) -> str | None:
    """Why the worker's agent may not be started at the release its Node last ran (Kubernetes'
    version-skew policy, against the server's release), or None. Read before anything changes."""
    worker, server = await cluster.get_node(node), await cluster.get_node(server_node)
    if worker is None or server is None:
        return None
    why = beyond_skew(worker.kubelet_version, server.kubelet_version)
    if why is None:
        return None
    return (
        f"its {why}: its agent is not started at that release. Give it up (hk3s node remove {node} --force) and "
        f"add it back to hk3s:workers: its join installs {server.kubelet_version}"
    )


async def _node_gone(server: SshTarget, node: str, api_wait: float, progress: Progress) -> bool:
    """Whether the cluster positively has no Node `node` (False when the server cannot say)."""
    try:
        async with open_session(server) as session:
            return await ClusterApi(session, progress=progress, api_wait=api_wait).get_node(node) is None
    except SshError:
        return False
