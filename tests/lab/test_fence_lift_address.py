"""Lifting a fence in public mode refuses a host whose address changed while it was fenced, on
a real lab host over real SSH, before anything is changed (the server is never reached)."""

from __future__ import annotations

import asyncio

import pytest

from lab.hosts import HostSpec, Lab
from node_operations.fence_lift import FenceLiftRefusedError, address_refusal, lift_fence
from node_operations.join_validation import ValidatedNode
from node_operations.k3s_install import CONFIG_PATH
from remote_access.ssh import SshTarget

pytestmark = pytest.mark.lab
GONE_ADDRESS = "203.0.113.77"


def test_a_public_address_changed_while_fenced_is_refused_before_anything(lab: Lab) -> None:
    host = lab.add_host(HostSpec("fl-addr"))
    lab.wait_ssh_ready([host])
    assert host.public_ip
    key = lab.ssh_private_key_path.read_text()
    worker = SshTarget(node=host.name, address=host.public_ip, private_key=key)

    # No configuration of the program's on the host: nothing recorded to compare.
    assert asyncio.run(address_refusal(worker, "public")) is None

    def configure(node_ip: str) -> None:
        host.run(["mkdir", "-p", "/etc/rancher/k3s"])
        host.run(["sh", "-c", f"printf 'node-ip: {node_ip}\\nnode-name: {host.name}\\n' > {CONFIG_PATH}"])

    # The node IP it joined with is still on the host: nothing to refuse.
    configure(host.public_ip)
    assert asyncio.run(address_refusal(worker, "public")) is None

    configure(GONE_ADDRESS)
    # Private mode: the plan's recorded private path decides, not this check.
    assert asyncio.run(address_refusal(worker, "private")) is None
    refusal = asyncio.run(address_refusal(worker, "public"))
    assert refusal is not None
    assert f"joined with node IP {GONE_ADDRESS}" in refusal
    assert f"{host.public_ip}/" in refusal  # what the host has now
    assert f"node remove {host.name} --force" in refusal

    # Through the lift: refused before the server is asked anything. The server's target is a
    # port nothing listens on, so any step that reached it would fail with a connection error.
    server = SshTarget(node="nowhere", address="127.0.0.1", port=9, private_key=key)
    target = ValidatedNode(
        node=host.name,
        server_url="https://127.0.0.1:6443",
        registry=None,
        validation_taint="hk3s.dev/validating=true:NoSchedule",
        validation_image="",
        kubelet_address=GONE_ADDRESS,
    )
    lines: list[str] = []
    with pytest.raises(FenceLiftRefusedError, match=r"address changed while it was fenced.*Nothing was changed"):
        asyncio.run(lift_fence(server, worker, target, api_wait=5, progress=lines.append, network_mode="public"))
    assert lines == []
