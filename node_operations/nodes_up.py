"""Whether the other nodes are up right now, read from their agents and kubelets themselves.

A step that takes a node down (a reboot, an agent stopped for an upgrade) must never make it two
nodes down at once. The Node's Ready condition alone cannot tell: the node lifecycle controller
marks a Node NotReady only once its kubelet has posted nothing for the node monitor's grace period
(kube-controller-manager --node-monitor-grace-period, tens of seconds; kubernetes
pkg/controller/nodelifecycle/node_lifecycle_controller.go tryUpdateNodeHealth), so a node whose
agent stopped a moment ago still reads Ready. So, right before such a step, each other node's
kubelet is asked for its health through the API server's node proxy: on k3s the API server reaches
a kubelet through that node's agent tunnel (k3s pkg/agent/tunnel, pkg/daemons/control/tunnel.go),
and the kubelet runs inside the agent, so an answer shows both running; a stopped agent, a stopped
kubelet or a host gone answer nothing (the proxy reports the dial's failure).
"""

from __future__ import annotations

from collections.abc import Iterable

from remote_access.kube import ApiUnavailableError, ClusterApi, NodeStatus, Repeat, healthz_args
from remote_access.ssh import RemoteCommandError, SshDeadlineError

# A dial of a host powered off gets no answer until a connect timeout somewhere on the way (the API
# server's proxy, the supervisor's tunnel server): a call with no answer past this is silence.
HEALTHZ_DEADLINE_SECONDS = 45.0


async def kubelet_silence(api: ClusterApi, node: str) -> str | None:
    """Why `node`'s kubelet does not answer through the API server's node proxy, or None when it
    answers. The API itself being away is waited for by the API layer and raised past its wait, and
    a broken link to the server is raised too: neither says anything about the node."""
    try:
        await api.kubectl(healthz_args(node), repeat=Repeat.READ, deadline=HEALTHZ_DEADLINE_SECONDS)
    except ApiUnavailableError:
        raise
    except RemoteCommandError as error:
        return " ".join(error.stderr_tail.split())[-300:] or f"kubectl exited {error.exit_status}"
    except SshDeadlineError:
        return f"no answer within {HEALTHZ_DEADLINE_SECONDS:.0f} s"
    return None


async def nodes_down(api: ClusterApi, others: Iterable[NodeStatus]) -> list[str]:
    """One line per node of `others` that is down now: NotReady, or its kubelet not answering (read
    one node after another, each at the moment it is asked)."""
    down = []
    for other in others:
        if not other.ready:
            down.append(f"{other.name} is NotReady ({other.ready_reason or 'no heartbeat'})")
            continue
        silence = await kubelet_silence(api, other.name)
        if silence is not None:
            down.append(
                f"{other.name}'s kubelet does not answer through the API server ({silence}), though its Node "
                "still reads Ready: its agent or its host is down"
            )
    return down
