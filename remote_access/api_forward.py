"""The Kubernetes API through the server's SSH session: a local port forward to 127.0.0.1:6443.

Whatever talks to the Kubernetes API from the operator's machine (the Kubernetes provider that
installs Longhorn) reaches it through a forward of an SSH connection to the server, pinned to
the server's host key, instead of through port 6443 on the server's public address: nothing
needs 6443 open to the operator or to a CI runner whose address changes. k3s's serving
certificate covers 127.0.0.1, so the kubeconfig's CA still verifies the server.

The forward is served by a small process of its own (`python -m remote_access.api_forward`),
started once per run and given the login on stdin (the key never on a command line). It
serves until the process it was told to outlive ends: the Pulumi engine of the run, which
goes on to delete what left the program after the program itself has ended. Its local port is
fixed per stack (derived from the project and stack names, or `hk3s:cluster.api_forward_port`),
so the kubeconfig the provider records stays the same from run to run. A forward already
serving that port for the same server (an earlier start in the same run) is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from remote_access.private_dir import UnsafeDirectoryError, runtime_directory
from remote_access.ssh import SshError, SshTarget, open_session

API_PORT = 6443
# Ports the derived forward port is taken from: above the usual services, below Linux's
# ephemeral range (32768-60999), so an outgoing connection never holds it.
FORWARD_PORT_FIRST = 17000
FORWARD_PORT_COUNT = 10000
READY_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 1.0
_SERVER_LINE = re.compile(r"^(\s*server:\s*)https://[^\s]+$", re.MULTILINE)


class ApiForwardError(SshError):
    """The forward could not be opened; the message names the port and the setting."""


def forward_port(project: str, stack: str) -> int:
    """The local port of a stack's forward: the same for every run of the stack, and different
    stacks almost never share one (hk3s:cluster.api_forward_port picks another)."""
    digest = hashlib.sha256(f"{project}/{stack}".encode()).digest()
    return FORWARD_PORT_FIRST + int.from_bytes(digest[:4], "big") % FORWARD_PORT_COUNT


def forwarded_kubeconfig(kubeconfig: str, port: int) -> str:
    """The kubeconfig with its server at the forward's local end; CA and credentials kept."""
    if not _SERVER_LINE.search(kubeconfig):
        raise ValueError("the kubeconfig names no https server")
    return _SERVER_LINE.sub(lambda match: f"{match.group(1)}https://127.0.0.1:{port}", kubeconfig)


@dataclass(frozen=True)
class ForwardRequest:
    """What the forward process reads on stdin."""

    node: str
    address: str
    port: int
    user: str
    private_key: str
    host_key: str
    local_port: int
    outlive_pid: int


