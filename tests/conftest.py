"""Shared fixtures: a real sshd on loopback, and a valid baseline config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.loopback_sshd import SSHD, LoopbackSshd


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[LoopbackSshd]:
    if not SSHD.exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    server = LoopbackSshd(tmp_path / "sshd")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ssh_key_file(tmp_path: Path) -> Path:
    """A private key file with its .pub beside it, as a stack points at."""
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n")
    key.with_name("id_ed25519.pub").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyDummyDummyDummyDummyDummyDummyDumm test\n"
    )
    return key
