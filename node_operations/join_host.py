"""The join's work on the worker host, one command per phase.

Each phase's host steps have nothing to decide between them, so each phase sends them as
one batch (remote_access.host_steps): at 50 ms between the program and the host, a step
costs a round trip of its own otherwise. The steps are the ones the join ran one by one
before, in the same order, with the same checks and the same errors:

- preflight reads (nothing on the host changes): the host's facts, the CA hash an earlier
  join of this cluster journaled, the machine-id and whether a node password is kept, the
  installed k3s binary's checksum (to upload the binary only when it differs), and the
  operator's firewall when the operator runs it;
- preparation: the journal entry saying the host's k3s state is this cluster's (written only
  once preflight passed), then node_prepare.sh;
- install: the host's clock (where the agent's log is read from), the join token's file, the
  agent's config, then k3s_install.sh. The binary, when it must be uploaded, goes before
  them by SFTP: it is megabytes, not a value.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from host_scripts import script_path
from node_operations.host_facts import HOST_FACTS_DEADLINE_SECONDS, HostFacts, parse_host_facts
from node_operations.host_firewall.inspection import INSPECT_DEADLINE_SECONDS, FirewallInspection, parse_inspection
from node_operations.k3s_install import (
    CONFIG_PATH,
    INSTALL_DEADLINE_SECONDS,
    K3S_BIN,
    K3sBinary,
    gzipped_binary,
    parse_results,
    relay_install_results,
)
from remote_access.host_steps import HostStep, run_steps
from remote_access.kube import JoinToken
from remote_access.ssh import CommandResult, RemoteCommandError, SshError, SshSession, SshTarget, open_session

Progress = Callable[[str], None]

JOURNAL_CA = "/var/lib/hk3s/journal/join-ca"
PREPARE_DEADLINE_SECONDS = 600.0
READ_DEADLINE_SECONDS = 15.0


@dataclass(frozen=True)
class JoiningHost:
    """What the join reads on the worker before anything there changes."""

    node: str
    facts: HostFacts
    journal_ca: CommandResult  # `cat` of the journaled CA hash (fails when no join journaled one)
    machine: CommandResult  # the machine-id, then "password" when the node password file is kept
    k3s_sha256: str | None  # the installed binary's, None when none (or not asked)
    firewall: CommandResult | None  # firewall_inspect.sh operator, when asked

    def joined_cluster_before(self, ca_hash: str) -> bool:
        """Whether an earlier join of this cluster (`ca_hash`) left the host's k3s state."""
        return self.journal_ca.exit_status == 0 and self.journal_ca.stdout.strip() == ca_hash

    @property
    def machine_id(self) -> str:
        lines = self.machine.stdout.split()
        return lines[0] if lines else ""

    @property
    def keeps_node_password(self) -> bool:
        return "password" in self.machine.stdout.split()

    def firewall_inspection(self) -> FirewallInspection:
        """The operator's firewall as firewall_inspect.sh reported it; its failure raised as
        running the script alone raises it."""
        assert self.firewall is not None, "the firewall was not read"
        if self.firewall.exit_status != 0:
            tail = " | ".join(self.firewall.stderr.strip().splitlines()[-5:])
            raise RemoteCommandError(self.node, "script firewall_inspect.sh", self.firewall.exit_status, tail)
        return parse_inspection(self.node, self.firewall.stdout)


async def read_joining_host(worker: SshSession, *, k3s_checksum: bool, operator_firewall: bool) -> JoiningHost:
    """The preflight's reads of the worker, in one command (see the module docstring)."""
    steps = [
        HostStep.script(script_path("host_facts.sh")),
        HostStep.command(["cat", JOURNAL_CA], check=False),
        HostStep.command(
            ["sh", "-c", "cat /etc/machine-id; test -s /etc/rancher/node/password && echo password"], check=False
        ),
    ]
    if k3s_checksum:
        steps.append(HostStep.command(["sh", "-c", f"sha256sum {K3S_BIN} 2>/dev/null | cut -d' ' -f1"], check=False))
    if operator_firewall:
        steps.append(HostStep.script(script_path("firewall_inspect.sh"), ["operator"], check=False))
    deadline = HOST_FACTS_DEADLINE_SECONDS + INSPECT_DEADLINE_SECONDS + 3 * READ_DEADLINE_SECONDS
    results = await run_steps(worker, steps, deadline=deadline)
    facts, journal_ca, machine = results[:3]
    rest = list(results[3:])
    checksum = rest.pop(0).stdout.strip() or None if k3s_checksum else None
    return JoiningHost(
        node=worker.target.node,
        facts=parse_host_facts(worker.target.node, facts.stdout),
        journal_ca=journal_ca,
        machine=machine,
        k3s_sha256=checksum,
        firewall=rest.pop(0) if operator_firewall else None,
    )


