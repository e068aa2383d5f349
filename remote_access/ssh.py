"""The one SSH layer every provider and operation uses.

- Host keys are pinned: a host with no recorded key is accepted on first use and
  the key is reported back so the caller records it; a host whose key differs
  from the recorded one is refused, with both fingerprints and how to accept it.
- Every call has a deadline; nothing waits forever on a stuck host.
- Connection set-up survives a host shedding load: a connection dropped before
  authentication (sshd's MaxStartups) is retried with backoff within the
  connect deadline; nothing that may have run a command is ever retried. At
  most HANDSHAKES_PER_HOST handshakes are in flight to one host across every
  process of the run, and first contact with a host costs one connection.
- Callers that ask for it share one login per host within a provider process
  (`open_session(..., shared=True)`, remote_access/session_pool.py): the steps of a
  run on one host cost it one connection, not one each.
- Scripts are files run with `bash -s` and their arguments quoted; values that
  must not show in the host's process list (tokens) go in as environment
  variables on the script's stdin, never on a command line.
- Output is streamed line by line to a callback, prefixed by nobody: callers
  prefix progress with the node name.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import os
import random
import shlex
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from remote_access.private_dir import UnsafeDirectoryError, private_directory, runtime_directory
from remote_access.session_pool import LoginKey, active_pool
from remote_access.stop_reading import StopWhen, read_stdout, stoppable

if TYPE_CHECKING:
    # asyncssh costs a fresh process about 0.13 CPU-s to import; the functions that talk SSH
    # import it when first called, so a provider process that only answers Check and Diff never does.
    import asyncssh

LineCallback = Callable[[str], None]


class SshError(RuntimeError):
    """An SSH operation failed on a named host; the message says what to do."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(f"{node}: {message}")


class HostKeyChangedError(SshError):
    """The host presented a key other than the recorded one."""

    def __init__(self, node: str, address: str, recorded: str, presented: str) -> None:
        self.recorded = recorded
        self.presented = presented
        super().__init__(
            node,
            f"SSH host key of {address} changed: recorded {fingerprint(recorded)}, "
            f"presented {fingerprint(presented)}. Do not trust the presented key: whoever answers at "
            "this address presented it (an attacker on the path, or a Kubernetes Service whose "
            "externalIPs redirect the node's port to a pod). Only if the host was reinstalled: read "
            "its key out of band, on its console (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), "
            f"and if that fingerprint is {fingerprint(presented)}, set hk3s:ssh.host_keys.{node} to "
            "the key read there; otherwise do not connect.",
        )


class SshDeadlineError(SshError):
    """An SSH call ran past its deadline."""


class SshLoginRefusedError(SshError):
    """The host's sshd answered and refused the login key: the host is up (not silent)."""


class RemoteCommandError(SshError):
    """A command or script exited non-zero."""

    def __init__(self, node: str, what: str, exit_status: int | None, stderr_tail: str) -> None:
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail
        detail = f": {stderr_tail}" if stderr_tail else ""
        super().__init__(node, f"{what} failed with exit status {exit_status}{detail}")


def fingerprint(public_key_line: str) -> str:
    """SHA256 fingerprint of an OpenSSH public key line, as ssh-keygen -l prints it."""
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    return str(asyncssh.import_public_key(public_key_line.strip()).get_fingerprint("sha256"))


@dataclass(frozen=True)
class SshTarget:
    """Where and how to log in to one node."""

    node: str
    address: str
    private_key: str = field(repr=False)
    port: int = 22
    user: str = "root"
    recorded_host_key: str | None = None
    connect_timeout: float = 15.0


@dataclass(frozen=True)
class CommandResult:
    """What a finished command printed and returned."""

    exit_status: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()


def _stderr_tail(stderr: str, lines: int = 5) -> str:
    return " | ".join(stderr.strip().splitlines()[-lines:])


PROC_NET_TCP = Path("/proc/net/tcp")


