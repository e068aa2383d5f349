"""Validating a newly registered worker while it runs under the validation taint.

The node's own checks (DNS, the server's API from the node, Longhorn's
prerequisites, the registry when one is configured: node_validate.sh), the API
server reaching the kubelet (through the agent's tunnel, as logs and exec do),
the server connecting to the node's 10250/tcp itself (what metrics and anything
else that dials a kubelet directly need; k3s's tunnel hides a blocked 10250),
and a pod that runs to completion on the node. A failed check raises
ValidationError naming it; the join turns that into its JoinError.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from host_scripts import script_path
from node_operations.k3s_install import parse_results
from remote_access.host_steps import HostStep
from remote_access.kube import (
    KUBECTL_DEADLINE_SECONDS,
    ApiUnavailableError,
    ClusterApi,
    NodeStatus,
    Repeat,
    healthz_args,
    kubectl_step,
)
from remote_access.ssh import RemoteCommandError, SshError, SshSession

Progress = Callable[[str], None]

POLL_SECONDS = 2.0
VALIDATE_DEADLINE_SECONDS = 120.0
KUBELET_REACH_SECONDS = 30.0
KUBELET_PORT = 10250
KUBELET_DIAL_SECONDS = 5
VALIDATION_POD_SECONDS = 90.0
VALIDATION_POD_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class ValidatedNode:
    """The node under validation, as the checks name and reach it."""

    node: str
    server_url: str  # https://<server address in the cluster's mode>:6443
    registry: str | None
    validation_taint: str
    # The validation pod's image (hk3s:cluster.validation_image); pulled only when absent.
    validation_image: str
    # Where the other nodes dial its kubelet: its cluster address (behind a 1:1 NAT the
    # forwarded public address, not the node IP the NAT hides).
    kubelet_address: str


class JoinSessions(Protocol):
    """What the validation uses of the join it is part of."""

    worker: SshSession
    server: SshSession
    cluster: ClusterApi  # every API call rides through a brief outage of the API
    progress: Progress
    checks: dict[str, str]  # each check's result, reported with the join's

    def paused_clock(self, seconds: float) -> Callable[[], float]:
        """A wait's deadline that stands still while the API is away."""
        ...


