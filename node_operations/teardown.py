"""A stack's teardown on one host: k3s, its data and the program's files wiped.

Only a teardown the operator allowed (hk3s:cluster.teardown: allowed, applied by an
`up`) reaches this: it moves no copy of any volume, the data goes with the cluster.
A host that cannot be reached does not hold the rest of the teardown back: it is
reported by name with what to remove on it by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from host_scripts import script_path
from node_operations.k3s_install import parse_results
from remote_access.ssh import RemoteCommandError, SshError, SshTarget, open_session

WIPE_DEADLINE_SECONDS = 300.0
# What the wipe removes, for a person finishing it on a host the program could not reach.
BY_HAND = (
    "systemctl disable --now k3s k3s-agent; kill the containerd-shim processes; "
    "rm -rf /etc/rancher/k3s /var/lib/rancher/k3s /var/lib/kubelet /run/k3s /usr/local/bin/k3s "
    "/etc/systemd/system/k3s*.service /var/lib/hk3s /etc/hk3s /etc/modules-load.d/hk3s.conf "
    "/etc/sysctl.d/90-hk3s.conf, and the program's host firewall (nft delete table inet hk3s_node, the "
    "units hk3s-host-firewall and hk3s-dnat-guard; with UFW its hk3s rules; with firewalld the zones hk3s "
    "and hk3s-fabric) — or rebuild the host"
)


class WipeError(RuntimeError):
    """A reachable host the wipe could not finish; running the destroy again retries it."""


@dataclass(frozen=True)
class WipeOutcome:
    node: str
    removed: tuple[str, ...] = ()
    # Why the host could not be reached (the wipe is then left to a person), or None.
    unreachable: str | None = None

    def report(self) -> str:
        if self.unreachable is not None:
            return f"could not be reached ({self.unreachable}); remove by hand on it: {BY_HAND}"
        return f"k3s wiped ({len(self.removed)} paths removed)"


async def wipe_node(target: SshTarget, progress: Callable[[str], None]) -> WipeOutcome:
    """Stop and uninstall k3s, kill every container, remove k3s's and the program's files."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            session = await stack.enter_async_context(open_session(target))
        except SshError as error:
            return WipeOutcome(target.node, unreachable=str(error))
        progress("wiping k3s, its data and the program's files")
        try:
            result = await session.run_script(script_path("k3s_wipe.sh"), deadline=WIPE_DEADLINE_SECONDS)
        except RemoteCommandError as error:
            raise WipeError(f"{target.node}: the wipe did not finish ({error}); run the destroy again") from None
        results = parse_results(result.stdout)
        return WipeOutcome(target.node, removed=tuple(results.get("removed", "").split()))
    raise AssertionError("unreachable")  # pragma: no cover - the context manager always returns above