def _record_path(local_port: int) -> Path:
    """Where the running forward of this port is recorded: in this user's private runtime
    directory, because the record decides where the Kubernetes provider sends the cluster's
    credentials (one another user could write would point them at that user's listener)."""
    return runtime_directory() / f"api-forward-{local_port}.json"


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _serving(local_port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", local_port)) == 0


def process_parent_and_name(pid: int) -> tuple[int, str] | None:
    """A process's parent pid and its name, or None when this system says neither.

    Linux answers through /proc; where there is none (macOS) POSIX `ps` answers (macOS's
    `comm` is the executable's path: its last part is the name)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        # The name is in parentheses and may hold spaces: the fields after the last ")" are fixed.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        return int(stat.rsplit(")", 1)[1].split()[1]), name
    try:
        answer = subprocess.run(
            ["ps", "-o", "ppid=", "-o", "comm=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    fields = answer.stdout.strip().split(None, 1)
    if answer.returncode != 0 or len(fields) != 2 or not fields[0].isdigit():
        return None
    return int(fields[0]), Path(fields[1].strip()).name


# The refusal where neither answers: said in docs/getting-started-hetzner.md's Prerequisites too (a test checks both).
PLATFORM_SENTENCE = (
    "hk3s runs on Linux or macOS: the forward to the Kubernetes API finds the run's Pulumi engine "
    "through /proc (Linux) or ps (macOS)."
)


class EngineNotFoundError(RuntimeError):
    """This system tells no process's parent: the engine the forward must outlive cannot be found."""


def engine_pid() -> int:
    """The Pulumi engine running this program (the `pulumi` process above the language host),
    or this process when none is above it (a program run outside Pulumi, as in tests).

    Raises EngineNotFoundError where this system tells no process's parent: a forward tied to
    this process would end with the program, before the deletes the engine runs after it."""
    pid = os.getpid()
    for _ in range(8):
        found = process_parent_and_name(pid)
        if found is None:
            if pid == os.getpid():
                raise EngineNotFoundError(PLATFORM_SENTENCE)
            break
        parent = found[0]
        if parent <= 1:
            break
        above = process_parent_and_name(parent)
        if above is not None and above[1] == "pulumi":
            return parent
        pid = parent
    return os.getpid()


TERMINAL_PREFIXES = ("/dev/pts/", "/dev/tty", "/dev/console")


def stdin_is_terminal(pid: int) -> bool:
    """Whether process `pid` reads its standard input from a terminal (someone sits at it).

    Linux answers through /proc/<pid>/fd/0; elsewhere (macOS) POSIX `ps` tells the process's
    terminal ("??" or "-" when it has none). Anything unknown counts as no terminal."""
    if pid == os.getpid():
        return os.isatty(0)
    try:
        return os.readlink(f"/proc/{pid}/fd/0").startswith(TERMINAL_PREFIXES)
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False
    except OSError:
        return False
    try:
        answer = subprocess.run(
            ["ps", "-o", "tty=", "-p", str(pid)], check=False, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return False
    terminal = answer.stdout.strip()
    return answer.returncode == 0 and terminal not in ("", "?", "??", "-")


@dataclass(frozen=True)
class ApiForward:
    """A forward serving 127.0.0.1:`port`; `started` when this call started its process."""

    port: int
    pid: int
    started: bool

    def close(self) -> None:
        """End the forward's process if this call started it (one found running is left)."""
        if self.started and process_alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 15)


def open_api_forward(server: SshTarget, local_port: int, outlive_pid: int | None = None) -> ApiForward:
    """Make sure a forward to `server`'s API listens on 127.0.0.1:`local_port` until
    `outlive_pid` (default: the run's engine) ends."""
    try:
        record = _record_path(local_port)
    except UnsafeDirectoryError as error:
        raise ApiForwardError(server.node, str(error)) from None
    with contextlib.suppress(OSError, ValueError, KeyError):
        known = json.loads(record.read_text())
        pid = int(known["pid"])
        if known.get("address") == server.address and process_alive(pid) and _serving(local_port):
            return ApiForward(local_port, pid, started=False)
    if _serving(local_port):
        raise ApiForwardError(
            server.node,
            f"127.0.0.1:{local_port}, the port of this stack's forward to the Kubernetes API, is taken by "
            "another program: set hk3s:cluster.api_forward_port to a free port",
        )
    try:
        outlive = outlive_pid or engine_pid()
    except EngineNotFoundError:
        raise ApiForwardError(
            server.node, f"{PLATFORM_SENTENCE} Neither answers on this system: run hk3s from Linux or macOS"
        ) from None
    request = ForwardRequest(
        node=server.node,
        address=server.address,
        port=server.port,
        user=server.user,
        private_key=server.private_key,
        host_key=server.recorded_host_key or "",
        local_port=local_port,
        outlive_pid=outlive,
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "remote_access.api_forward"],
        cwd=Path(__file__).resolve().parent.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # not killed with the program: it serves the engine's deletes too
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps(asdict(request)))
    process.stdin.close()
    answer = process.stdout.readline().strip()
    if answer != "ready":
        process.wait(timeout=READY_TIMEOUT_SECONDS)
        raise ApiForwardError(server.node, f"the forward to the Kubernetes API did not open: {answer or 'no answer'}")
    record.write_text(json.dumps({"pid": process.pid, "address": server.address}))
    return ApiForward(local_port, process.pid, started=True)


async def _serve(request: ForwardRequest) -> None:
    """Forward until the process to outlive ends. A connection that drops (the server rebooted,
    the network blinked) is opened again, so the run's later API calls find the forward back."""
    target = SshTarget(
        node=request.node,
        address=request.address,
        port=request.port,
        user=request.user,
        private_key=request.private_key,
        recorded_host_key=request.host_key or None,
    )
    announced = False
    while process_alive(request.outlive_pid):
        try:
            async with open_session(target) as session:
                listener = await session.forward_local_port(request.local_port, API_PORT)
                if not announced:
                    print("ready", flush=True)
                    announced = True
                closed = asyncio.ensure_future(session.wait_closed())
                while process_alive(request.outlive_pid) and not closed.done():
                    await asyncio.sleep(POLL_SECONDS)
                listener.close()
                closed.cancel()
        except (SshError, OSError) as error:
            if not announced:
                print(str(error).replace("\n", " "), flush=True)
                return
            await asyncio.sleep(2 * POLL_SECONDS)


def main() -> None:
    asyncio.run(_serve(ForwardRequest(**json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()
