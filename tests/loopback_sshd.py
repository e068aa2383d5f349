"""A throwaway OpenSSH server on loopback, for tests of the SSH layer and of
providers that log in to a host. It is the real sshd from Debian's
openssh-server package, run as root in the foreground with its own host key,
authorized key and port; not a mock."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@dataclass
class LoopbackSshd:
    """One sshd process; `restart_with_new_host_key()` simulates a reinstall."""

    directory: Path
    port: int = field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None
    extra_config: tuple[str, ...] = ()
    """sshd_config lines added to the test server's own (e.g. `MaxStartups 2:100:2`)."""

    @property
    def client_key_path(self) -> Path:
        return self.directory / "client_key"

    @property
    def client_private_key(self) -> str:
        return self.client_key_path.read_text()

    @property
    def host_key_line(self) -> str:
        """The host's public key as 'ssh-ed25519 AAAA...' (no comment)."""
        parts = (self.directory / "host_key.pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not (self.directory / "host_key").exists():
            _keygen(self.directory / "host_key")
        if not self.client_key_path.exists():
            _keygen(self.client_key_path)
        shutil.copy(self.directory / "client_key.pub", self.directory / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)
        config = self.directory / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {self.port}",
                    f"HostKey {self.directory / 'host_key'}",
                    f"AuthorizedKeysFile {self.directory / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "StrictModes no",
                    "UsePAM no",
                    f"PidFile {self.directory / 'sshd.pid'}",
                    "Subsystem sftp internal-sftp",
                    *self.extra_config,
                    "",
                ]
            )
        )
        self.process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    if sock.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd on 127.0.0.1:{self.port} did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def restart_with_new_host_key(self) -> None:
        self.stop()
        for suffix in ("", ".pub"):
            (self.directory / f"host_key{suffix}").unlink()
        self.start()
