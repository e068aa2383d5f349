"""A stack's teardown on one host: k3s, its data and the program's files wiped.

Only a teardown the operator allowed (hk3s:cluster.teardown: allowed, applied by an
`up`) reaches this: it moves no copy of any volume, the data goes with the cluster.
A host that cannot be reached does not hold the rest of the teardown back: it is
reported by name with what to remove on it by hand.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from host_scripts import script_path
from node_operations.k3s_install import parse_results
from remote_access.ssh import RemoteCommandError, SshError, SshSession, SshTarget, open_session

WIPE_DEADLINE_SECONDS = 300.0
# What a person removes on a host the program could not reach, besides what the wipe script
# lists: the program's host firewall (HostFirewall removes it on a reachable host) and its state.
FIREWALL_BY_HAND = (
    "rm -rf /var/lib/hk3s /etc/hk3s, and the program's host firewall (nft delete table inet hk3s_node, the "
    "units hk3s-host-firewall and hk3s-dnat-guard; with UFW its hk3s rules; with firewalld the zones hk3s "
    "and hk3s-fabric) — or rebuild the host"
)


@functools.cache
def by_hand() -> str:
    """What to remove by hand on a host the wipe could not reach: the wipe script's own list
    (`k3s_wipe.sh --by-hand`, which changes nothing), so the two never disagree."""
    listed = subprocess.run(
        ["bash", str(script_path("k3s_wipe.sh")), "--by-hand"], capture_output=True, text=True, check=True, timeout=30
    )
    return f"{parse_results(listed.stdout)['by_hand']}; {FIREWALL_BY_HAND}"


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
            return f"could not be reached ({self.unreachable}); remove by hand on it: {by_hand()}"
        return f"k3s wiped ({len(self.removed)} paths removed)"


async def wipe_node(
    target: SshTarget, progress: Callable[[str], None], session: SshSession | None = None
) -> WipeOutcome:
    """Stop and uninstall k3s, kill every container, remove k3s's and the program's files;
    through `session` when the caller is logged in already."""
    async with contextlib.AsyncExitStack() as stack:
        if session is None:
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
