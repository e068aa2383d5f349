"""The first contact with a host that is still coming up, through the real Pulumi
engine on booted lab hosts (real sshd, the k3s stand-in, a real API server).

A Hetzner server answers SSH some time after its create action finishes; the
lab makes the same situation on an existing host by starting its sshd late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pulumi import automation as auto

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec

pytestmark = pytest.mark.lab
SSHD_LATE_SECONDS = 40


@dataclass
class Cluster:
    lab: Lab
    server: Host
    late: Host
    silent: Host
    stack: LabStack


@pytest.fixture(scope="module")
def cluster(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("fc-server"))
    late, silent = lab.add_host(worker_spec("fc-late")), lab.add_host(worker_spec("fc-silent"))
    lab.wait_ssh_ready([server, late, silent])
    yield Cluster(lab, server, late, silent, LabStack(tmp_path_factory.mktemp("first-contact")))


def test_a_host_whose_sshd_starts_late_is_joined(cluster: Cluster) -> None:
    cluster.late.run(["systemctl", "stop", "ssh.service"])
    cluster.stack.write_config(base_config(cluster.lab, cluster.server, [cluster.late]))
    starter = threading.Timer(SSHD_LATE_SECONDS, lambda: cluster.late.run(["systemctl", "start", "ssh.service"]))
    started = time.monotonic()
    starter.start()
    try:
        up_or_fail(cluster.stack)
    finally:
        starter.cancel()
    assert time.monotonic() - started > SSHD_LATE_SECONDS
    text = cluster.stack.text()
    assert "[fc-late] waiting for SSH on" in text and "connection refused" in text
    assert "[fc-late] joined and released" in text


def test_a_host_that_never_answers_fails_after_the_bounded_wait_naming_it(cluster: Cluster) -> None:
    cluster.silent.run(["systemctl", "stop", "ssh.service"])
    config = base_config(cluster.lab, cluster.server, [cluster.late, cluster.silent])
    config["ssh"] = {**config["ssh"], "first_contact_seconds": 20}
    cluster.stack.write_config(config)
    cluster.stack.log.clear()
    started = time.monotonic()
    with pytest.raises(auto.CommandError):
        cluster.stack.up()
    waited = time.monotonic() - started
    text = cluster.stack.text()
    assert "fc-silent: no SSH login to" in text and "within 20s of first contact" in text
    assert "hk3s:ssh.first_contact_seconds" in text
    assert waited < 20 + 120  # bounded: the wait, then the rest of the failed run
    # The host answers again: the next up joins it.
    cluster.silent.run(["systemctl", "start", "ssh.service"])
    cluster.stack.log.clear()
    up_or_fail(cluster.stack)
    assert "[fc-silent] joined and released" in cluster.stack.text()
