"""A fenced Hetzner worker powered on before its fence is lifted (`ClusterStack.unfence`).

The fence of a Hetzner worker powered its server off through the Hetzner API. A fence is lifted
by a rejoin, which needs the host answering over SSH, and the run that lifts it first checks that
every recorded node it will touch answers. So `unfence` powers the server on through the same API
(`poweron`, the action waited for) and waits until the host answers over SSH before it removes the
fence entry and runs `up`. A plain `pulumi up` with the entry removed does not power anything on:
the operator powers the server on first (Hetzner's console, `hcloud server poweron`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping

from cluster_settings.models import StackSettings
from node_operations.worker_removal import worker_answers
from remote_access.hetzner_api import DEFAULT_ENDPOINT, HetznerAccess, HetznerApiError, power_on
from remote_access.ssh import SshTarget

from .errors import StackError

# A Hetzner server boots and starts sshd within a minute or two.
BOOT_WAIT_SECONDS = 180.0
POLL_SECONDS = 2.0
HCLOUD_TOKEN = "hcloud:token"
HCLOUD_ENDPOINT = "hcloud:endpoint"


def fenced_hetzner_server(settings: StackSettings, stack: str, name: str) -> str | None:
    """The Hetzner server (id or name) of fenced worker `name`, or None when it has none (or is
    not fenced): a server the program created is named as components/machine.py names it."""
    if name not in settings.fences:
        return None
    worker = next((w for w in settings.all_workers() if w.name == name), None)
    if worker is None:
        return None
    if worker.kind == "hetzner":
        # Imported here: the components module brings the Hetzner SDK, which no other command
        # of the operator CLI needs (each `scripts/hk3s` line is a new process).
        from components.hetzner_project import hetzner_name  # noqa: PLC0415

        return hetzner_name(settings.cluster.name, stack, worker.name)
    return str(worker.hcloud_server) if worker.hcloud_server else None


def hetzner_access(config: Callable[[str], str | None], env: Mapping[str, str]) -> HetznerAccess:
    """The token and endpoint where the Hetzner provider reads them: the stack's hcloud:token and
    hcloud:endpoint (`config`), else HCLOUD_TOKEN and HCLOUD_ENDPOINT in the runs' environment
    (`env`, then this process's)."""
    environment = {**os.environ, **env}
    token = config(HCLOUD_TOKEN) or environment.get("HCLOUD_TOKEN")
    if not token:
        raise StackError(
            f"the worker's Hetzner server is powered on through the Hetzner API before its fence is lifted, but "
            f"there is no token: pulumi config set --secret {HCLOUD_TOKEN} <token> (or set HCLOUD_TOKEN)"
        )
    endpoint = config(HCLOUD_ENDPOINT) or environment.get("HCLOUD_ENDPOINT") or DEFAULT_ENDPOINT
    return HetznerAccess(token, endpoint)


async def power_on_and_wait(
    access: HetznerAccess,
    server: str,
    worker: SshTarget,
    say: Callable[[str], None],
    boot_wait: float = BOOT_WAIT_SECONDS,
) -> None:
    """Power `server` on when it is off, then wait until `worker` answers over SSH."""
    try:
        state, action = await power_on(access, server, say)
    except HetznerApiError as error:
        raise StackError(f"{worker.node}: {error}; its fence stays") from None
    if action is None:
        say(f"{worker.node}: Hetzner server {state.name} is {state.status}: nothing to power on")
    else:
        say(f"{worker.node}: Hetzner server {state.name} powered on ({state.status}); waiting for SSH")
    deadline = time.monotonic() + boot_wait
    while (silent := await worker_answers(worker)) is not None:
        if time.monotonic() > deadline:
            raise StackError(
                f"{worker.node}: its Hetzner server {state.name} is {state.status}, but the host did not answer over "
                f"SSH within {boot_wait:.0f} s ({silent}); its fence stays. Check its console, then unfence it again"
            )
        await asyncio.sleep(POLL_SECONDS)
    say(f"{worker.node} answers over SSH")


def power_on_fenced(
    settings: StackSettings,
    name: str,
    *,
    stack: str,
    targets: list[SshTarget],
    config: Callable[[str], str | None],
    env: Mapping[str, str],
    say: Callable[[str], None],
) -> None:
    """Before `name`'s fence is lifted: its Hetzner server (if it has one) on and answering."""
    server = fenced_hetzner_server(settings, stack, name)
    if server is None:
        return
    worker = next((t for t in targets if t.node == name), None)
    if worker is None:
        raise StackError(f"{name} has not joined yet: there is no fence of it to lift")
    asyncio.run(power_on_and_wait(hetzner_access(config, env), server, worker, say))
