"""Where the backends' files go on a host, and how long their remote steps may take."""

from __future__ import annotations

from remote_access.ssh import SshSession

REMOTE_DIR = "/run/hk3s"
UPLOAD_DEADLINE_SECONDS = 30.0
# UFW runs one command per rule (~0.3 s each), installing nftables may download.
APPLY_DEADLINE_SECONDS = 300.0
REMOVE_DEADLINE_SECONDS = 120.0


async def prepare_dir(session: SshSession, path: str) -> None:
    """Make `path` on the host, readable by root only."""
    await session.run(["mkdir", "-p", "-m", "0700", path], deadline=UPLOAD_DEADLINE_SECONDS)
