"""Local hygiene: the files that steer a run (SSH handshake slots, the API forward's record,
the DIY backend's state) live only where no other user of the machine can write, and a run
nobody watches is told by its missing terminal too. Real directories, real ownership (the
tests run as root and hand a directory to `nobody`), a real pseudo-terminal."""

from __future__ import annotations

import asyncio
import os
import pty
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from operator_api.errors import StackError
from operator_api.locks import keep_state_private
from operator_api.workspace import run_temporary_directory
from providers import host_probe
from remote_access import api_forward
from remote_access.api_forward import ApiForwardError, open_api_forward, stdin_is_terminal
from remote_access.private_dir import UnsafeDirectoryError, private_directory, runtime_directory
from remote_access.ssh import SshError, SshTarget, handshake_slot

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A per-user runtime directory as systemd makes it (0700), for this test alone."""
    base = tmp_path / "run-user"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    monkeypatch.delenv("HK3S_SSH_SLOT_DIR", raising=False)
    monkeypatch.delenv("HK3S_RUNTIME_DIR", raising=False)
    return base


def test_a_new_directory_is_made_for_this_user_alone(runtime: Path) -> None:
    made = runtime_directory()
    assert made == runtime / "hk3s"
    assert _mode(made) == 0o700 and os.lstat(made).st_uid == os.geteuid()


def test_without_a_runtime_directory_the_temporary_one_gets_a_private_directory_per_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    made = runtime_directory()
    assert made == tmp_path / f"hk3s-{os.geteuid()}" and _mode(made) == 0o700


def test_an_engine_run_gets_a_temporary_directory_of_its_own_and_nothing_of_it_outlives_the_run(runtime: Path) -> None:
    """The Kubernetes provider leaves a copy of the admin kubeconfig in $TMPDIR at every start
    (pulumi-kubernetes `writeKubeconfigToFile`): the operator API's runs get a $TMPDIR of their
    own (0700, inside the one they were given), removed when the run ends, also when it fails. Their processes
    still share the user's runtime directory with every other run (HK3S_RUNTIME_DIR)."""
    temporary = runtime.parent / "tmp"
    temporary.mkdir()
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(temporary)}
    probe = (
        "import tempfile; from remote_access.private_dir import runtime_directory; "
        "open(tempfile.mkstemp(prefix='kubeconfig')[1], 'w').write('client-key-data: x'); "
        "print(tempfile.gettempdir()); print(runtime_directory())"
    )
    with run_temporary_directory(env) as scratch:
        assert scratch.parent == temporary and _mode(scratch) == 0o700
        seen = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, **env},
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert seen == [str(scratch), str(runtime / "hk3s")]
        assert [path.name.startswith("kubeconfig") for path in scratch.iterdir()] == [True]
    assert not scratch.exists(), "the run's temporary directory outlived the run"
    assert env == {"PATH": os.environ["PATH"], "TMPDIR": str(temporary)}

    with pytest.raises(RuntimeError, match="the run failed"), run_temporary_directory(env) as failed:
        (failed / "kubeconfig123").write_text("client-key-data: x")
        raise RuntimeError("the run failed")
    assert not failed.exists() and env == {"PATH": os.environ["PATH"], "TMPDIR": str(temporary)}


def test_a_directory_another_user_made_first_is_refused_and_left_alone(tmp_path: Path) -> None:
    planted = tmp_path / "hk3s-0"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectoryError, match=f"{planted} belongs to user id {NOBODY}, not to you") as caught:
        private_directory(planted)
    assert "remove it" in str(caught.value) and "XDG_RUNTIME_DIR" in str(caught.value)
    assert os.lstat(planted).st_uid == NOBODY and _mode(planted) == 0o777


def test_a_symbolic_link_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "hk3s-0"
    link.symlink_to(target)
    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link"):
        private_directory(link)
    assert link.is_symlink() and list(target.iterdir()) == []


