"""Fence a worker that is down: prove it is down, record the fence, stop what is left of it,
then let Kubernetes start its workloads elsewhere.

Kubernetes cannot tell a dead host from one that lost its network and may still be writing,
so it moves nothing off a NotReady node on its own. The fence is how the operator says the
worker is down; the program then proves it before anything moves. The order, and why:

1. **Only a worker that is down**: its Node has been NotReady (the Ready condition False or
   Unknown) for at least `MIN_DOWN_SECONDS`, by the condition's lastTransitionTime against the
   server's clock (the controller manager on the server set that time, so no other clock's skew
   counts). A shorter outage usually heals itself; fencing it would stop a worker for nothing.
2. **Recorded first**: the fence is written on the Node (`FENCE_ANNOTATION`, the time) before
   anything is touched, and every step below is idempotent, so a fence cut anywhere (even by
   SIGKILL) resumes on the next `up`: a recorded fence skips step 1 and finishes the rest.
   What can be judged without changing anything (whether the host answers, the operator's
   confirmation, the kubelet check) is judged before the record, so a refusal changes nothing.
3. **Stop the worker**:
   - it answers over SSH: `host_scripts/k3s_fence.sh` writes a systemd drop-in that keeps the
     k3s agent from starting (even after a reboot), stops the agent and every container of
     k3s's, and lists what of k3s is left (a container's process, a shim of k3s's containerd, a
     Longhorn process, a pod mount); anything left stops the fence, named, before the taint.
     No step waits on the host for ever: each unmount is bounded, and a pod mount whose
     filesystem does not answer in time (a Longhorn volume whose iSCSI target went with its
     instance manager) is taken off without a flush (forced, else detached) unless a process
     still holds it, and named in the run's output.
     Another container engine on the host (Docker's, a containerd of the host's own) is not
     k3s's: it and its containers keep running, and are not counted as left. The host's boot marker is
     recorded on the Node (`FENCE_BOOT_ANNOTATION`, the first seen), so the lift can tell
     whether it has booted since.
   - it is a Hetzner server (one the program created, or an existing host naming its server in
     `hcloud_server`): the program proves it off itself, so no confirmation is asked. Before the
     record, the server is looked up through the Hetzner API (a wrong token or server refuses the
     fence unchanged) and must be proven to be this worker: it holds one of the worker's own
     addresses (a private one only in this cluster's Hetzner network, by its id: private addresses
     repeat across networks), carries the owner and node labels the program gave it when the
     program created it, and holds none of the control plane's or another Node's addresses, so a
     typo in `hcloud_server` powers nothing off (node_operations/hetzner_identity.py). The
     power-off then goes to that server's id. After the record: if the host still answers over
     SSH, `k3s_fence.sh` first writes the drop-in and stops the agent and every container (so
     the agent stays down even if someone powers the server on again; what is left is reported,
     not fatal, as the power goes next); then the server is powered off through
     the API (`poweroff`, which cuts the power; never the ACPI `shutdown`, whose action finishing
     says only that the signal was sent), the fence waits for the action and confirms the
     server's status reads `off`. A failed action stops the fence (recorded, not tainted), naming
     the action's error; the next `up` resumes it. Last, the server's dial of the worker's
     kubelet must fail: a kubelet still answering means `hcloud_server` names another machine,
     and the fence stops there.
   - it does not answer: the operator must confirm it is powered off and stays off
     (`hk3s:fences.<worker>.powered_off`), and the server must fail to reach its kubelet at its
     recorded address: only silence passes (no answer at all, no machine answering ARP for
     an address on the server's link, or, behind a router, ICMP errors from the router only:
     its "host unreachable" says no machine answered it for the address); a kubelet that
     answers, a TCP reset or an ICMP error from the worker's own address (something there is
     up), an address that is not IPv4, or a check that did not run refuses the fence, saying
     what answered. That the host stays off is what the operator confirms.
4. **Taint** the Node `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`: Kubernetes
   evicts its pods, and its pod garbage collector force-deletes the ones left terminating on an
   out-of-service NotReady node, so their controllers start them elsewhere. This taint is the
   only way this product has pods force-deleted (tests/test_force_deletion.py holds every
   other code path to it). The fence waits until every pod that does not tolerate the taint
   is gone and reports where their workloads run now.

Before the taint, each workload whose pods on the worker use Longhorn volumes is judged by the
copies of its volumes elsewhere, and one that may not start elsewhere is stopped first
(node_operations/fence_workloads.py). The fence deletes no pod itself (see there why). Lifting a
fence is node_operations/fence_lift.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

from host_scripts import script_path
from node_operations.disk_probe import PYTHON_LAUNCHER
from node_operations.fence_workloads import WorkloadDecision, WorkloadReport
from node_operations.health import FENCE_ANNOTATION, OUT_OF_SERVICE_TAINT
from node_operations.hetzner_identity import identity_refusal
from node_operations.join_validation import KUBELET_DIAL_SECONDS, KUBELET_PORT, dial_kubelet
from node_operations.k3s_install import parse_results
from node_operations.reboot import BOOT_MARKER_COMMAND
from node_operations.refusal import tagged
from node_operations.worker_removal import worker_answers
from remote_access.hetzner_api import HetznerAccess, HetznerApiError, ServerState, power_off, server_state
from remote_access.kube import ClusterApi, Repeat, Taint
from remote_access.ssh import SshError, SshSession, SshTarget, open_session

OUT_OF_SERVICE = Taint(OUT_OF_SERVICE_TAINT, "nodeshutdown", "NoExecute")
# The labels k3s gives a server's Node (pkg/node's role labels): the control plane is never fenced.
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
MASTER_LABEL = "node-role.kubernetes.io/master"
# The boot the fence found the worker in when it stopped it over SSH (node_operations.reboot's boot
# marker): lifting the fence reboots a host still in that boot, so nothing the fence stopped
# half-way (a mount, a process a stop missed) outlives the fence.
FENCE_BOOT_ANNOTATION = "hk3s.dev/fenced-boot"
# The fence's record that the host was proven stopped, and how ("ssh", "hetzner", "powered-off"),
# written right before the out-of-service taint: a give-up (node_operations.forced_removal) needs it,
# since the taint alone may have been put on by hand.
FENCE_STOPPED_BY_ANNOTATION = "hk3s.dev/fence-stopped-by"
# How long a Node must have been NotReady: longer than a brief network loss or an agent restart.
MIN_DOWN_SECONDS = 60.0
FENCE_SCRIPT_DEADLINE_SECONDS = 180.0
# The pod garbage collector runs every 20 s; an eviction plus a collection fit well within this.
PODS_GONE_TIMEOUT_SECONDS = 180.0
POLL_SECONDS = 2.0

Progress = Callable[[str], None]


class FenceRefusedError(SshError):
    """The fence was refused before anything changed; the message names the setting or host and the fix."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(node, tagged(f"fencing is refused: {message}. Nothing was changed", "fence"))


