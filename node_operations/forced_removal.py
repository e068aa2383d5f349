"""Give a fenced worker up (hk3s:fences.<worker>.force_remove, CLI `node remove NAME --force`):
deregister it without a drain or a copy moved, for a host that is powered off or gone for good.

A normal removal (node_operations.worker_removal) needs the worker to answer: it moves the
copies off, drains and wipes the host. A worker that is gone for good cannot be drained, and
the fence has already proved it stopped and let its workloads start elsewhere. What is left
is its registration. The rules, and why:

1. **Only a worker whose fence completed**: its Node must carry the fence's record, the
   fence's record that the host was proven stopped (`FENCE_STOPPED_BY_ANNOTATION`: stopped over
   SSH with nothing left on it, powered off through the Hetzner API with its status off and its
   kubelet silent, or confirmed powered off with its kubelet silent), and the out-of-service
   taint the fence puts on right after. Deleting a Node is a force-deletion of its pods (the pod
   garbage collector deletes at once the pods of a Node that is gone), so a fence that was
   recorded but stopped before that proof (a power-off action that failed, a process left on the
   host) gives nothing up: the host may still run and write. The taint alone is no fence: a
   person may put it on by hand (Kubernetes' own steps for a non-graceful node shutdown say to),
   and it says nothing about the host. Deregistering a worker that was never fenced would let
   Kubernetes forget a host that may still be writing.
2. **The host is stopped now, not only when it was fenced**: a host may be powered on again
   since (a `powered_off` fence writes no drop-in to hold its agent). So at the give-up:
   - the host answers over SSH: the fence's systemd drop-in must hold its agent down and the
     agent not run. A host that answers and runs its agent is refused: remove it without force
     (drained, copies moved, wiped), or fence it again.
   - its sshd answers but refuses the login (the key, or a host key other than the recorded
     one): refused. The host is up, and whether the fence holds it cannot be read; an
     authentication failure is not silence.
   - nothing answers over SSH (no answer, a refused or unreachable connection): its Node must
     be NotReady (a kubelet posting Ready runs), and the server's dial of its kubelet, at each of
     the Node's addresses, must meet silence (node_operations.fence's rule: nothing answers, or
     no machine answers ARP on the server's link). An sshd stopped on a running host is no
     proof that the host is off.
3. **Deregister**: the name's join permit is revoked first, then the Node, its Longhorn node and
   k3s's node password go. The host is left as it is, its data included: a copy only it held
   stays on its disk for a person to salvage, and the drop-in (where the fence could write one)
   keeps its agent down. The peers' firewalls drop it after this (the roster runs before every
   firewall change).
4. **The name is unusable until it joins again**: the host keeps its kubelet certificate (valid
   a year, and Kubernetes revokes no client certificate), and NodeRestriction lets a kubelet
   create its own Node. A host powered on again, where a firewall still lets it reach the API,
   would bring its Node back. The join-permit admission refuses a kubelet's Node with no permit,
   and only a join of the name grants one again, so the revoked permit is the deny record: the
   old kubelet's Node (and one made with any live bootstrap token) is refused and never exists to
   take pods (node_operations.join_permits). A k3s-side refusal (the node password) cannot hold
   it: the old host knows its password, and the record goes here so a new host can take the name.
Every step is idempotent: a worker already deregistered is reported gone.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node_operations.fence import (
    FENCE_ANNOTATION,
    FENCE_STOPPED_BY_ANNOTATION,
    OUT_OF_SERVICE,
    ReadyCondition,
    dial_kubelet_silence,
    kubelet_refusal,
    node_addresses,
)
from node_operations.join_permits import revoke_join_permit
from node_operations.refusal import tagged
from node_operations.worker_removal import ANSWER_SECONDS, LONGHORN_NAMESPACE, LONGHORN_NODE_CRD, RemovalRefusedError
from node_operations.workload_start import read_stopped_lines
from remote_access.kube import ClusterApi, Repeat
from remote_access.ssh import HostKeyChangedError, SshError, SshLoginRefusedError, SshSession, SshTarget, open_session

# The fence's drop-in (host_scripts/k3s_fence.sh): while it exists the agent does not start.
FENCE_DROP_IN = "/etc/systemd/system/k3s-agent.service.d/hk3s-fence.conf"
HELD_CHECK = (
    f"test -s {FENCE_DROP_IN} && echo drop-in=present || echo drop-in=absent; "
    "systemctl is-active k3s-agent >/dev/null 2>&1 && echo agent=active || echo agent=inactive"
)

Progress = Callable[[str], None]


def not_held(node: str, held: str) -> str:
    """Why an answering host is not given up, and what to do."""
    return tagged(
        "giving the worker up is refused: its host answers over SSH and the fence does not hold it "
        f"stopped ({held}). Remove it without force (node remove {node}: drained, copies moved, wiped), or fence "
        "it again. Nothing was changed",
        "removal",
    )


def login_refused(node: str, error: SshError) -> str:
    """Why a host whose sshd refused the login is not given up."""
    return tagged(
        f"giving the worker up is refused: its host answers over SSH, but the login failed ({error}). An "
        "authentication or host-key failure is not silence: the host is up, and whether the fence still holds it "
        f"stopped cannot be read. Let the program log in again (the key in the user's authorized_keys, or the host "
        f"key hk3s:ssh.host_keys.{node} once verified), then give it up again: it is given up once the fence's "
        f"drop-in is seen holding its agent down. Or remove it without force (node remove {node}). Nothing was "
        "changed",
        "removal",
    )


@dataclass(frozen=True)
class Hold:
    """What SSH says of a fenced worker's host: it answered and the fence holds it (`held`), it
    answered otherwise (`refusal`), or nothing answered (`silent`, why)."""

    held: bool = False
    refusal: str | None = None
    silent: str | None = None


async def fence_hold(worker: SshTarget) -> Hold:
    """Whether the host answers over SSH and, if it does, whether the fence holds it stopped."""
    logged_in = False
    try:
        async with open_session(worker) as session:
            logged_in = True
            result = await session.run(["sh", "-c", HELD_CHECK], deadline=ANSWER_SECONDS)
    except (SshLoginRefusedError, HostKeyChangedError) as error:
        return Hold(refusal=login_refused(worker.node, error))
    except SshError as error:
        if logged_in:  # it answered: what it holds is unknown, which is no silence either
            return Hold(refusal=not_held(worker.node, f"the check did not finish: {error}"))
        return Hold(silent=str(error))
    said = result.stdout.split()
    if said == ["drop-in=present", "agent=inactive"]:
        return Hold(held=True)
    return Hold(refusal=not_held(worker.node, ", ".join(said) or "no answer to the check"))


async def host_silence_refusal(session: SshSession, node: str, found: dict[str, Any], silent: str) -> str | None:
    """For a host that does not answer over SSH (`silent` says why): why it is not shown off now
    (None when it is): its Node NotReady, and the server's dial of its kubelet at each of the
    Node's addresses met by silence."""
    ready = ReadyCondition.of(found)
    fix = (
        f"If the host was powered on again since its fence, power it off (or fence it again: hk3s:fences.{node}), "
        f"or remove it without force (node remove {node}); then give it up again. Nothing was changed"
    )
    if ready.status == "True":
        return tagged(
            f"giving the worker up is refused: {node}'s Node is Ready (its kubelet posts its status), so its host "
            f"runs, although it does not answer over SSH ({silent}): a host whose sshd is stopped or blocked is not "
            f"off. {fix}",
            "removal",
        )
    addresses = [a for a in dict.fromkeys(node_addresses(found)) if _ipv4(a)]
    if not addresses:
        return tagged(
            f"giving the worker up is refused: {node}'s Node records no IPv4 address, so the server cannot check that "
            f"its kubelet is silent, and it does not answer over SSH ({silent}). {fix}",
            "removal",
        )
    # Behind a router, an ICMP error from one of the worker's own addresses means its host is up;
    # one from the router alone is the silence of a dead host (the fence's own rule).
    own = set(node_addresses(found))
    for address in addresses:
        dial = await dial_kubelet_silence(session, address, own)
        if (refusal := kubelet_refusal(node, address, dial)) is not None:
            return tagged(f"giving the worker up is refused: {refusal.rstrip('.')}. Nothing was changed", "removal")
    return None


