"""Read a host's facts over SSH: the data preflight and network-mode selection use."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from host_scripts import script_path
from remote_access.ssh import FirstContact, SshDeadlineError, SshError, SshSession, SshTarget, open_session

# How long the first contact with a host waits for SSH (and cloud-init) by default.
FIRST_CONTACT_SECONDS = 300.0

HOST_FACTS_DEADLINE_SECONDS = 30.0
# A Hetzner network attached to a running server shows up on the host a little later.
EXPECTED_ADDRESS_WAIT_SECONDS = 120.0
EXPECTED_ADDRESS_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class HostFacts:
    """What a host is: OS, size, addresses and routes, leftovers of Kubernetes."""

    os_id: str
    os_version_id: str
    os_pretty_name: str
    kernel: str
    architecture: str
    cpus: int
    memory_mb: int
    swap_mb: int
    systemd: bool
    wireguard: str  # loaded, loadable or missing
    ipv4_addresses: list[str] = field(default_factory=list)  # "eth0 198.51.100.7/24"
    ipv4_routes: list[str] = field(default_factory=list)  # as `ip -4 route` prints them
    kubernetes_state: list[str] = field(default_factory=list)
    # Executables of another container engine running on the host (dockerd, a containerd outside
    # k3s's data dir, crio, conmon).
    container_engines: list[str] = field(default_factory=list)

    @property
    def default_route_interface(self) -> str | None:
        for route in self.ipv4_routes:
            words = route.split()
            if words[:1] == ["default"] and "dev" in words:
                return words[words.index("dev") + 1]
        return None


@dataclass(frozen=True)
class ObservedHost:
    """Facts plus the SSH host key seen while reading them."""

    facts: HostFacts
    host_key: str
    host_key_newly_recorded: bool


def parse_host_facts(node: str, output: str) -> HostFacts:
    """Parse the `fact <name> <value>` lines of host_facts.sh."""
    single: dict[str, str] = {}
    multi: dict[str, list[str]] = {"ipv4_address": [], "ipv4_route": [], "kubernetes_state": [], "container_engine": []}
    for line in output.splitlines():
        words = line.split(" ", 2)
        if len(words) < 3 or words[0] != "fact":
            continue
        name, value = words[1], words[2]
        if name in multi:
            multi[name].append(value)
        else:
            single[name] = value
    if single.get("complete") != "yes":
        raise SshError(node, "host_facts.sh stopped before reporting every fact; run it by hand to see why")
    try:
        return HostFacts(
            os_id=single["os_id"],
            os_version_id=single["os_version_id"],
            os_pretty_name=single["os_pretty_name"],
            kernel=single["kernel"],
            architecture=single["architecture"],
            cpus=int(single["cpus"]),
            memory_mb=int(single["memory_mb"]),
            swap_mb=int(single["swap_mb"]),
            systemd=single["systemd"] == "yes",
            wireguard=single["wireguard"],
            ipv4_addresses=multi["ipv4_address"],
            ipv4_routes=multi["ipv4_route"],
            kubernetes_state=multi["kubernetes_state"],
            container_engines=multi["container_engine"],
        )
    except (KeyError, ValueError) as error:
        raise SshError(node, f"host_facts.sh printed an unreadable fact ({error})") from None


async def gather_facts(session: SshSession) -> HostFacts:
    """Run host_facts.sh over an open session and parse its output."""
    result = await session.run_script(script_path("host_facts.sh"), deadline=HOST_FACTS_DEADLINE_SECONDS)
    return parse_host_facts(session.target.node, result.stdout)


def interface_of(facts: HostFacts, address: str) -> str | None:
    """The interface that carries `address`, from the host's IPv4 addresses."""
    for entry in facts.ipv4_addresses:
        interface, _, cidr = entry.partition(" ")
        if cidr.split("/")[0] == address:
            return interface
    return None


CLOUD_INIT_WAIT = (
    # Exit 0 without cloud-init; else wait for it and print its final status line.
    "command -v cloud-init >/dev/null 2>&1 || { echo 'status: absent'; exit 0; }; "
    "cloud-init status --wait >/dev/null 2>&1; cloud-init status 2>/dev/null | head -n 1"
)


