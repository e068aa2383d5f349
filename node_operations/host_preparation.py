"""Host preparation outside a join: the server gets the same kernel modules,
sysctls, k3s file permissions, Longhorn packages and key-only SSH as every
worker (host_scripts/node_prepare.sh, journaled on the host, skipped when done).
The SSH step is checked on every run against `sshd -T`, so a drop-in that
something else overrides fails the step instead of reporting "applied"."""

from __future__ import annotations

from collections.abc import Callable

from host_scripts import script_path
from remote_access.ssh import SshTarget, open_session

Progress = Callable[[str], None]
PREPARE_DEADLINE_SECONDS = 600.0


async def prepare_host(target: SshTarget, pod_network: str, progress: Progress) -> None:
    """Run node_prepare.sh on `target`, relaying its result lines as progress.

    Raises an SshError naming the host and the failed step (the script's own message)."""
    progress("preparing the host")
    async with open_session(target, shared=True) as session:
        await session.run_script(
            script_path("node_prepare.sh"),
            [pod_network],
            deadline=PREPARE_DEADLINE_SECONDS,
            on_line=lambda line: progress(line.removeprefix("result ")) if line.startswith("result ") else None,
        )
