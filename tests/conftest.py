"""Shared fixtures: a real sshd on loopback, a throwaway network namespace, a valid key file,
a project directory with the example stacks and a process that looks like a running Pulumi
CLI (for the operator API and CLI tests), and the lab."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from operator_api import REPO
from tests.loopback_sshd import SSHD, LoopbackSshd

# One lab (bridges; the base tree is cached) per test module, always torn down.
# The CI profile's marks (inert unless scripts/test.sh profiles the run).
# The longest modules first when they run side by side (lab/test_order.py).
pytest_plugins = ["lab.pytest_fixtures", "lab.cpu_profile_plugin", "lab.test_order"]


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
def netns() -> Iterator[str]:
    """A throwaway network namespace (for nftables rulesets the kernel checks and loads); deleted
    afterwards, so nothing on this machine changes. Needs root, nft and ip."""
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs root, nft and ip (scripts/setup_system.sh --lab installs nftables)")
    name = f"hk3s-fwtest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


@pytest.fixture
def ssh_key_file(tmp_path: Path) -> Path:
    """A private key file with its .pub beside it, as a stack points at."""
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n-----END OPENSSH PRIVATE KEY-----\n")
    key.with_name("id_ed25519.pub").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyDummyDummyDummyDummyDummyDummyDumm test\n"
    )
    return key


def example_text(env: str, key_file: Path) -> str:
    text = (REPO / f"Pulumi.{env}.yaml").read_text()
    return text.replace("private_key_file: ~/.ssh/id_ed25519", f"private_key_file: {key_file}")


@pytest.fixture
def project(tmp_path: Path, ssh_key_file: Path) -> Path:
    directory = tmp_path / "project"
    directory.mkdir()
    shutil.copy(REPO / "Pulumi.yaml", directory / "Pulumi.yaml")
    for env in ("dev", "staging"):
        (directory / f"Pulumi.{env}.yaml").write_text(example_text(env, ssh_key_file))
    return directory


@pytest.fixture
def backend(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir()
    return directory


@pytest.fixture
def running_pulumi(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose name is `pulumi`, as a running CLI's is."""
    binary = tmp_path / "bin" / "pulumi"
    binary.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    process = subprocess.Popen([str(binary), "300"])
    # Popen returns once the child's exec closed its close-on-exec pipe, and the kernel names
    # the process after the new program only a moment later (execve closes those descriptors
    # before it sets the name): until then the process is still called after this one.
    comm = Path(f"/proc/{process.pid}/comm")
    deadline = time.monotonic() + 10
    while comm.read_text().strip() != "pulumi" and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With HK3S_LAB_REQUIRED=1 (set by scripts/test.sh after the lab set-up),
    a lab test, an sshd test or a test in a root network namespace that skips
    fails instead: CI must never pass by skipping the real parts."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    required = os.environ.get("HK3S_LAB_REQUIRED") == "1"
    fixtures = set(getattr(item, "fixturenames", ()))
    needs_real_parts = item.get_closest_marker("lab") is not None or bool({"sshd", "netns"} & fixtures)
    if required and needs_real_parts and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped although the lab is required (HK3S_LAB_REQUIRED=1): {report.longrepr}"
