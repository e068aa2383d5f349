"""The host probe on real lab hosts: a Hetzner network's address appears on the
host some seconds after the network is attached, and the facts the network
decision reads must include it. The lab adds the address late, as the image's
network tooling would."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lab.hosts import HostSpec, Lab
from node_operations.host_facts import read_host_facts
from remote_access.ssh import SshError, SshTarget

pytestmark = pytest.mark.lab
LATE_ADDRESS = "10.99.0.7"


def test_probe_waits_for_the_attached_network_address(lab: Lab) -> None:
    host = lab.add_host(HostSpec("pr-late"))
    lab.wait_ssh_ready([host])
    assert host.public_ip
    target = SshTarget(node=host.name, address=host.public_ip, private_key=lab.ssh_private_key_path.read_text())

    def attach_later() -> None:
        time.sleep(4)
        host.run(["ip", "addr", "add", f"{LATE_ADDRESS}/32", "dev", "enp7s0"])

    started = time.monotonic()
    threading.Thread(target=attach_later, daemon=True).start()
    observed = asyncio.run(read_host_facts(target, LATE_ADDRESS, wait_seconds=60))
    assert f"enp7s0 {LATE_ADDRESS}/32" in observed.facts.ipv4_addresses
    assert time.monotonic() - started >= 4

    # An address that never comes: the probe stops naming it and what the host has.
    with pytest.raises(SshError, match=r"10\.99\.0\.8 is not on any interface after 3 s.*hc-utils or cloud-init"):
        asyncio.run(read_host_facts(target, "10.99.0.8", wait_seconds=3))
