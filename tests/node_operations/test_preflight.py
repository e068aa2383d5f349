"""Preflight verdicts. Facts are read for real from this machine through the
SSH layer and a real sshd; OS and size variants are those facts with one field
changed, since the test machine is only one OS."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from node_operations.host_facts import HostFacts, read_host_facts
from node_operations.preflight import (
    PreflightRequirements,
    check_os,
    container_engine_notice,
    evaluate_preflight,
)
from remote_access.ssh import SshTarget
from tests.loopback_sshd import LoopbackSshd


@pytest.fixture
def real_facts(sshd: LoopbackSshd) -> HostFacts:
    target = SshTarget(node="w", address="127.0.0.1", port=sshd.port, private_key=sshd.client_private_key)
    return asyncio.run(read_host_facts(target)).facts


def test_real_facts_match_the_machine(real_facts: HostFacts) -> None:
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    assert real_facts.os_id == os_release["ID"].strip('"')
    assert real_facts.systemd == Path("/run/systemd/system").is_dir()
    meminfo = Path("/proc/meminfo").read_text()
    total_kb = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemTotal:")))
    assert real_facts.memory_mb == total_kb // 1024


def _healthy(facts: HostFacts) -> HostFacts:
    return dataclasses.replace(
        facts,
        os_id="debian",
        os_version_id="12",
        os_pretty_name="Debian GNU/Linux 12 (bookworm)",
        architecture="x86_64",
        systemd=True,
        cpus=2,
        memory_mb=3800,
        swap_mb=0,
        wireguard="loadable",
        ipv4_addresses=["eth0 198.51.100.7/24"],
        kubernetes_state=[],
        container_engines=[],
    )


VXLAN = PreflightRequirements(pod_network="vxlan")
WIREGUARD = PreflightRequirements(pod_network="wireguard")


def test_healthy_host_passes(real_facts: HostFacts) -> None:
    assert evaluate_preflight("w", _healthy(real_facts), WIREGUARD) == []


@pytest.mark.parametrize(
    ("os_id", "version", "verdict"),
    [
        ("debian", "12", None),
        ("debian", "10", "too old"),
        ("ubuntu", "24.04", None),
        ("rocky", "9.6", None),
        ("rocky", "9.7", "Longhorn"),
        ("almalinux", "9.8", "Longhorn"),
        ("almalinux", "8.10", None),
        ("rocky", "10.0", None),
        ("arch", "rolling", "not supported"),
    ],
)
def test_os_support(real_facts: HostFacts, os_id: str, version: str, verdict: str | None) -> None:
    facts = dataclasses.replace(
        _healthy(real_facts), os_id=os_id, os_version_id=version, os_pretty_name=f"{os_id} {version}"
    )
    problem = check_os("w", facts)
    if verdict is None:
        assert problem is None
    else:
        assert problem is not None and verdict in problem.message and str(problem).startswith("w: preflight os")


@pytest.mark.parametrize(
    ("change", "requirements", "check"),
    [
        ({"swap_mb": 1024}, VXLAN, "swap"),
        ({"memory_mb": 900}, VXLAN, "memory"),
        ({"cpus": 1}, VXLAN, "cpu"),
        ({"systemd": False}, VXLAN, "systemd"),
        ({"ipv4_addresses": []}, VXLAN, "ipv4"),
        ({"wireguard": "missing"}, WIREGUARD, "wireguard"),
        ({"kubernetes_state": ["/var/lib/rancher/k3s/agent"]}, VXLAN, "kubernetes-state"),
        ({"architecture": "armv7l"}, VXLAN, "architecture"),
        (
            {"architecture": "aarch64"},
            PreflightRequirements(pod_network="vxlan", binary_architecture="amd64"),
            "architecture",
        ),
    ],
)
def test_each_failed_check_is_named(
    real_facts: HostFacts, change: dict, requirements: PreflightRequirements, check: str
) -> None:
    problems = evaluate_preflight("worker-3", dataclasses.replace(_healthy(real_facts), **change), requirements)
    assert [p.check for p in problems] == [check]
    assert str(problems[0]).startswith(f"worker-3: preflight {check}: ")


def test_arm64_host_joins_when_it_downloads_or_is_given_an_arm64_binary(real_facts: HostFacts) -> None:
    arm = dataclasses.replace(_healthy(real_facts), architecture="aarch64")
    assert evaluate_preflight("w", arm, VXLAN) == []
    assert evaluate_preflight("w", arm, PreflightRequirements(pod_network="vxlan", binary_architecture="arm64")) == []


def test_missing_wireguard_is_fine_for_vxlan(real_facts: HostFacts) -> None:
    assert evaluate_preflight("w", dataclasses.replace(_healthy(real_facts), wireguard="missing"), VXLAN) == []


def test_own_k3s_state_is_not_foreign_on_rejoin(real_facts: HostFacts) -> None:
    facts = dataclasses.replace(
        _healthy(real_facts), kubernetes_state=["/etc/rancher/k3s", "/var/lib/rancher/k3s/agent"]
    )
    rejoin = PreflightRequirements(pod_network="vxlan", own_k3s_state_expected=True)
    assert evaluate_preflight("w", facts, rejoin) == []
    message = str(evaluate_preflight("w", facts, VXLAN)[0])
    assert "/var/lib/rancher/k3s/agent" in message and "CA hash mismatch" in message


def test_another_container_engine_is_named_with_what_a_fence_leaves_running(real_facts: HostFacts) -> None:
    """A host running Docker's engine beside k3s may join (no refusal), and the join says that a
    fence stops k3s's containers only: the other engine's keep running."""
    facts = dataclasses.replace(_healthy(real_facts), container_engines=["/usr/bin/containerd", "/usr/bin/dockerd"])
    assert evaluate_preflight("w", facts, VXLAN) == []
    notice = container_engine_notice("w", facts)
    assert notice is not None
    assert "w runs another container engine (/usr/bin/containerd, /usr/bin/dockerd)" in notice
    assert "/var/lib/rancher/k3s/data" in notice and "does not stop that engine or its containers" in notice
    assert container_engine_notice("w", _healthy(real_facts)) is None
