"""A worker rebooted in the middle of its preparation (while apt installs
Longhorn's packages): the interrupted `pulumi up` fails, the next one converges
to one joined Node."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pulumi import automation as auto

from lab.hosts import Lab
from lab.stack_harness import LabStack, base_config, server_spec, skip_without_lab_binaries, worker_spec

pytestmark = pytest.mark.lab


def test_reboot_mid_prepare_converges(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("rb-server"))
    # The plain base: preparing it means downloading and installing packages (tens of seconds).
    worker = lab.add_host(worker_spec("rb-worker", extra_packages=()))
    lab.wait_ssh_ready([server, worker])
    stack = LabStack(tmp_path)
    stack.write_config(base_config(lab, server, [worker]))
    rebooted = threading.Event()

    def reboot_during_prepare(line: str) -> None:
        if "[rb-worker] kubelet-hardening applied" in line and not rebooted.is_set():
            rebooted.set()
            threading.Thread(target=lambda: worker.reboot(wait=False), daemon=True).start()

    with pytest.raises(auto.CommandError):
        stack.up(on_output=reboot_during_prepare)
    assert rebooted.is_set()
    lab.wait_ssh_ready([worker])
    stack.log.clear()
    try:
        result = stack.up()
    except auto.CommandError as error:
        pytest.fail(f"the second pulumi up did not converge:\n{stack.text()[-6000:]}\n{error}")
    assert result.summary.result == "succeeded"
    nodes = json.loads(server.run(["/usr/local/bin/k3s", "kubectl", "get", "nodes", "-o", "json"]).stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes].count("rb-worker") == 1
    assert worker.run(["dpkg-query", "-W", "-f=${Status}", "open-iscsi"]).stdout == "install ok installed"
