"""Shared fixtures: a real sshd on loopback, a valid key file, and the lab."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.loopback_sshd import SSHD, LoopbackSshd

# One lab (bridges; the base tree is cached) per test module, always torn down.
pytest_plugins = ["lab.pytest_fixtures"]


@pytest.fixture(scope="session", autouse=True)
def _attended_unless_the_test_says() -> Iterator[None]:
    """The suite behaves the same on a CI machine as on a laptop. CI systems set CI,
    which marks a run as one nobody watches (a first SSH contact then refuses to
    record an unpinned host key); a test that exercises that sets it itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CI", raising=False)
        patch.delenv("HK3S_NON_INTERACTIVE", raising=False)
        yield


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With HK3S_LAB_REQUIRED=1 (set by scripts/test.sh after the lab set-up),
    a lab test or an sshd test that skips fails instead: CI must never pass by
    skipping the real parts."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    required = os.environ.get("HK3S_LAB_REQUIRED") == "1"
    needs_real_parts = item.get_closest_marker("lab") is not None or "sshd" in getattr(item, "fixturenames", ())
    if required and needs_real_parts and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped although the lab is required (HK3S_LAB_REQUIRED=1): {report.longrepr}"