def test_a_directory_others_may_enter_is_refused_or_tightened_when_it_is_the_users_own_state(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    with pytest.raises(UnsafeDirectoryError, match=f"mode 0755.*chmod 700 {loose}"):
        private_directory(loose)
    assert _mode(loose) == 0o755
    private_directory(loose, tighten=True)
    assert _mode(loose) == 0o700


def test_handshake_slots_in_a_directory_of_another_user_stop_the_login_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's slot directory could hold every slot and stall each login."""
    planted = tmp_path / "slots"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    monkeypatch.setenv("HK3S_SSH_SLOT_DIR", str(planted))
    target = SshTarget(node="w1", address="192.0.2.7", port=22, user="root", private_key="")

    async def take() -> None:
        async with handshake_slot(target):
            pass

    with pytest.raises(SshError, match=f"w1: {planted} belongs to user id {NOBODY}"):
        asyncio.run(take())
    assert list(planted.iterdir()) == []


def test_a_forward_record_another_user_could_have_written_is_never_read(
    runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record says which local listener is this stack's forward: the Kubernetes provider
    sends the cluster's credentials there. A runtime directory another user owns (with a
    forged record naming that user's listener) stops the run before anything is read or
    started."""
    planted = runtime / "hk3s"
    planted.mkdir(mode=0o755)
    (planted / "api-forward-17480.json").write_text('{"pid": 1, "address": "203.0.113.10"}')
    os.chown(planted, NOBODY, NOBODY)
    started: list[object] = []
    monkeypatch.setattr(api_forward.subprocess, "Popen", lambda *args, **kwargs: started.append(args))
    server = SshTarget(node="server", address="203.0.113.10", port=22, user="root", private_key="")
    with pytest.raises(ApiForwardError, match=f"server: {planted} belongs to user id {NOBODY}"):
        open_api_forward(server, 17480)
    assert started == []


def test_the_default_state_directory_is_tightened_and_a_new_one_made_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".hk3s-state"
    default.mkdir()
    os.chmod(default, 0o755)  # as earlier releases made it
    keep_state_private(default)
    assert _mode(default) == 0o700
    new = tmp_path / "team" / "state"
    keep_state_private(new)
    assert _mode(new) == 0o700
    chosen = tmp_path / "shared"
    chosen.mkdir()
    os.chmod(chosen, 0o750)  # the user's own choice, perhaps a team's group: left as it is
    keep_state_private(chosen)
    assert _mode(chosen) == 0o750
    default.rmdir()
    default.symlink_to(chosen)
    with pytest.raises(StackError, match="symbolic link"):
        keep_state_private(default)


@pytest.fixture
def terminal() -> Iterator[int]:
    primary, secondary = pty.openpty()
    yield secondary
    os.close(primary)
    os.close(secondary)


def test_a_process_reading_a_terminal_is_told_from_one_reading_a_pipe_or_nothing(terminal: int) -> None:
    at_terminal = subprocess.Popen(["sleep", "30"], stdin=terminal)
    unattended = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    piped = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE)
    try:
        assert stdin_is_terminal(at_terminal.pid)
        assert not stdin_is_terminal(unattended.pid)
        assert not stdin_is_terminal(piped.pid)
    finally:
        for process in (at_terminal, unattended, piped):
            process.kill()
            process.wait()


def test_a_first_contact_in_a_run_with_no_terminal_is_refused_unless_the_stack_opts_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No CI or HK3S_NON_INTERACTIVE set, but the engine reads no terminal (a cron job, a
    script's `pulumi up --yes </dev/null`): nobody would read the key, so it is unattended."""
    engine = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        monkeypatch.setattr(host_probe, "engine_pid", lambda: engine.pid)
        props = {"node": "w1", "address": "192.0.2.7", "recorded_host_key": None}
        refusal = host_probe.first_use_refusal(props)
        assert refusal is not None
        assert "the run was started with no terminal on its standard input" in refusal
        assert "hk3s:ssh.host_keys.w1" in refusal and "hk3s:ssh.trust_on_first_use: true" in refusal
        assert host_probe.first_use_refusal(props | {"trust_on_first_use": True}) is None
    finally:
        engine.kill()
        engine.wait()


def test_a_first_contact_from_a_terminal_is_attended(monkeypatch: pytest.MonkeyPatch, terminal: int) -> None:
    engine = subprocess.Popen(["sleep", "30"], stdin=terminal)
    try:
        monkeypatch.setattr(host_probe, "engine_pid", lambda: engine.pid)
        assert host_probe.first_use_refusal({"node": "w1", "address": "192.0.2.7", "recorded_host_key": None}) is None
        monkeypatch.setenv("HK3S_NON_INTERACTIVE", "1")
        refusal = host_probe.first_use_refusal({"node": "w1", "address": "192.0.2.7", "recorded_host_key": None})
        assert refusal is not None and "HK3S_NON_INTERACTIVE is set" in refusal
    finally:
        engine.kill()
        engine.wait()
