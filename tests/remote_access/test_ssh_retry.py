"""Connection set-up under load: which failures the SSH layer retries, and the
bound on handshakes in flight to one host.

The "fake transports" are real TCP endpoints on loopback that misbehave the way
an overloaded sshd does (close before the banner, reset, close during key
exchange) and then, where a test needs it, relay to a real sshd
(tests/loopback_sshd.py). Nothing in the SSH layer is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import asyncssh
import pytest

from remote_access.ssh import (
    CONNECT_STATS,
    HANDSHAKES_PER_HOST,
    RETRY_FIRST_SECONDS,
    RETRY_MAX_SECONDS,
    HostKeyChangedError,
    SshError,
    SshTarget,
    _backoff,
    handshake_slot,
    is_transient_drop,
    open_session,
)
from tests.loopback_sshd import LoopbackSshd

Behaviour = Callable[[socket.socket, int], bool]
"""Given an accepted client socket and its 0-based connection number: misbehave and
return True, or return False to relay it to the real sshd."""


class FakeTransport:
    """A TCP listener that applies `behaviour` to each connection, relaying the rest to `relay_port`."""

    def __init__(self, behaviour: Behaviour, relay_port: int | None = None) -> None:
        self.behaviour = behaviour
        self.relay_port = relay_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted = 0
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            number = self.accepted
            self.accepted += 1
            if self.behaviour(client, number):
                continue
            assert self.relay_port is not None
            upstream = socket.create_connection(("127.0.0.1", self.relay_port))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def close_before_banner(client: socket.socket) -> None:
    client.close()


def reset(client: socket.socket) -> None:
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def close_during_key_exchange(client: socket.socket) -> None:
    client.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n")
    client.recv(256)  # the client's banner and the start of its KEXINIT
    client.close()


@pytest.fixture
def slot_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Each test its own slot files, so tests never wait on each other's slots.
    directory = tmp_path / "slots"
    monkeypatch.setenv("HK3S_SSH_SLOT_DIR", str(directory))
    return directory


def _target(port: int, key: str, recorded: str | None = None, timeout: float = 8.0) -> SshTarget:
    return SshTarget(
        node="worker-7",
        address="127.0.0.1",
        port=port,
        private_key=key,
        recorded_host_key=recorded,
        connect_timeout=timeout,
    )


def _login(target: SshTarget) -> str:
    async def scenario() -> str:
        async with open_session(target) as session:
            return (await session.run(["echo", "in"], deadline=10)).stdout

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    "misbehave",
    [close_before_banner, reset, close_during_key_exchange],
    ids=["closed-before-banner", "reset", "closed-during-key-exchange"],
)
def test_dropped_handshakes_are_retried_until_the_login_succeeds(
    sshd: LoopbackSshd, slot_dir: Path, misbehave: Callable[[socket.socket], None]
) -> None:
    def behaviour(client: socket.socket, number: int) -> bool:
        if number < 3:
            misbehave(client)
            return True
        return False

    transport = FakeTransport(behaviour, relay_port=sshd.port)
    drops_before = CONNECT_STATS.drops_retried
    try:
        assert _login(_target(transport.port, sshd.client_private_key, sshd.host_key_line)) == "in\n"
    finally:
        transport.close()
    assert transport.accepted == 4
    assert CONNECT_STATS.drops_retried - drops_before == 3


def test_drops_past_the_deadline_name_the_host_and_max_startups(slot_dir: Path, sshd: LoopbackSshd) -> None:
    def drop_all(client: socket.socket, _number: int) -> bool:
        close_before_banner(client)
        return True

    transport = FakeTransport(drop_all)
    started = time.monotonic()
    try:
        with pytest.raises(SshError) as caught:
            _login(_target(transport.port, sshd.client_private_key, timeout=3.0))
    finally:
        transport.close()
    message = str(caught.value)
    assert message.startswith("worker-7: cannot connect to 127.0.0.1:")
    assert "dropped" in message and "MaxStartups" in message
    assert transport.accepted > 2  # it did retry ...
    assert time.monotonic() - started < 3.0 + 1.0  # ... within the connect deadline


def test_refused_connection_is_not_retried(slot_dir: Path, sshd: LoopbackSshd) -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        closed_port = int(placeholder.getsockname()[1])
    attempts_before = CONNECT_STATS.connections
    with pytest.raises(SshError) as caught:
        _login(_target(closed_port, sshd.client_private_key))
    assert CONNECT_STATS.connections - attempts_before == 1
    assert "MaxStartups" not in str(caught.value)


def test_refused_key_is_not_retried(slot_dir: Path, sshd: LoopbackSshd, tmp_path: Path) -> None:
    other_key = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    transport = FakeTransport(lambda _client, _number: False, relay_port=sshd.port)
    try:
        with pytest.raises(SshError) as caught:
            _login(_target(transport.port, other_key, sshd.host_key_line))
    finally:
        transport.close()
    assert transport.accepted == 1
    assert "refused the key of hk3s:ssh.private_key_file" in str(caught.value)


def test_changed_host_key_is_not_retried(slot_dir: Path, sshd: LoopbackSshd) -> None:
    recorded = sshd.host_key_line
    sshd.restart_with_new_host_key()
    transport = FakeTransport(lambda _client, _number: False, relay_port=sshd.port)
    try:
        with pytest.raises(HostKeyChangedError):
            _login(_target(transport.port, sshd.client_private_key, recorded))
    finally:
        transport.close()
    # One login attempt, and one more connection only to read the new key for the message.
    assert transport.accepted == 2


def test_first_contact_costs_one_connection_and_records_the_key(slot_dir: Path, sshd: LoopbackSshd) -> None:
    transport = FakeTransport(lambda _client, _number: False, relay_port=sshd.port)

    async def scenario() -> tuple[str, bool]:
        async with open_session(_target(transport.port, sshd.client_private_key)) as session:
            await session.run(["true"], deadline=10)
            return session.host_key, session.newly_recorded

    try:
        host_key, newly = asyncio.run(scenario())
    finally:
        transport.close()
    assert (host_key, newly) == (sshd.host_key_line, True)
    assert transport.accepted == 1


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (asyncssh.ConnectionLost("Connection lost"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (BrokenPipeError(32, "Broken pipe"), True),
        (asyncio.IncompleteReadError(b"", 4), True),
        (asyncssh.PermissionDenied("Permission denied"), False),
        (asyncssh.HostKeyNotVerifiable("Host key is not trusted"), False),
        (asyncssh.KeyExchangeFailed("No matching key exchange algorithm"), False),
        (ConnectionRefusedError(111, "Connection refused"), False),
        (OSError(113, "No route to host"), False),
        (TimeoutError(), False),
    ],
)
def test_retry_classification(error: BaseException, retried: bool) -> None:
    assert is_transient_drop(error) is retried


def test_a_real_sshd_shedding_load_still_lets_every_login_through(tmp_path: Path, slot_dir: Path) -> None:
    """A real sshd that drops every unauthenticated connection beyond 2: twelve logins at once all succeed."""
    server = LoopbackSshd(tmp_path / "sshd", extra_config=("MaxStartups 2:100:2",))
    server.start()

    async def scenario() -> list[str]:
        async def one() -> str:
            async with open_session(_target(server.port, server.client_private_key, server.host_key_line)) as s:
                return (await s.run(["echo", "in"], deadline=10)).stdout

        return await asyncio.gather(*(one() for _ in range(12)))

    drops_before = CONNECT_STATS.drops_retried
    try:
        assert asyncio.run(scenario()) == ["in\n"] * 12
    finally:
        server.stop()
    print(f"sshd dropped {CONNECT_STATS.drops_retried - drops_before} handshakes, all retried")


def _hold_slots(slot_dir: str, port: int, holders: int, hold: float, log: str, *, taken: str | None = None) -> None:
    """In a process of its own: `holders` tasks each take a slot of one host and note when (in
    `log` when they let it go; in `taken`, if given, as soon as they hold it)."""
    import os  # noqa: PLC0415

    os.environ["HK3S_SSH_SLOT_DIR"] = slot_dir
    target = SshTarget(node="n", address="192.0.2.10", port=port, private_key="")

    async def one() -> None:
        async with handshake_slot(target):
            entered = time.time()
            if taken is not None:
                with open(taken, "a") as out:
                    out.write(f"{entered}\n")
            await asyncio.sleep(hold)
            with open(log, "a") as out:
                out.write(f"{entered} {time.time()}\n")

    async def all_of_them() -> None:
        await asyncio.gather(*(one() for _ in range(holders)))

    asyncio.run(all_of_them())


def test_handshakes_to_one_host_are_bounded_across_processes(slot_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "slots.log"
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_hold_slots, args=(str(slot_dir), 22, 4, 0.3, str(log))) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    spans = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    assert len(spans) == 12
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    in_flight = most = 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    assert most == HANDSHAKES_PER_HOST  # never more, and the bound is really used


def test_a_killed_holder_frees_its_slot(slot_dir: Path, tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    taken = tmp_path / "taken"
    args = (str(slot_dir), 2222, HANDSHAKES_PER_HOST, 60.0, "/dev/null")
    holder = context.Process(target=_hold_slots, args=args, kwargs={"taken": str(taken)})
    holder.start()
    target = SshTarget(node="n", address="192.0.2.10", port=2222, private_key="")

    async def take_one() -> float:
        started = time.monotonic()
        async with handshake_slot(target):
            return time.monotonic() - started

    # Until the holder has taken every slot (a spawned process takes a while to start on a busy machine).
    deadline = time.monotonic() + 60
    while len(taken.read_text().splitlines() if taken.exists() else []) < HANDSHAKES_PER_HOST:
        assert time.monotonic() < deadline, "the holder did not take the slots"
        time.sleep(0.05)
    killer = threading.Timer(1.0, holder.kill)
    killer.start()
    waited = asyncio.run(take_one())
    holder.join(10)
    assert waited >= 0.9  # blocked while all four were held, free as soon as the holder died


def test_a_connection_lost_during_a_command_is_not_retried(slot_dir: Path, sshd: LoopbackSshd, tmp_path: Path) -> None:
    """Only setting up a connection is retried: a command whose connection drops mid-way may
    have done its work, so it is never sent again. The error names the host."""
    relayed: list[socket.socket] = []

    def relay_and_keep(client: socket.socket, _number: int) -> bool:
        upstream = socket.create_connection(("127.0.0.1", sshd.port))
        relayed.extend((client, upstream))
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()
        return True

    marker = tmp_path / "ran"
    transport = FakeTransport(relay_and_keep)

    def cut_once_running() -> None:
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for sock in relayed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    async def scenario() -> None:
        async with open_session(_target(transport.port, sshd.client_private_key, sshd.host_key_line)) as session:
            await session.run(["sh", "-c", f"echo ran >> {marker}; sleep 30"], deadline=60)

    cutter = threading.Thread(target=cut_once_running, daemon=True)
    cutter.start()
    try:
        with pytest.raises(SshError) as caught:
            asyncio.run(scenario())
    finally:
        transport.close()
    cutter.join()
    assert str(caught.value).startswith("worker-7: ")
    assert transport.accepted == 1  # no new connection ...
    assert marker.read_text() == "ran\n"  # ... and the command ran once


def test_the_pause_between_tries_grows_and_is_spread() -> None:
    """Exponential backoff with full jitter: each pause lies in [0, min(cap, first x 2^n)], the
    bound doubles per try up to the cap, and the pauses of clients dropped together differ."""
    for attempt in range(8):
        bound = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2**attempt)
        pauses = [_backoff(attempt) for _ in range(200)]
        assert all(0 <= pause <= bound for pause in pauses), attempt
        assert max(pauses) > bound / 2, attempt  # it uses the room it has ...
        assert len({round(pause, 6) for pause in pauses}) > 150, attempt  # ... spread, not in step
    assert min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2**7) == RETRY_MAX_SECONDS
