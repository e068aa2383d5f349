"""Who holds a stack: Pulumi lock files of a file backend judged live, stale or foreign, and
the API's own per-stack lock. The lock holders here are real processes (a copy of `sleep`
named `pulumi`, a process that has exited); no Pulumi CLI runs: every case is decided
before the API would start one."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from operator_api import ClusterStack, StackBusyError
from operator_api.locks import OperatorLock, backend_directory, pulumi_lock_files, read_pulumi_locks


def write_lock(backend: Path, stack: str, pid: int, hostname: str | None = None, name: str = "a1b2") -> Path:
    path = backend / ".pulumi" / "locks" / "organization" / "hk3s" / stack / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": pid,
        "username": "ops",
        "hostname": hostname or socket.gethostname(),
        "timestamp": "2026-01-01T00:00:00Z",
    }
    path.write_text(json.dumps(record))
    return path


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_backend_directory_reads_file_urls(tmp_path: Path) -> None:
    assert backend_directory(tmp_path.as_uri()) == tmp_path
    assert backend_directory("file://~/.hk3s-state") == Path.home() / ".hk3s-state"
    assert backend_directory("s3://bucket/state") is None


def test_lock_states(backend: Path, running_pulumi: subprocess.Popen[bytes]) -> None:
    write_lock(backend, "dev", running_pulumi.pid, name="live")
    write_lock(backend, "dev", dead_pid(), name="stale")
    write_lock(backend, "dev", 1, hostname="ci-runner-7", name="foreign")
    write_lock(backend, "staging", running_pulumi.pid, name="other-stack")
    states = {lock.path.stem: lock.state for lock in read_pulumi_locks(backend, "hk3s", "dev")}
    assert states == {"live": "live", "stale": "stale", "foreign": "foreign"}


def test_a_recycled_pid_is_not_a_live_run(backend: Path) -> None:
    # Our own pid is alive but is python, not the pulumi CLI that wrote the lock.
    import os  # noqa: PLC0415

    write_lock(backend, "dev", os.getpid())
    assert [lock.state for lock in read_pulumi_locks(backend, "hk3s", "dev")] == ["stale"]


def test_a_live_pulumi_lock_makes_the_stack_busy_and_is_kept(
    api: ClusterStack, project: Path, backend: Path, running_pulumi: subprocess.Popen[bytes]
) -> None:
    lock = write_lock(backend, "dev", running_pulumi.pid)
    before = (project / "Pulumi.dev.yaml").read_bytes()
    with pytest.raises(StackBusyError) as caught:
        api.add_worker("dev-metal-2", address="198.51.100.21", holds_copies=False)
    message = str(caught.value)
    assert "stack dev is busy" in message and f"ops@{socket.gethostname()} (pid {running_pulumi.pid})" in message
    assert caught.value.holders[0].pid == running_pulumi.pid
    assert lock.exists(), "a live run's lock must never be removed"
    assert (project / "Pulumi.dev.yaml").read_bytes() == before


def test_a_lock_from_another_host_makes_the_stack_busy(api: ClusterStack, backend: Path) -> None:
    lock = write_lock(backend, "dev", 4242, hostname="ci-runner-7")
    with pytest.raises(StackBusyError, match=r"ops@ci-runner-7 \(pid 4242\)"):
        api.up()
    assert lock.exists()


def test_the_operator_lock_admits_one_caller(backend: Path) -> None:
    lock = OperatorLock(backend, "hk3s", "dev")
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock.hold("up"):
            entered.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(10)
        with pytest.raises(StackBusyError) as caught, OperatorLock(backend, "hk3s", "dev").hold("adding worker x"):
            pass
        assert "another operator call is running" in str(caught.value) and ", up" in str(caught.value)
    finally:
        release.set()
        holder.join()
    with OperatorLock(backend, "hk3s", "dev").hold("up"):  # free again once released
        pass
    assert pulumi_lock_files(backend, "hk3s", "dev") == []  # kept apart from Pulumi's own locks


def test_unlock_shows_the_holder_and_its_age_and_removes_only_on_confirmation(api: ClusterStack, backend: Path) -> None:
    """A lock left by a run on another machine: shown with its age, kept without a confirmation,
    removed with one; `only` removes just the locks an operator was shown."""
    foreign = write_lock(backend, "dev", 4242, hostname="ci-runner-7", name="foreign")
    report = api.unlock()
    assert [(h.user, h.hostname, h.pid) for h in report.holders] == [("ops", "ci-runner-7", 4242)]
    assert report.removed == [] and foreign.exists()
    assert report.ages[0] is not None and report.ages[0] > 86400
    assert "locked by ops@ci-runner-7 (pid 4242) since 2026-01-01T00:00:00Z" in report.lines()[0]
    later = write_lock(backend, "dev", 4343, hostname="ci-runner-8", name="later")
    removed = api.unlock(confirm=True, only=report.holders)
    assert [h.hostname for h in removed.removed] == ["ci-runner-7"]
    assert not foreign.exists() and later.exists()
    assert api.unlock(confirm=True).removed and not later.exists()
    assert api.unlock().lines() == ["stack dev is not locked"]


def test_unlock_refuses_the_lock_of_a_run_alive_on_this_machine(
    api: ClusterStack, backend: Path, running_pulumi: subprocess.Popen[bytes]
) -> None:
    live = write_lock(backend, "dev", running_pulumi.pid)
    with pytest.raises(StackBusyError, match="still runs on this machine"):
        api.unlock(confirm=True)
    assert live.exists()


def test_an_operation_holds_the_stack_in_pulumis_layout_and_a_second_is_refused(tmp_path: Path) -> None:
    """An operation that makes no Pulumi run (a reboot) takes the stack's lock where Pulumi's DIY
    backend keeps it (the folder of the stack's project-scoped layout): read while held as this
    process's live lock naming the action; a second taker is refused naming the holder and leaves
    nothing behind; both gone once the first ends."""
    from operator_api.backend_lock import hold_file_lock  # noqa: PLC0415

    state = tmp_path / ".pulumi" / "stacks" / "organization" / "hk3s" / "prod.json"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    with hold_file_lock(tmp_path, "hk3s", "prod", "rebooting w1"):
        (held,) = read_pulumi_locks(tmp_path, "hk3s", "prod")
        assert held.path.parent == tmp_path / ".pulumi" / "locks" / "organization" / "hk3s" / "prod"
        assert held.state == "live" and held.holder.since.endswith(", rebooting w1"), held
        with pytest.raises(StackBusyError) as busy, hold_file_lock(tmp_path, "hk3s", "prod", "rebooting w2"):
            pytest.fail("a second operation went on while the first held the stack")
        assert busy.value.holders == [held.holder] and "rebooting w1" in str(busy.value)
        assert pulumi_lock_files(tmp_path, "hk3s", "prod") == [held.path]
    assert pulumi_lock_files(tmp_path, "hk3s", "prod") == []


def test_an_operations_lock_follows_a_backend_in_the_older_layout(tmp_path: Path) -> None:
    """A backend whose stacks are still unscoped (`.pulumi/stacks/<stack>.json`): the lock goes where
    Pulumi looks in that layout, `.pulumi/locks/<stack>/`."""
    from operator_api.backend_lock import hold_file_lock  # noqa: PLC0415

    (tmp_path / ".pulumi" / "stacks").mkdir(parents=True)
    (tmp_path / ".pulumi" / "stacks" / "prod.json").write_text("{}")
    with hold_file_lock(tmp_path, "hk3s", "prod", "starting default/Deployment/db"):
        (held,) = read_pulumi_locks(tmp_path, "hk3s", "prod")
        assert held.path.parent == tmp_path / ".pulumi" / "locks" / "prod"