class FenceStoppedError(SshError):
    """The fence is recorded but stopped before its end; the next `up` resumes it."""


@dataclass(frozen=True)
class FenceOrder:
    """What the operator said (hk3s:fences.<worker>) and where the cluster reaches the worker."""

    powered_off: bool
    kubelet_address: str
    hcloud_server: str | None = None
    """The worker's Hetzner server (its id, or its name), when it is one: the fence powers it off."""
    hcloud: HetznerAccess | None = None
    """The Hetzner API's token and endpoint (hcloud:token, hcloud:endpoint)."""
    hcloud_network: int | None = None
    """The id of this cluster's Hetzner network, when the program created one."""
    hcloud_labels: Mapping[str, str] = field(default_factory=dict)
    """The labels the program gave the worker's server, when it created it (its owner and node)."""
    accept_stale_data: bool = False
    """Workloads may start from copies of their Longhorn volumes that may be older (fence_workloads)."""
    stack: str = ""
    """The stack's name, in the refusal of a scale-up of a workload the fence holds (fence_holds)."""


@dataclass(frozen=True)
class ReadyCondition:
    """A Node's Ready condition: "True", "False" or "Unknown" ("" when it reports none), and since when."""

    status: str
    since: datetime | None

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> ReadyCondition:
        conditions = (node.get("status") or {}).get("conditions") or []
        ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
        since = ready.get("lastTransitionTime")
        return cls(str(ready.get("status") or ""), datetime.fromisoformat(since) if since else None)


def down_refusal(node: str, ready: ReadyCondition, now: datetime, min_down: float = MIN_DOWN_SECONDS) -> str | None:
    """Why `node` is not down long enough to be fenced (None when it is)."""
    fix = f"remove hk3s:fences.{node} if it is not down; otherwise run up again"
    if ready.status == "True":
        return (
            f"{node} is Ready: a fence is only for a worker that is down; {fix} once it has been NotReady for "
            f"{min_down:.0f} s"
        )
    if ready.since is None:
        return f"{node}'s Node reports no Ready condition yet, so how long it has been down is unknown; {fix} later"
    down = (now - ready.since).total_seconds()
    if down < min_down:
        return (
            f"{node} has been NotReady for only {max(down, 0):.0f} s (since {ready.since:%H:%M:%S} UTC); a fence "
            f"needs it down for at least {min_down:.0f} s, since a shorter outage usually heals itself; {fix} in "
            f"{min_down - down:.0f} s"
        )
    return None