def _ipv4(address: str) -> bool:
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return False
    return True


def incomplete_fence(node: str, found: dict[str, Any]) -> str | None:
    """Why the worker whose Node is `found` cannot be given up by what its Node says (None when its
    fence is recorded and completed: the fence's record that the host was proven stopped, and the
    out-of-service taint, are on)."""
    annotations = found["metadata"].get("annotations") or {}
    recorded = annotations.get(FENCE_ANNOTATION)
    if not recorded:
        return tagged(
            f"giving the worker up is refused: {node} is not fenced (no fence recorded on its Node). Fence it first "
            f"(hk3s:fences.{node}, CLI node fence {node}), or remove it without force. Nothing was changed",
            "removal",
        )
    taints = (found.get("spec") or {}).get("taints") or []
    tainted = any(t.get("key") == OUT_OF_SERVICE.key and t.get("effect") == OUT_OF_SERVICE.effect for t in taints)
    stopped_by = annotations.get(FENCE_STOPPED_BY_ANNOTATION)
    if tainted and stopped_by:
        return None
    finish = (
        f"Finish the fence first: run up again with hk3s:fences.{node} (scripts/hk3s up), which resumes it and names "
        "what stops it; give the worker up once it reports fenced. Nothing was changed"
    )
    if tainted:
        return tagged(
            f"giving the worker up is refused: the fence of {node} recorded at {recorded} did not complete: its Node "
            f"carries the {OUT_OF_SERVICE.key} taint but not the fence's record that the host was proven stopped "
            f"({FENCE_STOPPED_BY_ANNOTATION}, written right before the fence's own taint). A taint put on by hand "
            "(as Kubernetes' steps for a non-graceful node shutdown say) proves nothing about the host, which may "
            f"still run and write. {finish}. (A fence completed by a release before that record: once you have "
            f"checked that the host is off for good, record it yourself, kubectl annotate node {node} "
            f"{FENCE_STOPPED_BY_ANNOTATION}=powered-off, and give it up again: the host is checked again then.)",
            "removal",
        )
    return tagged(
        f"giving the worker up is refused: the fence of {node} recorded at {recorded} did not complete, so its host "
        "is not proven stopped and may still run and write (the fence taints the Node "
        f"{OUT_OF_SERVICE.key} only once the host was stopped over SSH with nothing left, powered off through the "
        f"Hetzner API, or confirmed powered off with its kubelet silent; its Node has no such taint). {finish}",
        "removal",
    )


