"""The check behind hk3s:cluster.control_plane_lost: the control plane's server is taken as lost
only when nothing of its Kubernetes API still answers.

Declaring the loss makes the teardown forget the stack's in-cluster objects instead of deleting
them through the API (pulumi-kubernetes refuses to delete a Helm release on an unreachable
cluster, so there is no other way out). Forgetting them while the API still answers would skip
Longhorn's uninstall on a cluster that could have run it, so the declaration is checked at every
run that reads it: the server is logged in to with its pinned host key, and if that works, k3s's
API port on the server is tried from there. Either failing is the loss (a host that refuses the
pinned key was rebuilt, and its k3s with it); the API answering is a refusal that changes nothing.
"""

from __future__ import annotations

from node_operations.refusal import tagged
from providers.base import program_error
from remote_access.ssh import SshError, SshTarget, open_session

# k3s's API server listens on 6443 on every address of the server, 127.0.0.1 included.
K3S_API_PORT = 6443
# How long the server's API port is given to accept a connection, tried from the server itself.
API_CONNECT_SECONDS = 5


@program_error
class ControlPlaneAnswersError(RuntimeError):
    """hk3s:cluster.control_plane_lost declared for a control plane that still answers."""


def api_probe_command(port: int = K3S_API_PORT) -> list[str]:
    """A command, run on the server, that exits 0 when something accepts a TCP connection on
    127.0.0.1:`port` within API_CONNECT_SECONDS (bash's /dev/tcp: no tool beyond bash and coreutils)."""
    return ["timeout", str(API_CONNECT_SECONDS), "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"]


async def control_plane_answer(server: SshTarget) -> str | None:
    """What still answers of the control plane at `server`, as a sentence; None when it is lost
    (no login with the pinned host key, or k3s's API port closed on the server)."""
    try:
        async with open_session(server) as session:
            result = await session.run(api_probe_command(), deadline=API_CONNECT_SECONDS + 10, check=False)
    except SshError:
        return None
    if result.exit_status != 0:
        return None
    return f"{server.node} logs in at {server.address} and its Kubernetes API accepts connections (port {K3S_API_PORT})"


def answers_refusal(answer: str) -> str:
    return tagged(
        f"hk3s:cluster.control_plane_lost is true, but the control plane answers: {answer}. Nothing was changed. "
        "A control plane that answers is torn down through its API, which runs Longhorn's uninstall: remove "
        "control_plane_lost (keep hk3s:cluster.teardown: allowed), run pulumi up, then pulumi destroy "
        "--run-program",
        "teardown",
    )


def lost_hint(error: str) -> str:
    """`error` (the server did not answer a teardown's run) with the way on if the server is gone."""
    return (
        f"{error.rstrip('.')}. If the control plane's server is lost for good, declare it: set "
        "hk3s:cluster.control_plane_lost: true beside hk3s:cluster.teardown: allowed, then run pulumi up and "
        'pulumi destroy --run-program (docs/teardown.md, "When the control plane is lost"); otherwise bring '
        "the server back and run again"
    )