def unreachable_refusal(node: str, silent: str, powered_off: bool) -> str | None:
    """Why a worker that does not answer over SSH (`silent` says why) cannot be fenced unconfirmed."""
    if powered_off:
        return None
    return (
        f"{node} does not answer over SSH ({silent}), so the program cannot stop it itself. If the host is powered "
        f"off and stays off until it rejoins, confirm it with hk3s:fences.{node}.powered_off: true (scripts/hk3s "
        f"node fence {node} --powered-off); otherwise bring its SSH back and run up again"
    )


@dataclass(frozen=True)
class KubeletDial:
    """What the server's dial of a worker's kubelet port met, and whether that is silence.

    Only silence shows a machine off: no answer at all within the dial's time; for an address on
    the server's own link, no machine answering its ARP (the kernel then says "no route to host"
    with the neighbour entry FAILED); for an address behind a router, ICMP errors about the dial
    from other addresses only: a router whose ARP for the address got no answer says "host
    unreachable" itself (Linux's arp_error_report -> dst_link_failure), the normal sign of a dead
    host on a routed path. Anything the machine answered means it may be up: a TCP reset
    ("connection refused": its kernel, or a firewall on it, answered) or an ICMP error sent from
    the worker's own address (its firewall's reject), or from a neighbour on the server's link
    that answered ARP for it."""

    seen: str  # what the dial met, said for a person
    silent: bool = False
    connected: bool = False
    reset: bool = False  # a TCP reset: a network stack at the address is up
    ran: bool = True  # False: the check itself did not run as meant


# ICMP errors by (type, code), by the names nftables and iptables give them (RFC 792, RFC 1812).
ICMP_ERRORS = {
    (3, 0): "net-unreachable",
    (3, 1): "host-unreachable",
    (3, 3): "port-unreachable",
    (3, 9): "net-prohibited",
    (3, 10): "host-prohibited",
    (3, 13): "admin-prohibited",
}


def icmp_error_name(kind: int, code: int) -> str:
    if kind == 3:
        return ICMP_ERRORS.get((kind, code), f"destination-unreachable (code {code})")
    return {11: "time-exceeded", 12: "parameter-problem"}.get(kind, f"type {kind} code {code}")


def routed_dial_judgement(
    address: str, own: Collection[str], router: str, local: str, result: Mapping[str, Any]
) -> KubeletDial:
    """The dial through `router` as host_scripts/icmp_answers.py saw it (its JSON), judged: an
    ICMP error from one of the worker's `own` addresses is the machine answering; errors from other
    addresses only are a router saying nothing answered for the address; one from the server
    itself (`local`) means the server could not reach its router, so the address was never dialled."""
    outcome = str(result.get("outcome", ""))
    answers = [(str(a["from"]), icmp_error_name(int(a["type"]), int(a["code"]))) for a in result.get("icmp") or []]
    if outcome == "connected":
        return KubeletDial("the connection opened: a kubelet answers there", connected=True)
    if outcome == "ECONNREFUSED":
        return KubeletDial(
            "a TCP reset answered (connection refused): the machine at that address, or a firewall in front of it, is "
            "up",
            reset=True,
        )
    if mine := next(((sender, name) for sender, name in answers if sender in own), None):
        return KubeletDial(
            f"an ICMP {mine[1]} answered from {mine[0]} itself (no route to host): the machine at the address is up"
        )
    if local and (server_said := next((name for sender, name in answers if sender == local), None)):
        return KubeletDial(
            f"the server itself said {server_said} for its router {router}: the dial never left the server",
            ran=False,
        )
    if answers:
        senders = ", ".join(sorted({sender for sender, _ in answers}))
        names = ", ".join(sorted({name for _, name in answers}))
        return KubeletDial(
            f"only {senders}, a router on the way, answered: {names} for {address} (no machine answered for the "
            "address)",
            silent=True,
        )
    if outcome == "no answer":
        return KubeletDial(f"no answer within {KUBELET_DIAL_SECONDS} s: nothing answered", silent=True)
    ended = outcome or "with no outcome"
    return KubeletDial(f"the dial through router {router} ended {ended}, no ICMP error seen", ran=False)


