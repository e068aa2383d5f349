"""The one SSH layer every provider and operation uses.

- Host keys are pinned: a host with no recorded key is accepted on first use and
  the key is reported back so the caller records it; a host whose key differs
  from the recorded one is refused, with both fingerprints and how to accept it.
- Every call has a deadline; nothing waits forever on a stuck host.
- Scripts are files run with `bash -s` and their arguments quoted; values that
  must not show in the host's process list (tokens) go in as environment
  variables on the script's stdin, never on a command line.
- Output is streamed line by line to a callback, prefixed by nobody: callers
  prefix progress with the node name.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

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
            f"presented {fingerprint(presented)}. If the host was reinstalled, verify the new key "
            f"out of band and set hk3s:ssh.host_keys.{node} to {presented!r}; otherwise do not "
            "connect: someone may be impersonating the host.",
        )


class SshDeadlineError(SshError):
    """An SSH call ran past its deadline."""


class RemoteCommandError(SshError):
    """A command or script exited non-zero."""

    def __init__(self, node: str, what: str, exit_status: int | None, stderr_tail: str) -> None:
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail
        detail = f": {stderr_tail}" if stderr_tail else ""
        super().__init__(node, f"{what} failed with exit status {exit_status}{detail}")


def fingerprint(public_key_line: str) -> str:
    """SHA256 fingerprint of an OpenSSH public key line, as ssh-keygen -l prints it."""
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

    async def run(
        self,
        argv: Sequence[str],
        *,
        deadline: float,
        stdin: str | None = None,
        on_line: LineCallback | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> CommandResult:
        """Run one command (argv, each argument quoted) under a deadline in seconds."""
        command = shlex.join(argv)
        return await self._run_command(
            command, deadline=deadline, stdin=stdin, on_line=on_line, check=check, what=what or command
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
    ) -> CommandResult:
        stdout_lines: list[str] = []
        stderr_chunks: list[str] = []
        process: asyncssh.SSHClientProcess[str] | None = None
        self.commands += 1
        started = time.monotonic()
        try:
            async with asyncio.timeout(deadline):
                process = await self._connection.create_process(command, encoding="utf-8", errors="replace")
                if stdin is not None:
                    process.stdin.write(stdin)
                process.stdin.write_eof()

                async def read_stderr() -> None:
                    assert process is not None
                    async for chunk in process.stderr:
                        stderr_chunks.append(chunk)

                stderr_task = asyncio.create_task(read_stderr())
                async for line in process.stdout:
                    if not line:  # end of stream, not an empty line (that would be "\n")
                        continue
                    text = line.rstrip("\n")
                    stdout_lines.append(text)
                    if on_line is not None:
                        on_line(text)
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
    async with asyncio.timeout(target.connect_timeout):
        key = await asyncssh.get_server_host_key(target.address, target.port, config=[])
    if key is None:
        raise SshError(target.node, f"{target.address}:{target.port} presented no host key")
    return key.export_public_key("openssh").decode().strip()


@asynccontextmanager
async def open_session(target: SshTarget) -> AsyncIterator[SshSession]:
    """Connect with the host key pinned (or recorded on first use)."""
    try:
        client_key = asyncssh.import_private_key(target.private_key)
    except (asyncssh.KeyImportError, ValueError) as error:
        raise SshError(
            target.node,
            f"the SSH private key (hk3s:ssh.private_key_file) cannot be read: {error}; "
            "give an unencrypted OpenSSH or PEM private key",
        ) from None
    recorded = target.recorded_host_key.strip() if target.recorded_host_key else None
    try:
        async with asyncio.timeout(target.connect_timeout):
            if recorded is None:
                # First use: take the key the host presents, then pin the session to it.
                presented = await _presented_host_key(target)
                known = presented
            else:
                known = recorded
            known_hosts = asyncssh.import_known_hosts(f"* {known}\n")
            algorithm = known.split()[0]
            connection = await asyncssh.connect(
                target.address,
                target.port,
                username=target.user,
                client_keys=[client_key],
                known_hosts=known_hosts,
                server_host_key_algs=_algorithms_for(algorithm),
                agent_path=None,
                config=[],
            )
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
        raise SshError(
            target.node,
            f"{target.user}@{target.address} refused the key of hk3s:ssh.private_key_file; "
            "add its public key to the user's authorized_keys",
        ) from None
    except (asyncssh.Error, OSError) as error:
        raise SshError(target.node, f"cannot connect to {target.address}:{target.port}: {error}") from None
    try:
        yield SshSession(target, connection, known, newly_recorded=recorded is None)
    finally:
        connection.close()
        await connection.wait_closed()


def _algorithms_for(key_type: str) -> list[str]:
    if key_type == "ssh-rsa":
        return ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
    return [key_type]
