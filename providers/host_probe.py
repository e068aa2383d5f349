"""HostProbe: reads a host's facts over SSH and records its SSH host key.

It changes nothing on the host. Its outputs feed preflight and network-mode
selection, and its `host_key` output is the key every later login to the node
is pinned to: the key `hk3s:ssh.host_keys` records, the key the program gave a
Hetzner server it created (cloud-init `ssh_keys`), the key an earlier run recorded,
or else the key the host presents at first contact. Recording on first use is
refused in a non-interactive run (CI, the operator API and CLI, any run whose `pulumi`
has no terminal on its standard input) unless the stack sets
`hk3s:ssh.trust_on_first_use`: nobody would see the key it accepts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from node_operations.host_facts import FIRST_CONTACT_SECONDS, HostFacts, ObservedHost, read_host_facts
from node_operations.refusal import tagged
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    pin_recorded_host_key,
    progress,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeInputs, is_known, known
from remote_access.api_forward import EngineNotFoundError, engine_pid, stdin_is_terminal
from remote_access.ssh import FirstContact, SshError

FACT_OUTPUTS = tuple(field.name for field in dataclasses.fields(HostFacts))
# Set in a run nobody watches: CI systems set CI, the operator API and CLI set HK3S_NON_INTERACTIVE.
NON_INTERACTIVE_ENV = ("HK3S_NON_INTERACTIVE", "CI")
FIRST_USE_LINE = "recorded SSH host key on first use: "


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostProbeInputs(NodeInputs):
    """How to reach the host, and how its first contact goes."""

    expected_address: pulumi.Input[str | None] = None
    """A Hetzner network's address: the facts wait for it, so the network decision sees it."""
    first_contact_seconds: pulumi.Input[float] = FIRST_CONTACT_SECONDS
    created_by_program: pulumi.Input[bool] = False
    """A server the program created gets its login key from cloud-init during the first boot."""
    trust_on_first_use: pulumi.Input[bool] = False


def non_interactive_run() -> str | None:
    """Why this run counts as one nobody watches (the variable that says so, or the engine's
    standard input that is no terminal), or None when a person runs it at a terminal.

    A run started with no terminal (a cron job, a script's `pulumi up --yes </dev/null`, a
    service) is unattended even when it forgets to say so: nobody reads the key it records."""
    for name in NON_INTERACTIVE_ENV:
        if os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no"):
            return f"{name} is set"
    try:
        engine = engine_pid()
    except EngineNotFoundError:
        return "this system tells no process's terminal"
    if not stdin_is_terminal(engine):
        return "the run was started with no terminal on its standard input"
    return None


def first_use_refusal(props: dict[str, Any]) -> str | None:
    """Why the first contact with this host may not record its key, or None when it may
    (a key is pinned, the stack opts in, or a person runs `pulumi up`)."""
    recorded = props.get("recorded_host_key")
    if recorded or not is_known(recorded) or props.get("trust_on_first_use"):
        return None
    marker = non_interactive_run()
    if marker is None:
        return None
    node = props.get("node")
    return tagged(
        f"{node}: no SSH host key is pinned for {props.get('address')}, and this run is non-interactive "
        f"({marker}), so nobody would see the key a first contact accepts; whoever sits on the path "
        f"could pose as the host. Pin it: set hk3s:ssh.host_keys.{node} to the host's key read over a channel "
        "you trust (its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), or accept this risk with "
        "hk3s:ssh.trust_on_first_use: true (every key recorded that way is listed in the run's result)",
        "host-key",
    )


def _outputs(props: dict[str, Any], observed: ObservedHost) -> dict[str, Any]:
    facts = dataclasses.asdict(observed.facts)
    return {
        **props,
        **facts,
        "default_route_interface": observed.facts.default_route_interface,
        "host_key": observed.host_key,
    }


class HostProbeProvider(NodeProvider):
    """Dynamic provider of `HostProbe`."""

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        checked = pin_recorded_host_key(olds, dict(news))
        failures = check_connection_inputs(news)
        # Only a host this stack has never logged in to: an adopted probe (olds) carries its key.
        refusal = None if olds.get("host_key") else first_use_refusal(checked)
        if refusal:
            failures.append(CheckFailure("recorded_host_key", refusal))
        return CheckResult(checked, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # How patient a first contact is matters only at creation.
        return diff_inputs(
            olds,
            news,
            replace_on=self.replace_on,
            ignore=HostProbeInputs.names(
                "recorded_host_key", "first_contact_seconds", "created_by_program", "trust_on_first_use"
            ),
        )

    def _observe(self, props: dict[str, Any], first: bool = False) -> ObservedHost:
        inputs = HostProbeInputs.from_props(props)
        node = str(known(inputs.login.node))
        first_contact = (
            FirstContact(
                seconds=float(known(inputs.first_contact_seconds) or FIRST_CONTACT_SECONDS),
                progress=lambda line: progress(node, line),
                key_may_be_pending=bool(known(inputs.created_by_program)),
            )
            if first
            else None
        )
        refusal = first_use_refusal(props) if first else None
        if refusal:
            raise SshError(node, refusal.removeprefix(f"{node}: "))
        expected = known(inputs.expected_address) or None
        observed = run_operation(read_host_facts(ssh_target(inputs.login), expected, first_contact=first_contact))
        if observed.host_key_newly_recorded:
            progress(node, f"{FIRST_USE_LINE}{observed.host_key} (pin it with hk3s:ssh.host_keys.{node})")
        return observed

    def create(self, props: dict[str, Any]) -> CreateResult:
        login = HostProbeInputs.from_props(props).login
        node, address = str(known(login.node)), str(known(login.address))
        progress(node, f"reading host facts from {address}")
        observed = self._observe(props, first=True)
        # Deterministic id: a create retried after a crash adopts the same host.
        return CreateResult(id_=f"{node}@{address}", outs=_outputs(props, observed))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        pinned = dict(props)
        pinned["recorded_host_key"] = props.get("recorded_host_key") or props.get("host_key")
        observed = self._observe(pinned)
        return ReadResult(id_=id_, outs=_outputs(props, observed))

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        observed = self._observe(news)
        return UpdateResult(outs=_outputs(news, observed))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # Reading facts left nothing on the host; forgetting them is all there is.
        return None


class HostProbe(Resource, module="hk3s", name="HostProbe"):
    """Facts of one host and its pinned SSH host key."""

    node: pulumi.Output[str]
    host_key: pulumi.Output[str]
    os_id: pulumi.Output[str]
    os_version_id: pulumi.Output[str]
    ipv4_addresses: pulumi.Output[list[str]]
    ipv4_routes: pulumi.Output[list[str]]
    default_route_interface: pulumi.Output[str | None]
    kubernetes_state: pulumi.Output[list[str]]

    def __init__(self, resource_name: str, inputs: HostProbeInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        props: dict[str, Any] = {
            **inputs.props(),
            "private_key": pulumi.Output.secret(inputs.login.private_key),
            **{name: None for name in (*FACT_OUTPUTS, "default_route_interface", "host_key")},
        }
        super().__init__(HostProbeProvider(), resource_name, props, opts)