async def routed_dial(server: SshSession, address: str, own: Collection[str], route: str) -> KubeletDial | None:
    """The dial of `address` through the router `route` (the server's `ip -o route get` line)
    names, watching who sends the ICMP errors about it (host_scripts/icmp_answers.py); None when
    the server cannot watch (no python3, no raw socket): the plain dial then judges alone."""
    words = route.split()
    router = words[words.index("via") + 1] if "via" in words[:-1] else "?"
    local = words[words.index("src") + 1] if "src" in words[:-1] else ""
    result = await server.run(
        ["sh", "-c", PYTHON_LAUNCHER, "icmp-answers", address, str(KUBELET_PORT), str(KUBELET_DIAL_SECONDS)],
        stdin=script_path("icmp_answers.py").read_text(),
        deadline=KUBELET_DIAL_SECONDS + 15,
        check=False,
    )
    if result.exit_status != 0:
        return None
    try:
        seen = json.loads(result.stdout)
    except json.JSONDecodeError:
        return KubeletDial(f"the dial through router {router} printed {result.stdout.strip()[:200]!r}", ran=False)
    return routed_dial_judgement(address, {address, *own}, router, local, seen)


async def dial_kubelet_silence(server: SshSession, address: str, own: Collection[str] = ()) -> KubeletDial:
    """The server's dial of the kubelet port at `address`, judged (see KubeletDial); `own` are
    the worker's other addresses (an ICMP error from any of them is the worker answering).
    Through a router, the dial watches who sends its ICMP errors; where the server cannot watch,
    an ICMP error through a router is not known to come from the router, so it is an answer."""
    route = await server.run(["ip", "-o", "route", "get", address], deadline=20, check=False)
    first = route.stdout.splitlines()[0] if route.stdout.strip() else ""
    if " via " in first and (routed := await routed_dial(server, address, own, first)) is not None:
        return routed
    dialled = await dial_kubelet(server, address)
    if dialled is None:
        return KubeletDial("the connection opened: a kubelet answers there", connected=True)
    if dialled.startswith("no answer"):
        return KubeletDial(f"{dialled}: nothing answered", silent=True)
    if dialled == "connection refused":
        return KubeletDial(
            "a TCP reset answered (connection refused): the machine at that address, or a firewall in front of it, is "
            "up",
            reset=True,
        )
    if dialled == "no route to host":
        script = 'ip -o route get "$1"; ip neigh show to "$1"'
        result = await server.run(["sh", "-c", script, "-", address], deadline=20, check=False)
        lines = result.stdout.splitlines()
        on_link = bool(lines) and " via " not in lines[0]
        state = lines[-1].split()[-1] if len(lines) > 1 and lines[-1].split() else ""
        if on_link and state in ("FAILED", "INCOMPLETE"):
            return KubeletDial("no machine answered ARP for the address on the server's link", silent=True)
        return KubeletDial(
            "an ICMP host-unreachable answered (no route to host"
            + (f"; the address's neighbour entry is {state}" if on_link and state else "")
            + ("" if on_link else "; who sent it through the router could not be told: the server needs python3")
            + "): something answered for the address, so the machine may be up"
        )
    if dialled == "network is unreachable":
        return KubeletDial("the server has no route to the address (network is unreachable)", ran=False)
    return KubeletDial(f"the dial did not run as meant ({dialled})", ran=False)


def kubelet_refusal(node: str, address: str, dial: KubeletDial) -> str | None:
    """Why the server's dial of the kubelet does not show the worker is off (None when it does)."""
    where = f"{address}:{KUBELET_PORT}"
    if dial.silent:
        return None
    if dial.connected:
        return (
            f"{node}'s kubelet still answers at {where} (checked from the server), so the host is running even though "
            f"it is reported powered off. Power it off (or stop its k3s agent), then run up again"
        )
    if not dial.ran:
        return (
            f"the server's check of {node}'s kubelet at {where} did not run as meant ({dial.seen}), so the kubelet is "
            f"not known to be silent. Check that the server can dial {where} (bash, timeout and ip on the server), "
            "then run up again"
        )
    return (
        f"the server's dial of {node}'s kubelet at {where} was answered: {dial.seen}. Only a dial that nothing "
        f"answers shows the host off, so {node} may still be running. Power it off (if it is a Hetzner server, name "
        f"it in hcloud_server so the fence powers it off through the API), or find what answers at {address}, then "
        "run up again"
    )


