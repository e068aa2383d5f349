"""Host hardening that takes effect, on the server as on the workers.

Hetzner's images let cloud-init write /etc/ssh/sshd_config.d/50-cloud-init.conf
with `PasswordAuthentication yes`; sshd keeps the first value it reads, so a
drop-in read after it loses. The lab hosts get that file before the run, and
the test reads what sshd enforces (`sshd -T`) and what it offers a client
that tries passwords, on the server and on the worker.
"""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from lab.hosts import Host, Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, up_or_fail, worker_spec
from node_operations.host_preparation import prepare_host
from remote_access.ssh import SshError, SshTarget, open_session

pytestmark = pytest.mark.lab

CLOUD_INIT_DROPIN = "etc/ssh/sshd_config.d/50-cloud-init.conf"


def effective(host: Host) -> dict[str, str]:
    lines = host.run(["sshd", "-T"]).stdout.splitlines()
    wanted = ("passwordauthentication", "kbdinteractiveauthentication", "permitrootlogin")
    return {key: value for key, _, value in (line.partition(" ") for line in lines) if key in wanted}


def methods_offered(lab: Lab, host: Host) -> str:
    """What sshd offers a client that has no key to give: 'publickey' alone, or also passwords."""
    result = subprocess.run(
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=5",
            f"root@{host.public_ip}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    denied = [line for line in result.stderr.splitlines() if "Permission denied" in line]
    assert denied, result.stderr
    return denied[-1]


def with_cloud_init_passwords(host: Host) -> None:
    """The host's sshd as on a Hetzner image: the lab base's own key-only drop-in gone,
    cloud-init's password drop-in in place."""
    (host.root / "etc/ssh/sshd_config.d/10-hk3s-lab.conf").unlink()
    (host.root / CLOUD_INIT_DROPIN).write_text("PasswordAuthentication yes\n")
    host.run(["systemctl", "reload", "ssh.service"])
    # A reload re-executes sshd, which closes its listening socket for a moment: wait until it
    # listens again, or a connection in that moment is refused.
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection((host.public_ip or "", 22), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_an_earlier_password_dropin_loses_on_the_server_and_the_worker(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("hd-server"))
    worker = lab.add_host(worker_spec("hd-worker"))
    lab.wait_ssh_ready([server, worker])
    for host in (server, worker):
        with_cloud_init_passwords(host)
        assert effective(host)["passwordauthentication"] == "yes"
        assert "password" in methods_offered(lab, host)
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker]))
    result = up_or_fail(stack)
    assert result.summary.result == "succeeded"
    for host in (server, worker):
        assert effective(host) == {
            "passwordauthentication": "no",
            "kbdinteractiveauthentication": "no",
            "permitrootlogin": "without-password",
        }, host.name
        assert methods_offered(lab, host).endswith("(publickey)."), host.name
        assert (host.root / CLOUD_INIT_DROPIN).exists()  # the image's file stays; ours is read first
        assert host.run(["stat", "-c", "%a", "/etc/rancher/k3s", "/var/lib/rancher/k3s"]).stdout.split() == [
            "700",
            "700",
        ]
    assert "[hd-server] host-hardening applied" in stack.text()


def test_a_setting_read_before_the_dropin_fails_the_step_naming_it(lab: Lab) -> None:
    host = lab.add_host(worker_spec("hd-stubborn"))
    lab.wait_ssh_ready([host])
    (host.root / "etc/ssh/sshd_config.d/10-hk3s-lab.conf").unlink()
    config = host.root / "etc/ssh/sshd_config"
    config.write_text("PasswordAuthentication yes\n" + config.read_text())
    # A restart, not a reload: systemctl returns once the new sshd is up (a reloading sshd
    # re-executes itself and refuses connections for a moment), and then it listens.
    host.run(["systemctl", "restart", "ssh.service"])
    host.wait_sshd_listening("after its restart")
    target = SshTarget(
        node=host.name,
        address=host.ssh_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=host.ssh_host_public_key,
    )
    lines: list[str] = []
    with pytest.raises(SshError) as raised:
        asyncio.run(prepare_host(target, "vxlan", lines.append))
    message = str(raised.value)
    assert message.startswith("hd-stubborn: ")
    assert "SSH hardening is not in force: sshd -T says PasswordAuthentication is yes" in message
    assert "/etc/ssh/sshd_config" in message
    assert effective(host)["passwordauthentication"] == "yes"  # reported, not hidden behind "applied"
    host.power_off()


def test_a_match_block_that_turns_passwords_back_on_fails_the_step_naming_the_connection(lab: Lab) -> None:
    """`sshd -T` without `-C` reports the settings outside every Match block: a
    `Match User deploy` (an account with a login shell) or a `Match Address` for the
    program's own address turns passwords back on unseen. The step reads them as sshd
    applies them to each such connection (OpenSSH's sshd(8) -C connection spec)."""
    host = lab.add_host(worker_spec("hd-match"))
    lab.wait_ssh_ready([host])
    host.run(["useradd", "--create-home", "--shell", "/bin/bash", "deploy"])
    config = host.root / "etc/ssh/sshd_config"
    original = config.read_text()
    target = SshTarget(
        node=host.name,
        address=host.ssh_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=host.ssh_host_public_key,
    )

    def prepare_with(match_block: str) -> str:
        config.write_text(original + "\n" + match_block)
        host.run(["systemctl", "restart", "ssh.service"])
        host.wait_sshd_listening("after its restart")
        with pytest.raises(SshError) as raised:
            asyncio.run(prepare_host(target, "vxlan", lambda _line: None))
        return str(raised.value)

    async def program_address() -> str:
        async with open_session(target) as session:
            seen = await session.run(["sh", "-c", 'echo "$SSH_CONNECTION"'], deadline=30)
        return seen.stdout.split()[0]

    ours = asyncio.run(program_address())
    message = prepare_with("Match User deploy\n    PasswordAuthentication yes\n")
    assert message.startswith("hd-match: ")
    assert "SSH hardening is not in force for some connections: sshd -T -C says" in message
    # deploy's connections, the program's own and one from outside (another address), are named.
    deploy = set(re.findall(r"user=deploy,host=[0-9.]+,addr=([0-9.]+),", message))
    assert ours in deploy and len(deploy) == 2, message
    assert "PasswordAuthentication is yes" in message and "a Match block" in message
    assert "user=root" not in message  # only the connections the block opens are named

    message = prepare_with(f"Match Address {ours}\n    KbdInteractiveAuthentication yes\n")
    assert f"(-C user=root,host={ours},addr={ours}," in message
    assert "KbdInteractiveAuthentication is yes" in message
    # An outside connection is not affected by that block: every connection named is ours.
    assert set(re.findall(r",addr=([0-9.]+),", message)) == {ours}, message
    host.power_off()