async def judge_give_up(api: ClusterApi, server: SshSession, worker: SshTarget) -> dict[str, Any] | None:
    """The worker's Node when it may be given up (None when it has no Node left); raises
    RemovalRefusedError, changing nothing, when its fence is missing or incomplete, or when its
    host is not shown stopped now (see the module docstring, rule 2)."""
    out = await api.kubectl(["get", "node", worker.node, "-o", "json", "--ignore-not-found"], repeat=Repeat.READ)
    if not out.strip():
        return None
    found: dict[str, Any] = json.loads(out)
    if (refusal := incomplete_fence(worker.node, found)) is not None:
        raise RemovalRefusedError(worker.node, refusal)
    hold = await fence_hold(worker)
    if hold.refusal is not None:
        raise RemovalRefusedError(worker.node, hold.refusal)
    if hold.silent is not None and (refusal := await host_silence_refusal(server, worker.node, found, hold.silent)):
        raise RemovalRefusedError(worker.node, refusal)
    return found


async def check_give_up(server: SshTarget, worker: SshTarget, *, api_wait: float, progress: Progress) -> None:
    """`judge_give_up` through the server's API, before anything of the run changes."""
    async with open_session(server) as session:
        await judge_give_up(ClusterApi(session, progress=progress, api_wait=api_wait), session, worker)


async def give_up_worker(
    server: SshTarget, worker: SshTarget, *, longhorn: bool, api_wait: float, progress: Progress
) -> str:
    """Deregister the fenced `worker` through the server's API (see the module docstring); the
    report's line."""
    async with open_session(server) as session:
        api = ClusterApi(session, progress=progress, api_wait=api_wait)
        # Judged again here, right before the Node goes: the check ran before the run's other changes.
        found = await judge_give_up(api, session, worker)
        # The permit before the Node: no moment with the Node gone and the name still admitted.
        await revoke_join_permit(api, worker.node)
        if found is not None:
            await api.kubectl(["delete", "node", worker.node, "--ignore-not-found"], repeat=Repeat.IDEMPOTENT)
        if longhorn:
            await api.kubectl(
                ["delete", LONGHORN_NODE_CRD, worker.node, "-n", LONGHORN_NAMESPACE, "--ignore-not-found"],
                repeat=Repeat.IDEMPOTENT,
            )
        await api.delete_node_password(worker.node)
        # What its fence stopped stays stopped: no lift will come to start it, so each is named
        # with the command that judges and starts it.
        for line in await read_stopped_lines(api, worker.node):
            progress(line)
    if found is None:
        return "given up: no Node was left; its join permit, Longhorn node and node password are gone too"
    recorded = found["metadata"]["annotations"][FENCE_ANNOTATION]
    return (
        f"given up (fenced since {recorded}): its join permit, Node, Longhorn node and node password are "
        "gone, without a drain; the host was left as it is (its data and the fence's drop-in); its name "
        "registers no Node until it joins again"
    )
