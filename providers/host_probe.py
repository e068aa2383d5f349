"""HostProbe: reads a host's facts over SSH and records its SSH host key.

It changes nothing on the host. Its outputs feed preflight and network-mode
selection, and its `host_key` output is the key every later login to the node
is pinned to: the key `hk3s:ssh.host_keys` records, the key the program gave a
Hetzner server it created (cloud-init `ssh_keys`), the key an earlier run recorded,
or else the key the host presents at first contact. Recording on first use is
refused in a non-interactive run (CI, the operator API and CLI) unless the stack
sets `hk3s:ssh.trust_on_first_use`: nobody would see the key it accepts.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, UpdateResult

from node_operations.host_facts import HostFacts, ObservedHost, read_host_facts
from node_operations.refusal import tagged
from providers.base import (
    NodeProvider,
    check_connection_inputs,
    diff_inputs,
    is_known,
    pin_recorded_host_key,
    progress,
    run_operation,
    ssh_target,
)
from providers.inputs import NodeLogin
from remote_access.ssh import FirstContact, SshError

# How long the first contact with a host waits for SSH (and cloud-init) by default.
FIRST_CONTACT_SECONDS = 300.0
FACT_OUTPUTS = tuple(field.name for field in dataclasses.fields(HostFacts))
# Set in a run nobody watches: CI systems set CI, the operator API and CLI set HK3S_NON_INTERACTIVE.
NON_INTERACTIVE_ENV = ("HK3S_NON_INTERACTIVE", "CI")
FIRST_USE_LINE = "recorded SSH host key on first use: "


def non_interactive_run() -> str | None:
    """The variable that marks this run as one nobody watches, or None."""
    for name in NON_INTERACTIVE_ENV:
        if os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no"):
            return name
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
        f"({marker} is set), so nobody would see the key a first contact accepts; whoever sits on the path "
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
            ignore=("recorded_host_key", "first_contact_seconds", "created_by_program", "trust_on_first_use"),
        )

    def _observe(self, props: dict[str, Any], first: bool = False) -> ObservedHost:
        node = str(props["node"])
        first_contact = (
            FirstContact(
                seconds=float(props.get("first_contact_seconds") or FIRST_CONTACT_SECONDS),
                progress=lambda line: progress(node, line),
                # A server the program created gets its login key from cloud-init during the first boot.
                key_may_be_pending=bool(props.get("created_by_program")),
            )
            if first
            else None
        )
        refusal = first_use_refusal(props) if first else None
        if refusal:
            raise SshError(node, refusal.removeprefix(f"{node}: "))
        observed = run_operation(
            read_host_facts(ssh_target(props), props.get("expected_address") or None, first_contact=first_contact)
        )
        if observed.host_key_newly_recorded:
            progress(
                props["node"],
                f"{FIRST_USE_LINE}{observed.host_key} (pin it with hk3s:ssh.host_keys.{props['node']})",
            )
        return observed

    def create(self, props: dict[str, Any]) -> CreateResult:
        progress(props["node"], f"reading host facts from {props['address']}")
        observed = self._observe(props, first=True)
        # Deterministic id: a create retried after a crash adopts the same host.
        return CreateResult(id_=f"{props['node']}@{props['address']}", outs=_outputs(props, observed))

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

    def __init__(
        self,
        resource_name: str,
        *,
        login: NodeLogin,
        expected_address: pulumi.Input[str | None] = None,
        first_contact_seconds: float = FIRST_CONTACT_SECONDS,
        created_by_program: bool = False,
        trust_on_first_use: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props: dict[str, Any] = {
            **login.props(),
            "private_key": pulumi.Output.secret(login.private_key),
            "expected_address": expected_address,
            "first_contact_seconds": first_contact_seconds,
            "created_by_program": created_by_program,
            "trust_on_first_use": trust_on_first_use,
            **{name: None for name in (*FACT_OUTPUTS, "default_route_interface", "host_key")},
        }
        super().__init__(HostProbeProvider(), resource_name, props, opts)