# Whether this boot's cloud-init is over, read from the files it leaves in /run (a tmpfs, so
# they are this boot's) before asking `cloud-init status`, a Python program that costs half a
# CPU-second per call: cloud-init writes result.json when its last stage, modules-final, ends,
# and its systemd generator writes `disabled` when it leaves cloud-init out of the boot
# (cloud-init's status command reads the same marker). Either means "not running"; otherwise
# the status line decides.
CLOUD_INIT_RUN_DIR = "/run/cloud-init"
CLOUD_INIT_STATE = (
    'test -e "$1/result.json" && { echo "status: finished"; exit 0; }; '
    'test -e "$1/disabled" && { echo "status: disabled"; exit 0; }; '
    "command -v cloud-init >/dev/null 2>&1 && cloud-init status 2>/dev/null | head -n 1"
)


async def wait_for_cloud_init(session: SshSession, first_contact: FirstContact, started: float) -> bool:
    """Wait until cloud-init has finished the first boot (it writes keys, users and the
    network config the facts depend on). Returns True when it was still running."""
    running = await session.run(["sh", "-c", CLOUD_INIT_STATE, "-", CLOUD_INIT_RUN_DIR], deadline=30, check=False)
    if "running" not in running.stdout and "not started" not in running.stdout:
        return False
    first_contact.progress("waiting for cloud-init to finish the first boot")
    remaining = max(first_contact.seconds - (time.monotonic() - started), 30.0)
    try:
        result = await session.run(["sh", "-c", CLOUD_INIT_WAIT], deadline=remaining, check=False)
    except SshDeadlineError:
        raise SshError(
            session.target.node,
            f"cloud-init did not finish within {first_contact.seconds:.0f}s of first contact; see "
            f"`cloud-init status --long` on the host, or give it more time with {first_contact.setting}",
        ) from None
    status = result.stdout.strip()
    if "error" in status:
        raise SshError(
            session.target.node,
            f"cloud-init finished the first boot with errors ({status}); see `cloud-init status --long` on the host",
        )
    return True


async def read_host_facts(
    target: SshTarget,
    expected_address: str | None = None,
    wait_seconds: float = EXPECTED_ADDRESS_WAIT_SECONDS,
    first_contact: FirstContact | None = None,
) -> ObservedHost:
    """Log in (pinning the host key), run host_facts.sh, parse its output. With
    `expected_address` (a Hetzner network's address, configured on the host some
    seconds after it is attached), read again until the address is on an interface.

    With `first_contact` (the probe's first run), a host still booting is waited for,
    then cloud-init, and only then is the host key taken: cloud-init may replace the
    host's keys during the first boot."""
    started = time.monotonic()
    async with open_session(target, first_contact, shared=True, login_anew=True) as session:
        still_booting = first_contact is not None and await wait_for_cloud_init(session, first_contact, started)
        if not still_booting or target.recorded_host_key:
            return await _observe(session, expected_address, wait_seconds)
    assert first_contact is not None
    first_contact.progress("cloud-init finished: reading the host key now")
    async with open_session(target, shared=True, login_anew=True) as session:
        return await _observe(session, expected_address, wait_seconds)


async def _observe(session: SshSession, expected_address: str | None, wait_seconds: float) -> ObservedHost:
    target = session.target
    facts = await gather_facts(session)
    deadline = time.monotonic() + wait_seconds
    while expected_address and interface_of(facts, expected_address) is None:
        if time.monotonic() > deadline:
            raise SshError(
                target.node,
                f"the private network address {expected_address} is not on any interface after "
                f"{wait_seconds:.0f} s (the host has {', '.join(facts.ipv4_addresses) or 'no IPv4 address'}); "
                "check that the image configures the attached network's interface (hc-utils or cloud-init)",
            )
        await asyncio.sleep(EXPECTED_ADDRESS_POLL_SECONDS)
        facts = await gather_facts(session)
    return ObservedHost(facts=facts, host_key=session.host_key, host_key_newly_recorded=session.newly_recorded)
