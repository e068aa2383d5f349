"""The server's k3s restarted under running joins, through the real Pulumi engine, on booted
lab hosts with the k3s stand-in (whose server runs a real kube-apiserver: `systemctl restart
k3s` really takes the API away for seconds). Nothing is mocked. The tests of this module share
one cluster and run in order."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
K3S = "/usr/local/bin/k3s"
SERVER = "ao-server"
WAITING = re.compile(r"\[(?P<node>[-a-z0-9]+)\] waiting for the Kubernetes API on " + SERVER + r": (?P<reason>[^(]+)")
WAITED = re.compile(r"\[(?P<node>[-a-z0-9]+)\] waited for the Kubernetes API on " + SERVER + r": [^,]+, (?P<s>\d+) s")


@dataclass
class Cluster:
    lab: Lab
    server: Host
    workers: list[Host]
    stack: LabStack

    def node_names(self) -> list[str]:
        out = self.server.run([K3S, "kubectl", "get", "nodes", "-o", "json"]).stdout
        return [item["metadata"]["name"] for item in json.loads(out)["items"]]


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec(SERVER))
    workers = [lab.add_host(worker_spec(f"ao-worker-{i}")) for i in (1, 2, 3)]
    lab.wait_ssh_ready([server, *workers])
    stack = LabStack(tmp_path_factory.mktemp("api-outage-stack"))
    # The server first, alone: the restarts below hit the joins, not the install.
    stack.write_config(base_config(lab, server, []))
    up_or_fail(stack)
    yield Cluster(lab, server, workers, stack)


@dataclass
class Trigger:
    """Runs `action` in the background the first time a progress line contains `marker`."""

    marker: str
    action: Callable[[], object]
    fired_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, line: str) -> None:
        if self.fired_at is None and self.marker in line:
            self.fired_at = time.monotonic()

            def run() -> None:
                try:
                    self.action()
                finally:
                    self.done.set()

            threading.Thread(target=run, daemon=True).start()


def test_joins_ride_through_two_k3s_restarts(cluster: Cluster) -> None:
    w1, w2 = cluster.workers[0], cluster.workers[1]
    restarts: list[tuple[str, float]] = []

    def restart(phase: str) -> Callable[[], None]:
        def action() -> None:
            started = time.monotonic()
            cluster.server.run(["systemctl", "restart", "k3s"], timeout=180)
            restarts.append((phase, time.monotonic() - started))

        return action

    at_register = Trigger("waiting for the node to register", restart("registration"))
    at_validate = Trigger("validating while tainted", restart("validation"))
    seen: list[str] = []

    def on_output(line: str) -> None:
        seen.append(line)
        at_register(line)
        at_validate(line)

    cluster.stack.write_config(base_config(cluster.lab, cluster.server, [w1, w2]))
    cluster.stack.log.clear()
    try:
        result = cluster.stack.up(on_output=on_output)
    except auto.CommandError as error:
        pytest.fail(f"pulumi up failed:\n{cluster.stack.text()[-8000:]}\n{error}")
    assert at_register.done.wait(60) and at_validate.done.wait(60)
    assert result.summary.result == "succeeded"
    text = cluster.stack.text()
    assert "error:" not in text, text[-4000:]
    (cluster.stack.directory / "restarts-up.log").write_text(text)
    # Both restarts really happened while the joins were under way.
    assert {phase for phase, _ in restarts} == {"registration", "validation"}
    live = seen[: next((i for i, line in enumerate(seen) if line.startswith("Diagnostics:")), len(seen))]
    # Each worker joined once: one token, one Node (the engine repeats every diagnostic line
    # in its closing summary, so distinct tokens are counted, in the live lines).
    for worker in (w1, w2):
        tokens = set(re.findall(rf"\[{worker.name}\] join token (\w+) created", text))
        assert len(tokens) == 1, text[-4000:]
        assert sum(f"[{worker.name}] joined and released" in line for line in live) == 1
    names = cluster.node_names()
    assert names.count(w1.name) == 1 and names.count(w2.name) == 1
    # The output shows the waits, once per outage each, with how long they lasted.
    waiting = [m.groupdict() for m in map(WAITING.search, live) if m]
    waited = [m.groupdict() for m in map(WAITED.search, live) if m]
    assert waiting, f"no join waited for the API; restarts took {restarts}:\n{text[-6000:]}"
    assert len(waited) == len(waiting)
    # A wait inside each phase the restarts hit: registration and validation.
    phases = [
        ("waiting for the node to register", "deleted"),
        ("validating while tainted", "releasing: removing the validation taint"),
    ]
    for start, end in phases:
        assert any(_waited_between(live, worker.name, start, end) for worker in (w1, w2)), (start, text[-6000:])
    print(f"restarts (phase, seconds systemctl took): {restarts}")
    print(f"waits begun: {[(w['node'], w['reason'].strip()) for w in waiting]}")
    print(f"waits ended: {[(w['node'], int(w['s'])) for w in waited]}")


def _waited_between(lines: list[str], node: str, start: str, end: str) -> bool:
    """Whether `node`'s progress shows a wait for the API between its lines `start` and `end`."""
    own = [line for line in lines if f"[{node}] " in line]
    begin = next((i for i, line in enumerate(own) if start in line), None)
    if begin is None:
        return False
    finish = next((i for i, line in enumerate(own) if i > begin and end in line), len(own))
    return any(WAITED.search(line) for line in own[begin:finish])


