"""The host probe on real lab hosts: a Hetzner network's address appears on the
host some seconds after the network is attached, and the facts the network
decision reads must include it. The lab adds the address late, as the image's
network tooling would. And a `pulumi up` killed while the probe waits on the host
leaves no process and no login behind."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from lab.hosts import Host, HostSpec, Lab
from lab.stack_harness import LabStack, base_config, run_cli, skip_without_lab_binaries, wait_until
from lab.stack_processes import StackProcess, end_processes, processes_under
from node_operations.host_facts import read_host_facts
from remote_access.ssh import FirstContact, SshError, SshTarget

pytestmark = pytest.mark.lab
LATE_ADDRESS = "10.99.0.7"


@pytest.fixture(scope="module")
def host(lab: Lab) -> Host:
    """The module's one host."""
    host = lab.add_host(HostSpec("pr-late"))
    lab.wait_ssh_ready([host])
    assert host.public_ip
    return host


def test_probe_waits_for_the_attached_network_address(lab: Lab, host: Host) -> None:
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


# A cloud-init still finishing the first boot, for as long as its marker file exists: the
# probe's first contact waits on `cloud-init status --wait` over SSH (minutes, at most
# hk3s:ssh.first_contact_seconds), a provider operation that holds its login the whole time.
BOOTING_MARKER = "/run/lab-cloud-init-booting"
ASKED = "/run/lab-cloud-init-asked"
BOOTING_CLOUD_INIT = f"""#!/bin/sh
# LAB ONLY (tests/lab/test_host_probe.py): a cloud-init whose first boot lasts until
# {BOOTING_MARKER} is removed; each call is noted in {ASKED}.
echo "$*" >> {ASKED}
case " $* " in *" --wait "*) while [ -e {BOOTING_MARKER} ]; do sleep 1; done ;; esac
if [ -e {BOOTING_MARKER} ]; then echo "status: running"; else echo "status: done"; fi
"""


# A booting host's cloud-init has left neither marker the probe reads before asking it
# (/run/cloud-init/result.json, written when its last stage ends; /run/cloud-init/disabled,
# written by its generator when it is off, as on a plain lab host): both are moved aside.
MARKERS_ASIDE = "for m in result.json disabled; do [ ! -e /run/cloud-init/$m ] || mv /run/cloud-init/$m /run/cloud-init/$m.aside; done"
MARKERS_BACK = "for m in result.json disabled; do [ ! -e /run/cloud-init/$m.aside ] || mv /run/cloud-init/$m.aside /run/cloud-init/$m; done"


def ssh_logins(host: Host) -> list[str]:
    """The SSH connections the host has open (read inside it, not over SSH)."""
    out = host.run(["ss", "-Htn", "state", "established", "( sport = :22 )"]).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_a_killed_up_leaves_no_process_and_no_login_behind(lab: Lab, host: Host, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    cloud_init = host.root / "usr/local/bin/cloud-init"
    cloud_init.write_text(BOOTING_CLOUD_INIT)
    cloud_init.chmod(0o755)
    host.run(["touch", BOOTING_MARKER])
    host.run(MARKERS_ASIDE)
    stack = LabStack(tmp_path)
    try:
        stack.write_config(base_config(lab, host, []))
        stack.stack()  # created, as `pulumi stack init` does
        waiting = f"[{host.name}] waiting for cloud-init to finish the first boot"
        # SIGKILL for the engine alone, as `kill -9` of `pulumi up` (its plugins run in process
        # groups of their own): the provider is mid-operation, logged in to the host.
        run = run_cli(stack, ["up", "--yes", "--skip-preview"], kill_when=waiting, timeout=300)
        assert run.killed, f"the up never waited on the host's cloud-init:\n{run.output[-3000:]}"
        # It had logged in and asked the host (and waits on it over that login, as the line says).
        assert "status" in host.run(["cat", ASKED]).stdout

        def left() -> list[StackProcess]:
            # Pulumi's language host is Pulumi's, not the program's: it holds no login, and its own
            # check of the engine (rpcutil.Healthcheck, every 5 minutes) ends it; the test ends it
            # below. Every other process of the run is the program's or runs its code.
            return [p for p in processes_under(stack.directory) if "pulumi-language-python" not in p.command]

        # The provider process notices its engine is gone and exits with its login (and so does
        # the shell script that launched it); the program ended when the engine's calls failed.
        wait_until(
            "every process of the killed run ended",
            lambda: not left(),
            timeout=10,
            diagnose=lambda: "\n".join(map(str, left())),
        )
        wait_until("the host sees no login of the killed run", lambda: not ssh_logins(host), timeout=10)
    finally:
        host.run(["rm", "-f", BOOTING_MARKER, ASKED, "/usr/local/bin/cloud-init"])
        host.run(MARKERS_BACK)
        end_processes(processes_under(stack.directory))  # the language host, and any failure's leftovers


def test_first_contact_with_a_booted_host_reads_cloud_inits_markers_not_its_status(lab: Lab, host: Host) -> None:
    """`cloud-init status` is a Python program (half a CPU-second a call): the first contact
    asks it only while neither of the markers of a finished or disabled cloud-init exists."""
    assert host.public_ip
    cloud_init = host.root / "usr/local/bin/cloud-init"
    cloud_init.write_text(BOOTING_CLOUD_INIT)
    cloud_init.chmod(0o755)
    target = SshTarget(node=host.name, address=host.public_ip, private_key=lab.ssh_private_key_path.read_text())
    lines: list[str] = []
    contact = FirstContact(seconds=60, progress=lines.append)
    try:
        # A plain lab host: its generator left cloud-init out of the boot and said so.
        assert host.run(["test", "-e", "/run/cloud-init/disabled"], check=False).returncode == 0
        asyncio.run(read_host_facts(target, first_contact=contact))
        assert host.run(["cat", ASKED], check=False).stdout == "", "asked cloud-init with its marker present"
        # Finished: result.json, the disabled marker gone.
        host.run(MARKERS_ASIDE)
        host.run(["sh", "-c", 'echo \'{"v1": {"errors": []}}\' > /run/cloud-init/result.json'])
        asyncio.run(read_host_facts(target, first_contact=contact))
        assert host.run(["cat", ASKED], check=False).stdout == "", "asked cloud-init with result.json present"
        # Neither marker: the status decides (the fake says done), and it was asked.
        host.run(["rm", "-f", "/run/cloud-init/result.json"])
        asyncio.run(read_host_facts(target, first_contact=contact))
        assert "status" in host.run(["cat", ASKED]).stdout
        assert not any("waiting for cloud-init" in line for line in lines)
    finally:
        host.run(["rm", "-f", ASKED, "/usr/local/bin/cloud-init"])
        host.run(MARKERS_BACK)