class ValidationError(Exception):
    """A check of the tainted node failed: which check, what to do."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        self.message = message
        super().__init__(f"{check}: {message}")


class TaintedNodeValidation:
    """The checks of one node under the validation taint, over the join's sessions;
    each check's result goes into `checks`."""

    def __init__(self, target: ValidatedNode, join: JoinSessions) -> None:
        self.target = target
        self.worker = join.worker
        self.server = join.server
        self.cluster = join.cluster
        self.progress = join.progress
        self.checks = join.checks
        self.paused_clock = join.paused_clock

    async def run(self, node: NodeStatus) -> None:
        """Every check in turn; the first that fails raises ValidationError."""
        self.progress("validating while tainted")
        server_host = self.target.server_url.removeprefix("https://").split(":")[0]
        result = await self.worker.run_script(
            script_path("node_validate.sh"),
            [server_host, self.target.registry or "-"],
            deadline=VALIDATE_DEADLINE_SECONDS,
            check=False,
        )
        if parse_results(result.stdout).get("api-from-node", "").startswith("failed"):
            # From the node, an API restarting on the server looks the same as a blocked 6443:
            # wait for the API (through an outage) and check once more before it counts.
            await self.cluster.wait_api()
            result = await self.worker.run_script(
                script_path("node_validate.sh"),
                [server_host, self.target.registry or "-"],
                deadline=VALIDATE_DEADLINE_SECONDS,
                check=False,
            )
        results = parse_results(result.stdout)
        self.checks.update(results)
        failed = {name: value for name, value in results.items() if value.startswith("failed")}
        if result.exit_status != 0 or failed:
            detail = "; ".join(f"{name}: {value}" for name, value in failed.items()) or result.stderr.strip()
            raise ValidationError("validation", detail)
        # The API server reaching the kubelet: what logs and exec need. A kubelet that
        # was just restarted (rejoin with a changed config) gets a short while to listen.
        deadline = self.paused_clock(KUBELET_REACH_SECONDS)
        if not await self._kubelet_reached_at_once():
            await self._kubelet_through_api(deadline)
            await self._kubelet_port_direct(deadline)
        self.checks["kubelet-reachable"] = f"ok (through the API and at {self.target.kubelet_address}:{KUBELET_PORT})"
        if not node.container_runtime:
            # Where no pods can run (no container runtime reported), there is no validation pod to start.
            self.checks["validation-pod"] = "skipped: the node reports no container runtime"
        else:
            await self._validation_pod()

    async def _kubelet_reached_at_once(self) -> bool:
        """Both ways to the kubelet (below) tried once, in one command to the server; False when
        either failed, and the checks then go their own way, each with its waits and diagnosis."""
        results = await self.cluster.run_steps(
            [
                kubectl_step(healthz_args(self.target.node), check=False),
                HostStep.command(dial_argv(self.target.kubelet_address), check=False),
            ],
            Repeat.ONCE,
            deadline=KUBECTL_DEADLINE_SECONDS + KUBELET_DIAL_SECONDS + 15,
        )
        return all(result.exit_status == 0 for result in results)

    async def _kubelet_through_api(self, deadline: Callable[[], float]) -> None:
        """The kubelet's health through the API server's node proxy, until `deadline`. The API
        itself being away is waited for by the API layer (and not counted here); past its
        deadline that error stands on its own."""
        while True:
            try:
                await self.cluster.kubelet_healthz(self.target.node)
                return
            except ApiUnavailableError:
                raise
            except SshError as error:
                if time.monotonic() > deadline():
                    raise ValidationError(
                        "kubelet-reachable",
                        f"the API server cannot reach the kubelet on port 10250 ({error}); check the firewall "
                        "rules for 10250/tcp between the nodes",
                    ) from None
                await asyncio.sleep(POLL_SECONDS)

    async def _kubelet_port_direct(self, deadline: Callable[[], float]) -> None:
        """k3s carries the API server's own kubelet traffic (logs, exec, the node proxy) through the
        agent's tunnel over 6443, so the check above passes with 10250 blocked; metrics-server and
        anything else that dials a kubelet directly does not. So dial it from the server."""
        while (failure := await self._kubelet_port_from_server()) is not None:
            if time.monotonic() > deadline():
                raise ValidationError(
                    "kubelet-reachable",
                    f"{self.server.target.node} cannot connect to the kubelet at "
                    f"{self.target.kubelet_address}:{KUBELET_PORT} "
                    f"({failure}); metrics and anything else that dials a kubelet directly need it. Open "
                    f"{KUBELET_PORT}/tcp from the other nodes to {self.target.node} in its host and cloud firewalls",
                )
            await asyncio.sleep(POLL_SECONDS)

    async def _last_warning(self, pod: str) -> str | None:
        """The pod's latest Warning event (a sandbox or image failure shows there, not in
        the pod's status), as "reason: message"."""
        with contextlib.suppress(RemoteCommandError, ApiUnavailableError, ValueError):
            out = await self.cluster.kubectl(
                [
                    "get",
                    "events",
                    "-n",
                    VALIDATION_POD_NAMESPACE,
                    "--field-selector",
                    f"involvedObject.name={pod}",
                    "-o",
                    "json",
                ],
                repeat=Repeat.READ,
            )
            warnings = [e for e in json.loads(out).get("items", []) if e.get("type") == "Warning"]
            if warnings:
                last = max(warnings, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
                return f"{last.get('reason', 'Warning')}: {str(last.get('message', '')).strip()}"
        return None

    def _validation_pod_manifest(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": VALIDATION_POD_NAMESPACE,
                "labels": {"app.kubernetes.io/managed-by": "hk3s", "hk3s.dev/validation-pod": self.target.node},
            },
            "spec": {
                # Straight onto the node, tolerating every taint there: the validation taint it
                # runs under and the node's own (a pool's NoExecute taint would evict it).
                "nodeName": self.target.node,
                "tolerations": [{"operator": "Exists"}],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "validate",
                        "image": self.target.validation_image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", "echo hk3s validation pod ran on $(hostname)"],
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}},
                    }
                ],
            },
        }

    async def _validation_pod(self) -> None:
        """A pod runs to completion on the tainted node: its runtime, pod sandbox and image
        work. One that does not complete stops the join naming the pod and the reason."""
        name = f"hk3s-validate-{self.target.node}"
        self.progress(f"starting validation pod {VALIDATION_POD_NAMESPACE}/{name} ({self.target.validation_image})")
        delete = ["delete", "pod", "-n", VALIDATION_POD_NAMESPACE, name, "--ignore-not-found", "--wait=true"]
        await self.cluster.kubectl(delete, repeat=Repeat.IDEMPOTENT)  # one left by an interrupted run
        # Server-side apply, not create: an apply repeated after the API went away mid-call (the
        # first may have created the pod, its reply lost) leaves the same one pod, where a second
        # create would fail with AlreadyExists.
        await self.cluster.apply(json.dumps(self._validation_pod_manifest(name)))
        started = time.monotonic()
        deadline = self.paused_clock(VALIDATION_POD_SECONDS)
        why = "not started"
        try:
            while True:
                out = await self.cluster.kubectl(
                    ["get", "pod", "-n", VALIDATION_POD_NAMESPACE, name, "-o", "json"], repeat=Repeat.READ
                )
                pod = json.loads(out)
                phase, why = _pod_progress(pod)
                if phase == "Succeeded":
                    self.checks["validation-pod"] = f"ok ({time.monotonic() - started:.1f}s)"
                    self.progress(f"validation pod {name} ran in {time.monotonic() - started:.1f}s")
                    return
                if phase == "Failed" or time.monotonic() > deadline():
                    why = await self._last_warning(name) or why
                    raise ValidationError(
                        "validation-pod",
                        f"the validation pod {VALIDATION_POD_NAMESPACE}/{name} did not run ({why}); the node's "
                        f"container runtime must run image {self.target.validation_image}: import k3s's air-gap "
                        "images on the node (/var/lib/rancher/k3s/agent/images) or let it reach the registry",
                    )
                await asyncio.sleep(POLL_SECONDS)
        finally:
            with contextlib.suppress(RemoteCommandError, ApiUnavailableError):
                await self.cluster.kubectl(
                    ["delete", "pod", "-n", VALIDATION_POD_NAMESPACE, name, "--ignore-not-found", "--wait=false"],
                    repeat=Repeat.IDEMPOTENT,
                )

    async def _kubelet_port_from_server(self) -> str | None:
        """A TCP connection from the server to the node's kubelet port; None when it opens,
        else why not."""
        return await dial_kubelet(self.server, self.target.kubelet_address)


