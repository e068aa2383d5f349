"""The k3s agent's journal on a joining node, and what its lines say went wrong
(the CA hash, the node password, the join permit, the token, the API's reach)."""

from __future__ import annotations

from collections.abc import Sequence

from remote_access.ssh import SshSession

# Agent log lines -> (check, what to do). First match wins; order matters.
AGENT_LOG_DIAGNOSES: list[tuple[tuple[str, ...], str, str]] = [
    (
        ("token CA hash does not match",),
        "ca-hash",
        "the agent refuses the server's CA ({line}). The host holds a token or state from another cluster: "
        "reset it (systemctl stop k3s-agent, then rm -rf /var/lib/rancher/k3s/agent /etc/rancher/k3s) and run "
        "pulumi up again",
    ),
    (
        ("Node password rejected",),
        "node-password",
        "the server refuses this host under the name of a node registered from another host ({line}). If "
        "that node is gone, delete its Node (kubectl delete node <name>) and run pulumi up again; if it still "
        "runs, give this host another name in hk3s:workers",
    ),
    (
        ("holds no join permit",),
        "token-node",
        "the server refused to register this node ({line}): the token was made for another node name. "
        "Run pulumi up again: the program makes a token for this node",
    ),
    (
        # A refused token, as the agent's configuration retry words it: older k3s prints the URL
        # and the HTTP status ("...: 401 Unauthorized"); newer decodes the supervisor's Status
        # into its message ("not authorized", seen on v1.31.3).
        ("401 Unauthorized", "Unauthorized", "not authorized"),
        "token",
        "the server rejected the join token ({line}): it expired (ten minutes), was already used and deleted, "
        "or belongs to another cluster. Run pulumi up again: a new token is made for this node",
    ),
    (
        # Rarely in a real agent's log at its default level: once started, it dials the server
        # through its local load balancer, which logs dial errors at debug level only. The join
        # also asks the network itself when the node does not register (Joiner.wait_registered).
        ("connection refused", "no route to host", "i/o timeout", "network is unreachable", "no such host"),
        "api-reachable",
        "the node cannot reach the Kubernetes API ({line}): open 6443/tcp from this node to the server in the "
        "cloud and host firewalls, and check its route to the server",
    ),
]


def agent_log_diagnosis(lines: Sequence[str]) -> tuple[str, str] | None:
    """The most specific diagnosis the agent's log lines support, if any: (check, what to do)."""
    for needles, check, advice in AGENT_LOG_DIAGNOSES:
        for line in reversed(lines):
            if any(needle in line for needle in needles):
                return check, advice.format(line=log_message(line))
    return None


def log_message(line: str) -> str:
    """A journal line's message (k3s logs `msg="..."`), or the line itself."""
    marker = 'msg="'
    if marker in line:
        return line.split(marker, 1)[1].rstrip('"').replace('\\"', '"')
    return line.strip()


async def agent_log(worker: SshSession, since: str) -> list[str]:
    """The k3s agent's journal since `since` (its last 200 lines)."""
    result = await worker.run(
        ["journalctl", "-u", "k3s-agent", "--no-pager", "-o", "cat", "--since", since], deadline=30, check=False
    )
    return result.stdout.splitlines()[-200:]


async def agent_since(worker: SshSession) -> str:
    """The host's clock now, in the form `journalctl --since` takes."""
    result = await worker.run(["date", "+%Y-%m-%d %H:%M:%S"], deadline=15)
    return result.stdout.strip()
