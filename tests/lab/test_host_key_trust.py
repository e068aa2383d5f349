"""Host keys in a run nobody watches: an `up` through the operator CLI (`--yes`, stdin
no terminal) with an existing host whose key nobody pinned is refused, naming the
host and the settings; with `hk3s:ssh.trust_on_first_use` it goes ahead and the key it
recorded is in the `--json` result and the text summary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from lab.hosts import Host, Lab
from lab.stack_harness import (
    CliRun,
    LabStack,
    base_config,
    server_spec,
    skip_without_lab_binaries,
    worker_spec,
)

pytestmark = pytest.mark.lab


def hk3s(stack: LabStack, *args: str) -> CliRun:
    return stack.hk3s(*args, timeout=900)


def host_public_keys(host: Host) -> set[str]:
    """The host's own SSH host keys, read from its file system (the channel a person trusts)."""
    return {" ".join(path.read_text().split()[:2]) for path in (host.root / "etc/ssh").glob("ssh_host_*_key.pub")}


def test_an_unpinned_host_is_refused_without_the_opt_in_and_listed_with_it(lab: Lab, tmp_path: Path) -> None:
    skip_without_lab_binaries()
    server = lab.add_host(server_spec("tk-server"))
    worker = lab.add_host(worker_spec("tk-worker"))
    lab.wait_ssh_ready([server, worker])
    stack = LabStack(tmp_path)
    pinned = {server.name: " ".join(server.ssh_host_public_key.split()[:2])}
    stack.write_config(base_config(lab, server, [worker], ssh={"trust_on_first_use": False, "host_keys": pinned}))

    refused = hk3s(stack, "--json", "up", "--yes")
    assert refused.returncode == 3, refused.stderr[-3000:]
    error = json.loads(refused.stdout)
    assert error["error"] == "RefusedError", error
    text = json.dumps(error)
    assert f"tk-worker: no SSH host key is pinned for {worker.public_ip}" in text
    assert "hk3s:ssh.host_keys.tk-worker" in text and "hk3s:ssh.trust_on_first_use" in text
    assert "HK3S_NON_INTERACTIVE is set" in text
    # The worker was never logged in to: no k3s, no preparation.
    assert not (worker.root / "etc/rancher/k3s/config.yaml").exists()
    assert not (worker.root / "var/lib/hk3s/journal").exists()

    stack.write_config(base_config(lab, server, [worker], ssh={"trust_on_first_use": True, "host_keys": pinned}))
    accepted = hk3s(stack, "--json", "up", "--yes")
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    result = json.loads(accepted.stdout)
    recorded = result["host_keys_recorded"]
    assert list(recorded) == ["tk-worker"], recorded  # the pinned server is not listed
    assert " ".join(recorded["tk-worker"].split()[:2]) in host_public_keys(worker)

    summary = hk3s(stack, "up", "--yes")
    assert summary.returncode == 0, summary.stderr[-3000:]
    # Recorded once: the next run pins it and lists nothing.
    assert "recorded on first use" not in summary.stdout


def test_the_host_key_given_in_user_data_is_replaced_after_the_first_pinned_login(lab: Lab) -> None:
    """A Hetzner server the program creates gets its first host key through cloud-init's
    user_data, which the metadata service serves to anything on the server for its whole life.
    The node's first resource (NodeLoginKey), once logged in pinned to that key, puts in its place
    one the program made beforehand and keeps only in the state (HostKeyPair), and pins it from
    then on: the host presents only the new key, a login pinned to the old one is refused as an
    impostor, and a create retried after a crash adopts the replacement. The lab host plays the
    created server: its own key is the one "given in user_data" (the lab cannot boot a machine
    through Hetzner's cloud-init); sshd, the files and the reload are real."""
    from providers.host_key_pair import generate_host_key  # noqa: PLC0415
    from providers.inputs import NodeLogin  # noqa: PLC0415
    from providers.login_key import NodeLoginKeyInputs, NodeLoginKeyProvider  # noqa: PLC0415
    from remote_access.ssh import HostKeyChangedError, SshTarget, open_session  # noqa: PLC0415

    host = lab.add_host(worker_spec("tk-rekey"))
    lab.wait_ssh_ready([host])
    first = " ".join(host.ssh_host_public_key.split()[:2])
    assert host_public_keys(host) >= {first}
    private, public = generate_host_key()
    assert host.public_ip
    login = NodeLogin(
        node=host.name,
        address=host.public_ip,
        private_key=lab.ssh_private_key_path.read_text(),
        recorded_host_key=first,
    )
    props = NodeLoginKeyInputs(
        login=login,
        authorized_by="program",
        replacement_host_key=private,
        replacement_host_public_key=public,
    ).props()
    created = NodeLoginKeyProvider().create(props)
    assert created.outs is not None
    assert created.outs["host_key"] == " ".join(public.split()[:2])
    assert created.outs["replaced_host_key"] == first
    assert host_public_keys(host) == {" ".join(public.split()[:2])}

    def login_pinned_to(key: str) -> str:
        async def scenario() -> str:
            target = SshTarget(
                node=host.name,
                address=str(host.public_ip),
                private_key=lab.ssh_private_key_path.read_text(),
                recorded_host_key=key,
            )
            async with open_session(target) as session:
                return (await session.run(["true"], deadline=30)).stdout

        return asyncio.run(scenario())

    login_pinned_to(public)
    with pytest.raises(HostKeyChangedError):
        login_pinned_to(first)
    # A create retried (a crash after the switch, before the state kept it) adopts it.
    again = NodeLoginKeyProvider().create(props)
    assert again.outs is not None and again.outs["host_key"] == created.outs["host_key"]
    # The next run's check pins the replacement, not the key the stack still names as given.
    checked = NodeLoginKeyProvider().check(created.outs, props)
    assert checked.inputs["recorded_host_key"] == created.outs["host_key"]