# Why a connection to a kubelet did not open when no kubelet answered; any other reason means
# the check itself did not run as meant (see `dial_kubelet`).
KUBELET_SILENT = ("no answer", "connection refused", "no route to host", "network is unreachable")


def dial_argv(address: str) -> list[str]:
    """A TCP connection to the kubelet port at `address`, given up after KUBELET_DIAL_SECONDS."""
    return [
        "timeout",
        str(KUBELET_DIAL_SECONDS),
        "bash",
        "-c",
        'exec 3<>"/dev/tcp/$1/$2"',
        "-",
        address,
        str(KUBELET_PORT),
    ]


async def dial_kubelet(server: SshSession, address: str) -> str | None:
    """A TCP connection from `server` to the kubelet port at `address`; None when it opens,
    else why not: "no answer within N s", "connection refused", "no route to host",
    "network is unreachable", or what the dial printed when it failed otherwise."""
    result = await server.run(dial_argv(address), deadline=KUBELET_DIAL_SECONDS + 15, check=False)
    if result.exit_status == 0:
        return None
    if result.exit_status == 124:
        return f"no answer within {KUBELET_DIAL_SECONDS} s"
    stderr = result.stderr.lower()
    for reason in ("connection refused", "no route to host", "network is unreachable"):
        if reason in stderr:
            return reason
    return result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.exit_status}"


def _pod_progress(pod: dict[str, Any]) -> tuple[str, str]:
    """A pod's phase and, for one not done, why: the container's waiting or terminated
    reason and message (ErrImagePull, ...) or the pod's condition."""
    status = pod.get("status", {})
    phase = str(status.get("phase", "Pending"))
    for container in status.get("containerStatuses", []):
        state = container.get("state", {})
        for kind in ("waiting", "terminated"):
            detail = state.get(kind)
            if detail and detail.get("reason") not in (None, "Completed"):
                message = str(detail.get("message", "")).strip()
                return phase, f"{phase}, {detail['reason']}" + (f": {message}" if message else "")
    for condition in status.get("conditions", []):
        if condition.get("status") == "False" and condition.get("message"):
            return phase, f"{phase}, {condition.get('reason', condition['type'])}: {condition['message']}"
    return phase, phase