def _relay_results(progress: Progress) -> Callable[[str], None]:
    return lambda line: progress(line.removeprefix("result ")) if line.startswith("result ") else None


async def prepare_joining_host(worker: SshSession, ca_hash: str, pod_network: str, progress: Progress) -> None:
    """Journal that the host's k3s state is this cluster's from here on (a join resumed after an
    interruption must not mistake it for a foreign install), then prepare the host."""
    await run_steps(
        worker,
        [
            HostStep.command(
                ["sh", "-c", 'mkdir -p "${1%/*}" && printf "%s\\n" "$2" > "$1"', "-", JOURNAL_CA, ca_hash],
                what="writing the join journal",
            ),
            HostStep.script(script_path("node_prepare.sh"), [pod_network], on_line=_relay_results(progress)),
        ],
        deadline=READ_DEADLINE_SECONDS + PREPARE_DEADLINE_SECONDS,
    )


# Writes $HK3S_FILE_TEXT to the file $1 as root-only, atomically (a temporary file, then a
# rename), as the program's uploads do; the text comes in the environment, never on a command line.
_WRITE_PRIVATE_FILE = (
    'mkdir -p "${1%/*}" && umask 077 && printf "%s" "$HK3S_FILE_TEXT" > "$1.hk3s-upload" && '
    'chmod 600 "$1.hk3s-upload" && mv -f "$1.hk3s-upload" "$1"'
)


def private_file(path: str, text: str, what: str) -> HostStep:
    """A step that writes `text` to `path` on the host, readable by root only (a token, a config)."""
    return _private_file(path, text, what)


def _private_file(path: str, text: str, what: str) -> HostStep:
    return HostStep.command(["sh", "-c", _WRITE_PRIVATE_FILE, "-", path], what=what, env={"HK3S_FILE_TEXT": text})


@dataclass(frozen=True)
class AgentBinary:
    """The k3s binary the join installs: its SHA-256, and its gzipped bytes when the host's
    binary differs (None: nothing to upload)."""

    sha256: str | None
    packed: bytes | None


async def agent_binary(binary: K3sBinary, installed_sha256: str | None) -> AgentBinary:
    """Hash the binary and, when the host's differs, compress it: a second of the program's own
    work for tens of MB, done in threads (hashlib and zlib let go of the GIL), so the join starts
    it once preflight has read the host and uses it at the install."""
    want_sha = await asyncio.to_thread(binary.local_sha256)
    if binary.local_path is None or want_sha is None or installed_sha256 == want_sha:
        return AgentBinary(want_sha, None)
    return AgentBinary(want_sha, await asyncio.to_thread(gzipped_binary, binary.local_path, want_sha))


@dataclass(frozen=True)
class AgentInstalled:
    """What installing the agent reported: the host's clock before it, k3s_install.sh's results."""

    since: str
    results: dict[str, str]


async def upload_agent_binary(
    worker: SshSession, binary: K3sBinary, prepared: AgentBinary, progress: Progress
) -> AgentBinary:
    """Upload the binary when the host's differs (where k3s_install.sh takes it from); what is
    left to install: the same binary, nothing to upload."""
    if prepared.packed is not None:
        progress(f"uploading k3s {binary.version} ({len(prepared.packed) // 1_000_000} MB gzipped)")
        await worker.upload(prepared.packed, f"{K3S_BIN}.hk3s-upload.gz", deadline=INSTALL_DEADLINE_SECONDS, mode=0o644)
    return AgentBinary(prepared.sha256, None)


async def install_agent(
    worker: SshSession,
    *,
    binary: K3sBinary,
    prepared: AgentBinary,
    config_text: str,
    token_file: str,
    token: JoinToken | None,
    progress: Progress,
) -> AgentInstalled:
    """Upload the binary when the host's differs (`prepared`: agent_binary), then in one
    command: read the host's clock, write the token (when there is a new one) and the config,
    and run k3s_install.sh."""
    want_sha = (await upload_agent_binary(worker, binary, prepared, progress)).sha256
    steps = [HostStep.command(["date", "+%Y-%m-%d %H:%M:%S"])]
    if token is not None:
        steps.append(_private_file(token_file, token.value + "\n", f"writing {token_file}"))
    steps.append(_private_file(f"{CONFIG_PATH}.hk3s-new", config_text, f"writing {CONFIG_PATH}.hk3s-new"))
    steps.append(
        HostStep.script(
            script_path("k3s_install.sh"),
            ["agent", binary.version, want_sha or "-"],
            on_line=relay_install_results(progress),
        )
    )
    results = await run_steps(worker, steps, deadline=3 * READ_DEADLINE_SECONDS + INSTALL_DEADLINE_SECONDS)
    installed = parse_results(results[-1].stdout)
    # Where the script (re)started the agent, its log begins there: an agent it stopped may have
    # logged the failure this join retries after the clock read first.
    return AgentInstalled(since=installed.get("log_since", results[0].stdout.strip()), results=installed)


