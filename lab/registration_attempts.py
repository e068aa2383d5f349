"""Registration attempts under a name that left the cluster, as the lab's tests make them.

Two ways a name can be tried after its worker was removed or given up:
- a host holding a live bootstrap token (one a join of another node made, say) starts an agent
  under that name: k3s signs it a kubelet certificate for any name the agent asks for;
- the old host's own agent starts again with the kubelet credentials it kept (a given-up host
  powered back on).
Either way the kubelet then creates its Node, which the join-permit admission must refuse.

The peers' firewalls drop a removed worker's address, which would stop the attempt before the
API server ever judges it. Where a firewall still lets such a host in (one the operator runs
and did not update, a shared network), the admission is what holds, so `admitted_to_api` opens
the server's nftables table to the host for the attempt, the way such a firewall would.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator

from lab.hosts import Host, Lab
from lab.stack_harness import k3s_snapshot, k3s_version
from node_operations.agent_log import agent_since
from node_operations.k3s_install import K3sBinary, agent_config, install_k3s
from remote_access.ssh import SshTarget, open_session

K3S = "/usr/local/bin/k3s"
TOKEN_FILE = "/etc/rancher/k3s/hk3s-join-token"


def refusal(node: str) -> str:
    """What the join-permit admission (node_operations/join_permits.py) answers a kubelet whose
    Node `node` it refuses: the node, and how it joins again."""
    return (
        f"node {node} holds no join permit: only a join of {node} by the program grants one (the token was made "
        "for another node, or the worker was removed or given up). To bring it back, list it in hk3s:workers "
        "and run pulumi up"
    )


def live_token(server: Host, description: str) -> str:
    """A bootstrap token made on the server as a join makes one (ten minutes, described by the
    node it is for)."""
    argv = [K3S, "token", "create", "--ttl", "10m", "--description", description]
    return server.run(argv).stdout.strip()


@contextlib.contextmanager
def admitted_to_api(server: Host, source: Host) -> Iterator[None]:
    """The server's program-managed nftables table lets `source` in for the block's length (an
    accept rule put first in its input chain), then no more."""
    assert source.public_ip
    added = server.run(
        [
            "nft",
            "--echo",
            "--handle",
            "insert",
            "rule",
            "inet",
            "hk3s_node",
            "input",
            "ip",
            "saddr",
            source.public_ip,
            "accept",
        ]
    ).stdout
    handle = re.search(r"# handle (\d+)", added)
    assert handle, added
    try:
        yield
    finally:
        server.run(["nft", "delete", "rule", "inet", "hk3s_node", "input", "handle", handle.group(1)])


def start_agent(lab: Lab, host: Host, server: Host, token: str, node: str) -> str:
    """Install and start the k3s agent on `host` under the name `node` with `token` and no
    validation taint, as an intruder would; the host's clock at the start (for `agent_log`)."""
    assert host.public_ip and server.public_ip
    path, digest = k3s_snapshot()
    binary = K3sBinary(version=k3s_version(), local_path=path, sha256=digest)
    target = SshTarget(node=host.name, address=host.public_ip, private_key=lab.ssh_private_key_path.read_text())

    async def install() -> str:
        async with open_session(target) as session:
            since = await agent_since(session)
            await session.run(["mkdir", "-p", "/etc/rancher/k3s"], deadline=15)
            await session.upload(token.encode() + b"\n", TOKEN_FILE, deadline=30, mode=0o600)
            config = agent_config(
                node=node,
                server_url=f"https://{server.public_ip}:6443",
                node_ip=host.public_ip or "",
                external_ip=host.public_ip or "",
                flannel_iface="eth0",
                labels={},
                taints=[],
                token_file=TOKEN_FILE,
            )
            await install_k3s(session, "agent", binary, config, lambda _line: None)
            return since

    return asyncio.run(install())


def agent_log(host: Host, since: str) -> str:
    """The k3s agent's journal on `host` since `since`."""
    argv = ["journalctl", "-u", "k3s-agent", "--since", since, "--no-pager", "-o", "cat"]
    return host.run(argv, check=False).stdout


def permits(server: Host) -> set[str]:
    """The names holding a join permit."""
    out = server.run(
        [
            K3S,
            "kubectl",
            "get",
            "configmap",
            "hk3s-join-permits",
            "-n",
            "kube-system",
            "-o",
            "go-template={{range $name, $_ := .data}}{{$name}} {{end}}",
        ]
    ).stdout
    return set(out.split())


def node_exists(server: Host, node: str) -> bool:
    out = server.run([K3S, "kubectl", "get", "node", node, "-o", "name", "--ignore-not-found"]).stdout
    return bool(out.strip())
