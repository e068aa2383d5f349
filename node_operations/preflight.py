"""Preflight: decide from a host's facts whether it may join, before anything
on it changes: what a machine needs to be a worker (OS, address, resources, no
foreign Kubernetes state), checked so a refused host is left as it was.

Every problem names the host, the failed check and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from node_operations.host_facts import HostFacts

# A "2 GB" machine reports a little less than 2048 MiB of MemTotal.
MIN_MEMORY_MB = 1800
MIN_CPUS = 2

# OS id -> lowest supported major version.
SUPPORTED_OS_MAJOR = {
    "debian": 11,
    "ubuntu": 20,
    "rocky": 8,
    "almalinux": 8,
    "rhel": 8,
    "centos": 9,
}
# `uname -m` -> the k3s release's name for the architecture (its assets: k3s, k3s-arm64).
K3S_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}
# Longhorn volumes break on these 9.x releases until a release adopts a fixed Longhorn.
LONGHORN_BROKEN_EL = ("rocky", "almalinux")
LONGHORN_BROKEN_FROM = (9, 7)


@dataclass(frozen=True)
class PreflightProblem:
    """One reason a host may not join."""

    node: str
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.node}: preflight {self.check}: {self.message}"


@dataclass(frozen=True)
class PreflightRequirements:
    """What the cluster asks of every node."""

    pod_network: str  # wireguard or vxlan
    # A worker this program joined before carries its own k3s state; that is not foreign.
    own_k3s_state_expected: bool = False
    min_memory_mb: int = MIN_MEMORY_MB
    min_cpus: int = MIN_CPUS
    # The architecture of the k3s binary the program uploads (amd64/arm64), None when hosts download it.
    binary_architecture: str | None = None


def _version(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for part in text.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def check_os(node: str, facts: HostFacts) -> PreflightProblem | None:
    """Supported OS; Rocky/AlmaLinux 9.7 and later 9.x are refused because Longhorn, which
    every worker runs, is broken there."""
    version = _version(facts.os_version_id)
    minimum = SUPPORTED_OS_MAJOR.get(facts.os_id)
    if minimum is None or not version:
        return PreflightProblem(
            node,
            "os",
            f"{facts.os_pretty_name} is not supported; use Debian 11+, Ubuntu 20.04+, Rocky/AlmaLinux 8 "
            "or 9 up to 9.6, RHEL 8/9 or CentOS Stream 9",
        )
    if version[0] < minimum:
        return PreflightProblem(
            node, "os", f"{facts.os_pretty_name} is too old; upgrade to {facts.os_id} {minimum} or later"
        )
    if facts.os_id in LONGHORN_BROKEN_EL and version[:2] >= LONGHORN_BROKEN_FROM and version[0] == 9:
        return PreflightProblem(
            node,
            "os",
            f"{facts.os_pretty_name} is refused: workers hold Longhorn volumes, and Longhorn is broken on "
            "Rocky Linux and AlmaLinux 9.7 and later 9.x until a release adopts a fixed Longhorn. "
            "Use 9.6 or another supported OS for this worker",
        )
    return None


def evaluate_preflight(node: str, facts: HostFacts, requirements: PreflightRequirements) -> list[PreflightProblem]:
    """Every preflight problem of one host (empty: it may join)."""
    problems: list[PreflightProblem] = []
    os_problem = check_os(node, facts)
    if os_problem is not None:
        problems.append(os_problem)
    architecture = K3S_ARCHITECTURES.get(facts.architecture)
    if architecture is None:
        problems.append(
            PreflightProblem(
                node,
                "architecture",
                f"the host is {facts.architecture}; this cluster runs k3s on x86_64 (amd64) and aarch64 (arm64) "
                "hosts only: use such a host",
            )
        )
    elif requirements.binary_architecture and requirements.binary_architecture != architecture:
        problems.append(
            PreflightProblem(
                node,
                "architecture",
                f"the host is {facts.architecture} ({architecture}), but the k3s binary hk3s:cluster.k3s_binary "
                f"uploads is built for {requirements.binary_architecture}: unset k3s_binary (each host downloads "
                "its own architecture's k3s) or use hosts of one architecture",
            )
        )
    if not facts.ipv4_addresses:
        problems.append(PreflightProblem(node, "ipv4", "the host has no global IPv4 address; every node needs one"))
    if not facts.systemd:
        problems.append(
            PreflightProblem(node, "systemd", "systemd is not running as init; k3s runs as a systemd service")
        )
    if facts.memory_mb < requirements.min_memory_mb:
        problems.append(
            PreflightProblem(
                node,
                "memory",
                f"{facts.memory_mb} MiB of RAM, at least {requirements.min_memory_mb} MiB needed (4 GiB for real work)",
            )
        )
    if facts.cpus < requirements.min_cpus:
        problems.append(PreflightProblem(node, "cpu", f"{facts.cpus} CPU(s), at least {requirements.min_cpus} needed"))
    if facts.swap_mb > 0:
        problems.append(
            PreflightProblem(
                node,
                "swap",
                f"{facts.swap_mb} MiB of swap is on; the kubelet needs it off: run `swapoff -a` and remove "
                "the swap entries from /etc/fstab",
            )
        )
    if requirements.pod_network == "wireguard" and facts.wireguard == "missing":
        problems.append(
            PreflightProblem(
                node,
                "wireguard",
                "the wireguard kernel module cannot be loaded, but the pod network uses WireGuard; install a "
                "kernel with WireGuard (5.6+) or its module package",
            )
        )
    if facts.kubernetes_state and not requirements.own_k3s_state_expected:
        problems.append(
            PreflightProblem(
                node,
                "kubernetes-state",
                "the host carries state of an earlier Kubernetes install ("
                + ", ".join(facts.kubernetes_state)
                + "), which makes a join loop on a CA hash mismatch. Reset the host: stop what runs it "
                "(systemctl disable --now k3s-agent k3s kubelet), remove those paths (rm -rf), and run again",
            )
        )
    return problems


def container_engine_notice(node: str, facts: HostFacts) -> str | None:
    """What a fence will and will not stop on a host that runs another container engine beside
    k3s (None when it runs none). Not a refusal: such a host may join, but its operator should
    know that fencing it leaves that engine's containers running."""
    if not facts.container_engines:
        return None
    return (
        f"{node} runs another container engine ({', '.join(facts.container_engines)}). A fence of {node} "
        "stops its k3s agent and k3s's own containers (the shims under /var/lib/rancher/k3s/data) and "
        "holds them down; it does not stop that engine or its containers, which keep running and "
        "keep whatever they hold"
    )