# The unit host_scripts/k3s_install.sh writes for a worker's agent.
AGENT_UNIT = "/etc/systemd/system/k3s-agent.service"


# The agent's kubelet client certificate: what the agent authenticates with once its one-time join
# token is spent (node_operations/join.py).
AGENT_CLIENT_CERT = "/var/lib/rancher/k3s/agent/client-kubelet.crt"

# On one line each: the host's machine-id; "agent" when the agent this program installed (its
# binary and unit) is there; the end of the agent's client certificate (seconds since the epoch),
# "missing" when there is none, "-" when it cannot be read (no openssl); the host's clock. Read-only.
_JOINED_HOST_PROBE = (
    'id=$(cat /etc/machine-id 2>/dev/null); echo "${id:--}"; '
    f"if [ -x {K3S_BIN} ] && [ -f {AGENT_UNIT} ]; then echo agent; else echo no-agent; fi; "
)
# The end of the agent's client certificate (seconds since the epoch; "missing" when there is none,
# "-" when it cannot be read), then the host's clock, one line each. Read-only.
_CLIENT_CERT_PROBE = (
    f"if [ ! -e {AGENT_CLIENT_CERT} ]; then echo missing; else "
    f"end=$(openssl x509 -enddate -noout -in {AGENT_CLIENT_CERT} 2>/dev/null | sed 's/^notAfter=//'); "
    'if [ -n "$end" ] && date -d "$end" +%s 2>/dev/null; then :; else echo -; fi; fi; date +%s'
)


async def joined_host_changed(worker: SshTarget, machine_id: str) -> str | None:
    """Why `worker` no longer runs the agent its node joined with, or None when it still does.

    A host rebuilt under the node's name (a fresh OS: no k3s, a new machine-id, a new node
    password) still matches the stack's inputs, so only the host itself can say that the join
    is gone. `machine_id` is the one recorded at the join ("" for a join recorded before it was
    kept: then only the agent's presence is checked). An agent whose client certificate expired or
    is gone cannot authenticate again: its join is gone as well. A host that cannot be reached says
    nothing here (None): the run's own checks name it."""
    try:
        async with open_session(worker, shared=True) as session:
            result = await session.run(["sh", "-c", _JOINED_HOST_PROBE + _CLIENT_CERT_PROBE], deadline=20, check=False)
    except SshError:
        return None
    lines = result.stdout.split()
    if result.exit_status != 0 or len(lines) != 4:
        return None
    host_id, agent, cert_end, now = lines
    if machine_id and host_id not in (machine_id, "-"):
        return (
            f"the host at {worker.address} is another machine than the one joined as {worker.node} "
            f"(machine-id {host_id}, joined as {machine_id})"
        )
    if agent != "agent":
        return f"the host at {worker.address} no longer has the k3s agent it joined with ({K3S_BIN}, {AGENT_UNIT})"
    return _client_cert_dead(cert_end, now)


async def client_certificate_dead(worker: SshSession) -> str | None:
    """Why the agent on `worker` can no longer authenticate by its client certificate (expired or
    missing), or None (valid, or unreadable: then nothing is claimed)."""
    result = await worker.run(["sh", "-c", _CLIENT_CERT_PROBE], deadline=20, check=False)
    lines = result.stdout.split()
    return _client_cert_dead(*lines) if result.exit_status == 0 and len(lines) == 2 else None


def _client_cert_dead(cert_end: str, now: str) -> str | None:
    """Why the agent can no longer authenticate to the server, or None. Its join token was spent at
    the join, so its client certificate is all it has: k3s's agent presents it with that token at
    every start (pkg/agent/config/config.go), the server refuses an expired one, and k3s renews an
    agent's certificate only through that authenticated request. Only a rejoin with a fresh token
    brings such a worker back."""
    dead = "the agent cannot authenticate to the server any more (its join token is spent), so its Node stays NotReady"
    if cert_end == "missing":
        return f"its agent's client certificate {AGENT_CLIENT_CERT} is missing: {dead}"
    if not (cert_end.isdigit() and now.isdigit()) or int(cert_end) > int(now):
        return None
    expired = datetime.fromtimestamp(int(cert_end), UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"its agent's client certificate {AGENT_CLIENT_CERT} expired at {expired}: {dead}"