def address_refusal(node: str, address: str) -> str | None:
    """The kubelet check needs an IPv4 address (the address the cluster records for the worker)."""
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return (
            f"{node}'s recorded address {address!r} is not an IPv4 address, so the server cannot check that its "
            f"kubelet is off; set the worker's address in hk3s:workers to its IPv4 address and run up again"
        )
    return None


def tolerates(pod: Mapping[str, Any], taint: Taint) -> bool:
    """Whether the pod tolerates `taint` (and so stays on a node carrying it)."""
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        if toleration.get("effect") not in (None, "", taint.effect):
            continue
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        if operator == "Exists" and key in ("", taint.key):
            return True
        if operator == "Equal" and key == taint.key and (toleration.get("value") or "") == taint.value:
            return True
    return False


def pod_name(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def node_addresses(node: Mapping[str, Any]) -> list[str]:
    """A Node's InternalIP and ExternalIP addresses, as the cluster records them."""
    return [
        str(a["address"])
        for a in (node.get("status") or {}).get("addresses") or []
        if a.get("type") in ("InternalIP", "ExternalIP") and a.get("address")
    ]


def owner_of(pod: Mapping[str, Any]) -> str | None:
    """`Kind namespace/name` of the pod's controller, or None for a pod no controller starts again."""
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return f"{owner['kind']} {pod['metadata']['namespace']}/{owner['name']}"
    return None


@dataclass
class FenceReport:
    """What the fence did."""

    node: str
    recorded_at: str = ""
    resumed: bool = False
    down_seconds: float | None = None
    # "ssh": stopped by the program; "hetzner": powered off through the Hetzner API (after the
    # drop-in, when the host answered); "powered-off": confirmed off by the operator
    stopped_by: str = ""
    boot: str = ""  # the boot marker recorded when the fence stopped the host over SSH
    hetzner_action: str = ""  # "<server> (id N): action M (stop_server)", or "<server> (id N) was off"
    pods_deleted: list[str] = field(default_factory=list)
    pods_staying: list[str] = field(default_factory=list)
    running_now: dict[str, list[str]] = field(default_factory=dict)  # controller -> "pod on node (phase)"
    not_restarted: list[str] = field(default_factory=list)  # deleted pods no controller starts again
    workloads: WorkloadReport = field(default_factory=WorkloadReport)  # the Longhorn decisions

    def lines(self) -> list[str]:
        """The report, one line per fact."""
        how = {
            "ssh": "stopped over SSH (agent held down by a drop-in)",
            "hetzner": f"powered off through the Hetzner API ({self.hetzner_action}), status off",
        }.get(self.stopped_by, "confirmed powered off")
        down = f", NotReady for {self.down_seconds:.0f} s" if self.down_seconds is not None else ""
        lines = [
            f"fenced (recorded {self.recorded_at}{', resumed' if self.resumed else ''}{down}): {how}, tainted "
            f"{OUT_OF_SERVICE}; {len(self.pods_deleted)} pod(s) deleted by Kubernetes"
        ]
        for controller, pods in sorted(self.running_now.items()):
            if controller in self.workloads.stopped_controllers:
                continue  # kept stopped: said below, with why
            lines.append(f"{controller} now runs: {', '.join(pods) or 'no pod yet'}")
        if self.not_restarted:
            lines.append(f"deleted with no controller to start them again: {', '.join(self.not_restarted)}")
        if self.pods_staying:
            staying = ", ".join(self.pods_staying)
            lines.append(f"staying on the node (they tolerate the out-of-service taint): {staying}")
        return lines + self.workloads.lines()


class WorkerFence:
    """One worker's fence (see the module docstring)."""

    def __init__(
        self,
        server: SshSession,
        api: ClusterApi,
        worker: SshTarget,
        order: FenceOrder,
        progress: Progress,
        *,
        min_down: float = MIN_DOWN_SECONDS,
        pods_timeout: float = PODS_GONE_TIMEOUT_SECONDS,
    ) -> None:
        self.server, self.api, self.worker, self.order = server, api, worker, order
        self.node, self.progress = worker.node, progress
        self.min_down, self.pods_timeout = min_down, pods_timeout
        self.report = FenceReport(worker.node)
        self.answers_ssh = False
        self.recorded_boot = ""
        self.node_object: dict[str, Any] = {}
        self.hetzner_id = ""  # the Hetzner server proven to be this worker, by id: what the power-off acts on

    async def _server_now(self) -> datetime:
        result = await self.server.run(["date", "-u", "+%s"], deadline=20)
        return datetime.fromtimestamp(int(result.stdout.strip()), UTC)

    async def _node_object(self) -> dict[str, Any]:
        out = await self.api.kubectl(["get", "node", self.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
        if not out.strip():
            raise FenceRefusedError(
                self.node,
                f"the cluster has no Node named {self.node}: there is nothing to fence. Remove hk3s:fences.{self.node}",
            )
        node: dict[str, Any] = json.loads(out)
        return node

    async def _judge(self) -> None:
        """Every check that needs no change, before the record: down long enough (unless the fence is
        recorded already), and how it is stopped."""
        node = self.node_object = await self._node_object()
        ready, now = ReadyCondition.of(node), await self._server_now()
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        recorded, self.recorded_boot = annotations.get(FENCE_ANNOTATION), annotations.get(FENCE_BOOT_ANNOTATION, "")
        if ready.status != "True" and ready.since is not None:
            self.report.down_seconds = (now - ready.since).total_seconds()
        if recorded:
            self.report.recorded_at, self.report.resumed = recorded, True
            self.progress(f"the fence recorded at {recorded} resumes")
        elif (refusal := down_refusal(self.node, ready, now, self.min_down)) is not None:
            raise FenceRefusedError(self.node, refusal)
        silent = await worker_answers(self.worker)
        if self.order.hcloud_server is not None:
            await self._judge_hetzner(silent)
            return
        if silent is None:
            self.report.stopped_by = "ssh"
            return
        self.progress(f"does not answer over SSH ({silent})")
        refusal = unreachable_refusal(self.node, silent, self.order.powered_off) or address_refusal(
            self.node, self.order.kubelet_address
        )
        if refusal is None:
            dial = await dial_kubelet_silence(self.server, self.order.kubelet_address, self._own_addresses())
            refusal = kubelet_refusal(self.node, self.order.kubelet_address, dial)
        if refusal is not None and self.report.resumed:
            # The record is there from an earlier run: not "nothing changed", but nothing more.
            raise FenceStoppedError(
                self.node, f"the fence recorded at {self.report.recorded_at} cannot go on: {refusal}"
            )
        if refusal is not None:
            raise FenceRefusedError(self.node, refusal)
        where = f"{self.order.kubelet_address}:{KUBELET_PORT}"
        self.progress(f"confirmed powered off; its kubelet at {where} is silent ({dial.seen})")
        self.report.stopped_by = "powered-off"

    def _own_addresses(self) -> set[str]:
        """The worker's addresses: where the program logs in, its kubelet's, its Node's."""
        return {self.worker.address, self.order.kubelet_address, *node_addresses(self.node_object)}

    def _refuse(self, refusal: str) -> NoReturn:
        if self.report.resumed:
            # The record is there from an earlier run: not "nothing changed", but nothing more.
            raise FenceStoppedError(
                self.node, f"the fence recorded at {self.report.recorded_at} cannot go on: {refusal}"
            )
        raise FenceRefusedError(self.node, refusal)

    async def _judge_hetzner(self, silent: str | None) -> None:
        """A Hetzner worker: the API must know its server (before the record: a wrong token or
        server changes nothing), and its kubelet address must be one the server can dial."""
        server, access = str(self.order.hcloud_server), self.order.hcloud
        if access is None or not access.token:
            self._refuse(
                f"{self.node} is Hetzner server {server}, which the fence powers off through the Hetzner API, but "
                "the stack has no Hetzner token; set it (pulumi config set --secret hcloud:token <token>) and run up "
                "again"
            )
        try:
            state = await server_state(access, server)
        except HetznerApiError as error:
            self._refuse(f"{self.node}'s Hetzner server cannot be read: {error}")
        if (refusal := address_refusal(self.node, self.order.kubelet_address)) is not None:
            self._refuse(refusal)
        if (refusal := await self._identity_refusal(state)) is not None:
            self._refuse(refusal)
        self.hetzner_id = str(state.id)
        self.answers_ssh = silent is None
        answers = "answers over SSH" if silent is None else f"does not answer over SSH ({silent})"
        self.progress(f"is Hetzner server {state.name} (id {state.id}, {state.status}) and {answers}")
        self.report.stopped_by = "hetzner"

    async def _identity_refusal(self, state: ServerState) -> str | None:
        """Why the Hetzner server `state` is not proven to be this worker (None when it is): the
        power goes to whatever hcloud_server names, so a typo would cut the control plane or a
        bystander while this worker runs on (node_operations.hetzner_identity: an address of the
        worker's, a private one only in this cluster's network; the labels of a server the program
        created; none of another node's addresses)."""
        nodes = json.loads(await self.api.kubectl(["get", "nodes", "-o", "json"], repeat=Repeat.READ)).get("items", [])
        control_plane = [self.server.target.address]
        others: list[tuple[str, str]] = []
        for other in nodes:
            name = other["metadata"]["name"]
            labels = other["metadata"].get("labels") or {}
            addresses = node_addresses(other)
            if name == self.node:
                continue
            if CONTROL_PLANE_LABEL in labels or MASTER_LABEL in labels:
                control_plane += addresses
            else:
                others += [(name, address) for address in addresses]
        mine = sorted({self.worker.address, self.order.kubelet_address, *node_addresses(self.node_object)})
        return identity_refusal(
            self.node,
            state,
            mine=mine,
            control_plane=control_plane,
            others=others,
            network=self.order.hcloud_network,
            labels=self.order.hcloud_labels,
        )

    async def _stop_through_hetzner(self) -> None:
        """Drop-in first when the host answers (the agent stays down should the server be powered
        on again), then the power off, confirmed by the API and by a kubelet that no longer answers."""
        if self.answers_ssh:
            await self._stop_over_ssh(leftovers_stop=False)
        assert self.order.hcloud is not None  # _judge_hetzner refuses without it
        try:
            # By the id proven to be this worker (a name could be given to another server meanwhile).
            state, action = await power_off(self.order.hcloud, self.hetzner_id, self.progress)
        except HetznerApiError as error:
            raise FenceStoppedError(
                self.node,
                f"the fence is recorded but powering the host off did not finish: {error}. The node is not tainted, "
                "so nothing was started elsewhere; the next up resumes the fence",
            ) from None
        where = f"{state.name} (id {state.id})"
        self.report.hetzner_action = (
            f"{where}: action {action.id} ({action.command})" if action else f"{where} was off already"
        )
        self.progress(f"Hetzner server {self.report.hetzner_action}; its status reads off")
        address = self.order.kubelet_address
        # The API proved the power off and the server's addresses proved it is this worker; what the
        # dial must not meet is a machine up at the address: a kubelet, or a TCP reset from a kernel.
        dial = await dial_kubelet_silence(self.server, address, self._own_addresses())
        if dial.connected or dial.reset or not dial.ran:
            seen = "still answers" if dial.connected else f"could not be shown silent ({dial.seen})"
            raise FenceStoppedError(
                self.node,
                f"Hetzner server {where} is off, but {self.node}'s kubelet at {address}:{KUBELET_PORT} {seen} "
                f"(checked from the server). If it answers, the worker's Hetzner server (hcloud_server) names another "
                f"machine: fix it, power the wrong server back on, and stop {self.node} yourself. The node is not "
                "tainted; run up again",
            )
        self.progress(f"its kubelet at {address}:{KUBELET_PORT} does not answer ({dial.seen})")

    async def _record(self) -> None:
        if self.report.recorded_at:
            return
        recorded = f"{await self._server_now():%Y-%m-%dT%H:%M:%SZ}"
        await self.api.kubectl(
            ["annotate", "node", self.node, "--overwrite", f"{FENCE_ANNOTATION}={recorded}"], repeat=Repeat.IDEMPOTENT
        )
        self.report.recorded_at = recorded
        self.progress(f"fence recorded on the Node ({FENCE_ANNOTATION}={recorded})")

    async def _record_stopped(self) -> None:
        """The host is proven stopped: say so on the Node, and how, before the taint."""
        await self.api.kubectl(
            ["annotate", "node", self.node, "--overwrite", f"{FENCE_STOPPED_BY_ANNOTATION}={self.report.stopped_by}"],
            repeat=Repeat.IDEMPOTENT,
        )

    async def _stop_over_ssh(self, *, leftovers_stop: bool = True) -> None:
        self.progress("stopping the k3s agent and every container; a drop-in keeps the agent down")
        try:
            async with open_session(self.worker) as session:
                result = await session.run_script(script_path("k3s_fence.sh"), deadline=FENCE_SCRIPT_DEADLINE_SECONDS)
                boot = " ".join((await session.run(["sh", "-c", BOOT_MARKER_COMMAND], deadline=20)).stdout.split())
        except SshError as error:
            raise FenceStoppedError(
                self.node, f"the fence is recorded but stopping the host did not finish ({error}); run up again"
            ) from None
        if not self.recorded_boot:
            # The first boot seen stays: a resumed fence may find the host booted again since.
            await self.api.kubectl(
                ["annotate", "node", self.node, "--overwrite", f"{FENCE_BOOT_ANNOTATION}={boot}"],
                repeat=Repeat.IDEMPOTENT,
            )
            self.recorded_boot = boot
        self.report.boot = self.recorded_boot
        results = parse_results(result.stdout)
        unflushed = results.get("unflushed", "").split()
        if unflushed:
            # Not a leftover: gone from the host's mounts. What the host had not yet written to their
            # device is lost with them, as in a power off; the copies on other nodes are what count.
            self.progress(
                "unmounted without a flush, their filesystem not answering within the script's bounds (writes not "
                f"yet on their device are lost with them, as in a power off): {', '.join(unflushed)}"
            )
        left = results.get("left", "").split()
        if left and not leftovers_stop:
            self.progress(f"left on the host, ended by the power off next: {', '.join(left)}")
            return
        if left:
            raise FenceStoppedError(
                self.node,
                f"the fence is recorded and the agent held down, but still on the host: {', '.join(left)}. The node "
                "is not tainted, so nothing was started elsewhere. Stop or unmount these (or power the host off), then "
                "run up again: the fence resumes",
            )
        self.progress("no container, shim, Longhorn process or pod mount is left on the host")

    async def _pods(self, node: str | None = None) -> list[dict[str, Any]]:
        args = ["get", "pods", "-A", "-o", "json"] + (["--field-selector", f"spec.nodeName={node}"] if node else [])
        items: list[dict[str, Any]] = json.loads(await self.api.kubectl(args, repeat=Repeat.READ)).get("items", [])
        return items

    async def _let_pods_go(self) -> None:
        """Taint the node out of service, wait until Kubernetes deleted every pod that does not
        tolerate it, and report where their controllers run pods now."""
        before = await self._pods(self.node)
        leaving = [pod for pod in before if not tolerates(pod, OUT_OF_SERVICE)]
        self.report.pods_staying = [pod_name(pod) for pod in before if tolerates(pod, OUT_OF_SERVICE)]
        decision = WorkloadDecision(
            self.api, self.node, self.progress, accept_stale_data=self.order.accept_stale_data, stack=self.order.stack
        )
        self.report.workloads = await decision.decide(leaving)
        # The copies judged above are read again right before the taint, which lets pods go.
        await decision.recheck()
        await self.api.add_taint(self.node, OUT_OF_SERVICE)
        self.progress(f"tainted {OUT_OF_SERVICE}: waiting for Kubernetes to delete {len(leaving)} pod(s)")
        deadline = time.monotonic() + self.pods_timeout
        uids = {pod["metadata"]["uid"] for pod in leaving}
        # The fence deletes none of them itself: a pod Kubernetes has not deleted keeps its volumes
        # attached to the worker (the attach-detach controller releases them only once the pod is
        # terminated or gone), so nothing the fence could read would prove them released.
        while left := [p for p in await self._pods(self.node) if p["metadata"]["uid"] in uids]:
            if time.monotonic() > deadline:
                raise FenceStoppedError(
                    self.node,
                    f"the node is fenced and tainted, but Kubernetes has not deleted {', '.join(map(pod_name, left))} "
                    f"within {self.pods_timeout:.0f} s; check the kube-controller-manager on the server, then run up "
                    "again",
                )
            await asyncio.sleep(POLL_SECONDS)
        self.report.pods_deleted = sorted(pod_name(pod) for pod in leaving)
        controllers = {owner_of(pod) for pod in leaving}
        self.report.not_restarted = sorted(pod_name(pod) for pod in leaving if owner_of(pod) is None)
        now = await self._pods()
        for controller in sorted(c for c in controllers if c is not None):
            self.report.running_now[controller] = [
                f"{pod['metadata']['name']} on {pod['spec'].get('nodeName') or 'no node yet'} "
                f"({(pod.get('status') or {}).get('phase', 'Pending')})"
                for pod in now
                if owner_of(pod) == controller
            ]

    async def run(self) -> FenceReport:
        await self._judge()
        await self._record()
        if self.report.stopped_by == "ssh":
            await self._stop_over_ssh()
        elif self.report.stopped_by == "hetzner":
            await self._stop_through_hetzner()
        await self._record_stopped()
        await self._let_pods_go()
        return self.report


async def fence_worker(
    server: SshTarget, worker: SshTarget, order: FenceOrder, *, api_wait: float, progress: Progress
) -> FenceReport:
    """Fence `worker` through the server's API (see the module docstring)."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        return await WorkerFence(session, api, worker, order, progress).run()