def test_an_api_away_past_the_deadline_stops_cleanly_and_the_next_up_converges(cluster: Cluster) -> None:
    w1, w2, w3 = cluster.workers
    config = base_config(cluster.lab, cluster.server, [w1, w2, w3], cluster={"api_wait_seconds": 8})
    cluster.stack.write_config(config)
    stopped = Trigger(
        f"[{w3.name}] waiting for the node to register",
        lambda: cluster.server.run(["systemctl", "stop", "k3s"], timeout=120),
    )
    cluster.stack.log.clear()
    started = time.monotonic()
    try:
        with pytest.raises(auto.CommandError):
            cluster.stack.up(on_output=stopped)
        assert stopped.done.wait(60)
    finally:
        cluster.server.run(["systemctl", "start", "k3s"], timeout=180)
    failed_after = time.monotonic() - started
    text = cluster.stack.text()
    message = re.search(r"ao-server: the Kubernetes API at (\S+) did not answer for (\d+) s \(([^;]+);", text)
    assert message is not None, text[-6000:]
    assert message.group(1) == "127.0.0.1:6443" and 8 <= int(message.group(2)) <= 12
    assert "hk3s:cluster.api_wait_seconds" in text and "run pulumi up again" in text
    # The program's own error, as its message alone: no Python traceback in the run's output.
    assert "Traceback (most recent call last)" not in text and 'File "' not in text
    print(f"stopped the API; the up failed after {failed_after:.0f} s with: {message.group(0)}")

    cluster.stack.log.clear()
    result = up_or_fail(cluster.stack)
    assert result.summary.result == "succeeded"
    names = cluster.node_names()
    assert all(names.count(w.name) == 1 for w in (w1, w2, w3))


def test_a_refused_setting_reads_as_its_message_in_preview(cluster: Cluster) -> None:
    # Raised by the program itself (not a provider): Pulumi's language host shows it without
    # "Program failed with an unhandled exception" and a traceback.
    workers = cluster.workers
    cluster.stack.write_config(base_config(cluster.lab, cluster.server, workers, cluster={"api_wait_seconds": 1}))
    cluster.stack.log.clear()
    try:
        with pytest.raises(auto.CommandError):
            cluster.stack.preview()
    finally:
        cluster.stack.write_config(base_config(cluster.lab, cluster.server, workers))
    text = cluster.stack.text()
    assert "hk3s:cluster.api_wait_seconds" in text and "outside 5-3600 s" in text, text[-3000:]
    assert "Traceback (most recent call last)" not in text and "unhandled exception" not in text, text[-3000:]