def _proc_address(host: str, port: int) -> str:
    """An IPv4 address and port as /proc/net/tcp prints them (the address as the kernel's u32
    in host byte order, then the port, both in upper-case hex)."""
    (number,) = struct.unpack("=I", socket.inet_aton(host))
    return f"{number:08X}:{port:04X}"


def same_user_peer(local_port: int, peer_host: str, peer_port: int, table: Path = PROC_NET_TCP) -> bool:
    """Whether the connection from `peer_host:peer_port` to 127.0.0.1:`local_port` comes from a
    socket this user owns: its line in /proc/net/tcp (local = the peer, remote = our port) names
    the owner's uid. A connection whose socket is not found is refused (whose it is cannot be
    told). Where there is no /proc/net/tcp (not Linux) it cannot be checked: accepted, and
    docs/security.md says the port is then every local user's."""
    if not table.exists():
        return True
    try:
        peer = _proc_address(peer_host, peer_port)
    except OSError:
        return False
    ours = _proc_address("127.0.0.1", local_port)
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 7 and fields[1] == peer and fields[2] == ours:
            return fields[7] == str(os.getuid())
    return False


class SshSession:
    """One open, host-key-verified connection; many commands over it."""

    def __init__(
        self, target: SshTarget, connection: asyncssh.SSHClientConnection, host_key: str, newly_recorded: bool
    ):
        self.target = target
        self._connection = connection
        self.host_key = host_key
        self.newly_recorded = newly_recorded
        # What this session cost: commands (and uploads) sent, and the time spent waiting on them.
        self.commands = 0
        self.remote_seconds = 0.0

    async def forward_local_port(self, local_port: int, remote_port: int) -> asyncssh.SSHListener:
        """Listen on 127.0.0.1:`local_port` here; each connection goes to 127.0.0.1:`remote_port`
        on the host, through this session's pinned connection. Only this user's: every local
        user can connect to 127.0.0.1, and the forward would carry their connection to the
        host's port past its firewall, so one whose socket another user owns is closed
        unanswered (`same_user_peer`)."""
        return await self._connection.forward_local_port(
            "127.0.0.1",
            local_port,
            "127.0.0.1",
            remote_port,
            accept_handler=functools.partial(same_user_peer, local_port),
        )

    async def wait_closed(self) -> None:
        """Return once the connection has closed (the host went away, or the session ended)."""
        await self._connection.wait_closed()

    async def run(
        self,
        argv: Sequence[str],
        *,
        deadline: float,
        stdin: str | None = None,
        on_line: LineCallback | None = None,
        check: bool = True,
        what: str | None = None,
        until: StopWhen | None = None,
    ) -> CommandResult:
        """Run one command (argv, each argument quoted) under a deadline in seconds; with
        `until` (no `stdin` then), stop reading it as that says, and it ends on the host."""
        command = shlex.join(argv) if until is None else stoppable(argv)
        return await self._run_command(
            command,
            deadline=deadline,
            stdin=stdin,
            on_line=on_line,
            check=check,
            what=what or shlex.join(argv),
            until=until,
        )

    async def run_script(
        self,
        script: Path,
        args: Sequence[str] = (),
        *,
        deadline: float,
        env: Mapping[str, str] | None = None,
        on_line: LineCallback | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run a local bash script file on the host with its arguments quoted.

        `env` values travel on stdin as `export` lines ahead of the script, so
        they never appear in a process list or in an error message.
        """
        body = script.read_text()
        preamble = "".join(
            f"export {name}={shlex.quote(value)}\n" for name, value in (env or {}).items() if _valid_env_name(name)
        )
        if env and len(preamble.splitlines()) != len(env):
            raise ValueError(f"invalid environment variable name among {sorted(env)}")
        command = shlex.join(["bash", "-s", "--", *args])
        return await self._run_command(
            command,
            deadline=deadline,
            stdin=preamble + body,
            on_line=on_line,
            check=check,
            what=f"script {script.name}",
        )

    async def upload(self, data: bytes, remote_path: str, *, deadline: float, mode: int = 0o644) -> None:
        """Write bytes to a file on the host atomically (temp file, then rename)."""
        import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

        temp_path = f"{remote_path}.hk3s-upload"
        self.commands += 1
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline):
                async with self._connection.start_sftp_client() as sftp:
                    async with sftp.open(temp_path, "wb", attrs=asyncssh.SFTPAttrs(permissions=mode)) as remote_file:
                        await remote_file.write(data)
                    await sftp.chmod(temp_path, mode)
                    await sftp.posix_rename(temp_path, remote_path)
        except TimeoutError:
            raise SshDeadlineError(
                self.target.node, f"uploading {remote_path} took longer than {deadline:.0f}s; check the link"
            ) from None
        except (asyncssh.Error, OSError) as error:
            raise SshError(self.target.node, f"uploading {remote_path} failed: {error}") from None
        finally:
            self.remote_seconds += time.monotonic() - started

    async def _run_command(
        self,
        command: str,
        *,
        deadline: float,
        stdin: str | None,
        on_line: LineCallback | None,
        check: bool,
        what: str,
        until: StopWhen | None = None,
    ) -> CommandResult:
        import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

        stdout_lines: list[str] = []
        stderr_chunks: list[str] = []
        process: asyncssh.SSHClientProcess[str] | None = None
        stderr_task: asyncio.Task[None] | None = None
        self.commands += 1
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline):
                process = await self._connection.create_process(command, encoding="utf-8", errors="replace")
                if stdin is not None:
                    process.stdin.write(stdin)
                if until is None:  # a stoppable command's stdin stays open until it is stopped
                    process.stdin.write_eof()

                async def read_stderr() -> None:
                    assert process is not None
                    async for chunk in process.stderr:
                        stderr_chunks.append(chunk)

                stderr_task = asyncio.create_task(read_stderr())
                if await read_stdout(process, stdout_lines, on_line, until):
                    process.stdin.write_eof()
                    process.close()
                    completed = asyncssh.SSHCompletedProcess(exit_status=0)
                else:
                    await stderr_task
                    completed = await process.wait()
        except TimeoutError:
            if process is not None:
                process.close()
            raise SshDeadlineError(
                self.target.node,
                f"{what} did not finish within {deadline:.0f}s; the host may be overloaded or the link down",
            ) from None
        except (asyncssh.Error, OSError) as error:
            raise SshError(self.target.node, f"{what}: connection failed: {error}") from None
        finally:
            self.remote_seconds += time.monotonic() - started
            # A command cut short leaves its stderr reader: stop it, or take its error (the same
            # lost connection raised above), so nothing is reported later as never retrieved.
            if stderr_task is not None:
                if not stderr_task.done():
                    stderr_task.cancel()
                elif not stderr_task.cancelled():
                    stderr_task.exception()
        result = CommandResult(
            exit_status=completed.exit_status if completed.exit_status is not None else -1,
            stdout="\n".join(stdout_lines) + ("\n" if stdout_lines else ""),
            stderr="".join(stderr_chunks),
        )
        if check and result.exit_status != 0:
            raise RemoteCommandError(self.target.node, what, completed.exit_status, _stderr_tail(result.stderr))
        return result


def _valid_env_name(name: str) -> bool:
    return name.isidentifier() and name.isascii()


async def _presented_host_key(target: SshTarget) -> str:
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    async with asyncio.timeout(target.connect_timeout):
        key = await asyncssh.get_server_host_key(target.address, target.port, config=[])
    if key is None:
        raise SshError(target.node, f"{target.address}:{target.port} presented no host key")
    return key.export_public_key("openssh").decode().strip()


def is_transient_drop(error: BaseException) -> bool:
    """True for a connection the host dropped before authentication finished.

    That is how sshd sheds load: past `MaxStartups` it closes new connections
    at once (the client sees the connection lost or reset before the banner or
    during key exchange). Nothing ran on the host yet, so trying again is safe.
    Everything else is an answer, not load: a refused key, a changed host key, a
    closed port or an unreachable host say the same thing on every try.
    """
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    if isinstance(error, (asyncssh.PermissionDenied, asyncssh.HostKeyNotVerifiable, asyncssh.KeyExchangeFailed)):
        return False
    if isinstance(error, (asyncssh.ConnectionLost, asyncio.IncompleteReadError)):
        return True
    return isinstance(error, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError))


# At most this many SSH handshakes (TCP connect to authenticated) in flight to one host,
# across every process of this program on this machine: OpenSSH starts dropping
# unauthenticated connections beyond 10 by default (MaxStartups 10:30:100).
HANDSHAKES_PER_HOST = 4
RETRY_FIRST_SECONDS = 0.25
RETRY_MAX_SECONDS = 4.0
SLOT_WAIT_SECONDS = 300.0
SLOT_POLL_SECONDS = 0.05


def handshake_slot_dir() -> Path:
    """Where the per-host handshake slots live: one lock file per slot, shared by every
    provider process of a run (they are separate processes on the same machine)."""
    configured = os.environ.get("HK3S_SSH_SLOT_DIR")
    # Private to this user: a slot directory another user made could hold every slot and
    # stall each login of this program's runs until their deadline.
    return private_directory(Path(configured) if configured else runtime_directory() / "ssh-slots")


@asynccontextmanager
async def handshake_slot(target: SshTarget) -> AsyncIterator[int]:
    """Hold one of the host's HANDSHAKES_PER_HOST slots while a connection is set up.

    A slot is an exclusive `flock` on a file named after the host: the kernel
    arbitrates it between threads and processes alike, and releases it when its
    holder exits, even by SIGKILL, so a killed run leaves no slot taken.
    """
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in target.address)
    try:
        directory = handshake_slot_dir()
    except UnsafeDirectoryError as error:
        raise SshError(target.node, str(error)) from None
    waited_until = time.monotonic() + SLOT_WAIT_SECONDS
    while True:
        for index in range(HANDSHAKES_PER_HOST):
            handle = os.open(directory / f"{safe_host}_{target.port}.{index}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(handle)
                continue
            try:
                yield index
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                os.close(handle)
            return
        if time.monotonic() > waited_until:
            raise SshDeadlineError(
                target.node,
                f"{HANDSHAKES_PER_HOST} SSH connections to {target.address}:{target.port} stayed in set-up for "
                f"{SLOT_WAIT_SECONDS:.0f}s; the host is not finishing logins, check its sshd",
            )
        await asyncio.sleep(SLOT_POLL_SECONDS * (1 + random.random()))


def _backoff(attempt: int) -> float:
    """Exponential backoff with full jitter, so the dropped clients do not come back together."""
    return random.uniform(0, min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2**attempt))


@dataclass
class ConnectStats:
    """What setting up connections cost in this process (for benchmarks and tests)."""

    connections: int = 0
    drops_retried: int = 0


CONNECT_STATS = ConnectStats()


async def _connect_once(
    target: SshTarget, client_key: asyncssh.SSHKey, recorded: str | None
) -> tuple[asyncssh.SSHClientConnection, str]:
    """One connection attempt. A recorded key pins the connection to it; without one,
    the key the host presents is accepted and read off this same connection (one
    connection on first contact, not a key scan and then a login)."""
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    options: dict[str, object] = {}
    if recorded is not None:
        options["known_hosts"] = asyncssh.import_known_hosts(f"* {recorded}\n")
        options["server_host_key_algs"] = _algorithms_for(recorded.split()[0])
    else:
        options["known_hosts"] = None
    CONNECT_STATS.connections += 1
    connection = await asyncssh.connect(
        target.address,
        target.port,
        username=target.user,
        client_keys=[client_key],
        agent_path=None,
        config=[],
        **options,
    )
    if recorded is not None:
        return connection, recorded
    presented = connection.get_server_host_key()
    if presented is None:
        connection.close()
        raise SshError(target.node, f"{target.address}:{target.port} presented no host key")
    return connection, presented.export_public_key("openssh").decode().strip()


async def connect_pinned(
    target: SshTarget, client_key: asyncssh.SSHKey, recorded: str | None
) -> tuple[asyncssh.SSHClientConnection, str]:
    """Set up a connection, retrying drops before authentication within the connect deadline.

    Only the set-up is retried: no command has run on a connection that never
    authenticated. Time spent waiting for a handshake slot does not count against
    the deadline, which bounds the host's own slowness.
    """
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    budget = target.connect_timeout
    drops = 0
    attempt = 0
    last_drop = ""
    while True:
        async with handshake_slot(target):
            started = time.monotonic()
            try:
                async with asyncio.timeout(budget):
                    return await _connect_once(target, client_key, recorded)
            except TimeoutError:
                if drops:
                    raise _dropped_error(target, drops, last_drop) from None
                raise
            except (asyncssh.Error, OSError, asyncio.IncompleteReadError) as error:
                if not is_transient_drop(error):
                    raise
                drops += 1
                CONNECT_STATS.drops_retried += 1
                last_drop = str(error) or type(error).__name__
            finally:
                budget -= time.monotonic() - started
        pause = _backoff(attempt)
        attempt += 1
        if budget - pause <= 0:
            raise _dropped_error(target, drops, last_drop)
        await asyncio.sleep(pause)
        budget -= pause


def _dropped_error(target: SshTarget, drops: int, last: str) -> SshError:
    return SshError(
        target.node,
        f"cannot connect to {target.address}:{target.port}: its sshd dropped {drops} connection attempt(s) before "
        f"authentication within {target.connect_timeout:.0f}s ({last}), which is how sshd sheds load past its "
        "MaxStartups limit (default 10:30:100). Run pulumi up again, or raise MaxStartups in the host's "
        "sshd_config",
    )


@dataclass(frozen=True)
class FirstContact:
    """Patience for the first login to a host that may still be booting.

    A server the cloud just created answers SSH some time after its create action
    finished, and nobody can say when: until `seconds` have passed, a refused or
    unanswered connection (and, on a host the program created, a refused key,
    since cloud-init installs it during the first boot) means "not yet", not
    "wrong". Progress lines say what is awaited.
    """

    seconds: float
    progress: LineCallback
    key_may_be_pending: bool = False
    setting: str = "hk3s:ssh.first_contact_seconds"


FIRST_CONTACT_POLL_SECONDS = 3.0
FIRST_CONTACT_REPORT_SECONDS = 15.0


def _not_up_yet(error: BaseException, key_may_be_pending: bool) -> str | None:
    """Why a first connection failed, when the host may simply not be up yet; else None."""
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    if isinstance(error, asyncssh.PermissionDenied):
        return "the key is not installed yet" if key_may_be_pending else None
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return "no answer"
    if isinstance(error, OSError) and error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return "host unreachable"
    if is_transient_drop(error):
        return "connection dropped"
    return None


async def _connect_patiently(
    target: SshTarget, client_key: asyncssh.SSHKey, recorded: str | None, first_contact: FirstContact | None
) -> tuple[asyncssh.SSHClientConnection, str]:
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    if first_contact is None:
        return await connect_pinned(target, client_key, recorded)
    started = time.monotonic()
    reported = -FIRST_CONTACT_REPORT_SECONDS
    while True:
        try:
            return await connect_pinned(target, client_key, recorded)
        except (asyncssh.Error, OSError, asyncio.IncompleteReadError) as error:
            why = _not_up_yet(error, first_contact.key_may_be_pending)
            waited = time.monotonic() - started
            if why is None:
                raise
            if waited + FIRST_CONTACT_POLL_SECONDS > first_contact.seconds:
                raise SshDeadlineError(
                    target.node,
                    f"no SSH login to {target.address}:{target.port} within {first_contact.seconds:.0f}s of first "
                    f"contact (last try: {why}); check that the host is up and the port is open to this machine, or "
                    f"give a slow first boot more time with {first_contact.setting}",
                ) from None
            if waited - reported >= FIRST_CONTACT_REPORT_SECONDS:
                reported = waited
                first_contact.progress(
                    f"waiting for SSH on {target.address}:{target.port} ({why}), {waited:.0f}s of "
                    f"{first_contact.seconds:.0f}s"
                )
            await asyncio.sleep(FIRST_CONTACT_POLL_SECONDS)


async def _login(
    target: SshTarget, client_key: asyncssh.SSHKey, recorded: str | None, first_contact: FirstContact | None
) -> tuple[asyncssh.SSHClientConnection, str]:
    """A new connection, its failures said in the program's words."""
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    try:
        return await _connect_patiently(target, client_key, recorded, first_contact)
    except asyncssh.HostKeyNotVerifiable:
        presented = await _presented_host_key(target)
        raise HostKeyChangedError(target.node, target.address, recorded or "", presented) from None
    except TimeoutError:
        raise SshDeadlineError(
            target.node,
            f"no SSH connection to {target.address}:{target.port} within {target.connect_timeout:.0f}s; "
            "check that the host is up and the port is open to this machine",
        ) from None
    except asyncssh.PermissionDenied:
        raise SshLoginRefusedError(
            target.node,
            f"{target.user}@{target.address} refused the key of hk3s:ssh.private_key_file; "
            "add its public key to the user's authorized_keys",
        ) from None
    except (asyncssh.Error, OSError, asyncio.IncompleteReadError) as error:
        raise SshError(target.node, f"cannot connect to {target.address}:{target.port}: {error}") from None


@asynccontextmanager
async def open_session(
    target: SshTarget, first_contact: FirstContact | None = None, *, shared: bool = False, login_anew: bool = False
) -> AsyncIterator[SshSession]:
    """Connect with the host key pinned (or recorded on first use); with `first_contact`,
    wait for a host that is still coming up. With `shared`, where the running loop shares
    logins (remote_access.session_pool), reuse a connection that logs in the same way
    and verified the same host key (unless `login_anew`), and leave it open for the next
    caller."""
    import asyncssh  # noqa: PLC0415 - loaded on first use: most provider processes never open SSH

    try:
        client_key = asyncssh.import_private_key(target.private_key)
    except (asyncssh.KeyImportError, ValueError) as error:
        raise SshError(
            target.node,
            f"the SSH private key (hk3s:ssh.private_key_file) cannot be read: {error}; "
            "give an unencrypted OpenSSH or PEM private key",
        ) from None
    recorded = target.recorded_host_key.strip() if target.recorded_host_key else None
    pool = active_pool() if shared else None
    if pool is not None:
        login = LoginKey.of(target.address, target.port, target.user, target.private_key)
        lease = await pool.lease(
            login,
            recorded,
            lambda: _login(target, client_key, recorded, first_contact),
            target.connect_timeout,
            login_anew=login_anew,
        )
        try:
            yield SshSession(target, lease.connection, lease.host_key, newly_recorded=recorded is None)
        finally:
            pool.give_back(login, lease)
        return
    connection, known = await _login(target, client_key, recorded, first_contact)
    try:
        yield SshSession(target, connection, known, newly_recorded=recorded is None)
    finally:
        connection.close()
        await connection.wait_closed()


def _algorithms_for(key_type: str) -> list[str]:
    if key_type == "ssh-rsa":
        return ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
    return [key_type]
