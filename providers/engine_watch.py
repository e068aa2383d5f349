"""A dynamic provider process ends with the Pulumi engine that started it.

The rule: once the engine is gone (a `pulumi up` killed with SIGKILL, a CI job cancelled, a
machine's session closed), its provider processes exit at once, with their SSH logins, instead
of idling forever. Nothing they could still do would be recorded: the engine that keeps the
state is gone, and the next run finds each host where it was left (every host change is
journaled and resumable, as after a crash).

Why the engine does not end them itself: it starts each provider in a process group of its own
(Pulumi's `cmdutil.RegisterProcessGroup`) and ends that group only when it shuts down in order,
so a signal that kills the engine never reaches them. Why this process does not watch its
parent: on Linux the engine starts the `pulumi-resource-pulumi-python` shell script, which runs
`python -m pulumi.dynamic` as its child without `exec`; the parent is that shell, which lives
on as long as this process does. What marks the engine's end exactly is the provider's stdin:
the engine starts every plugin with a pipe as stdin (`cmd.StdinPipe()`) whose writing end only
the engine holds and never closes while it runs (Go opens it close-on-exec, so no other process
inherits it), and the kernel closes it when the engine ends, however it ends. The pipe then
hangs up, which `poll` reports without reading anything from it.
"""

from __future__ import annotations

import os
import select
import stat
import threading
from types import ModuleType

# The module `python -m pulumi.dynamic` runs as: the SDK's provider host, the only process the
# watch belongs in (the program and the test suite import the providers too).
PROVIDER_HOST = "pulumi.dynamic.__main__"
# What the provider process exits with when its engine is gone; nobody waits for it but the
# launcher script, which passes it on to nobody.
ENGINE_GONE_EXIT_CODE = 1

_started = False
_started_lock = threading.Lock()


def exit_with_the_engine(host: ModuleType | None, engine_pipe: int = 0) -> bool:
    """In the SDK's provider host (`host` is its `__main__`) started with a pipe as stdin
    (`engine_pipe`), start a thread that ends the process when the engine's end of that pipe
    closes. Returns whether the watch runs. Elsewhere, or on a stdin that is no pipe (a provider
    host started by hand), nothing is watched and nothing ever ends because of its stdin."""
    global _started  # noqa: PLW0603 - one watch per process
    spec = getattr(host, "__spec__", None)
    if host is None or spec is None or spec.name != PROVIDER_HOST:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(engine_pipe).st_mode):
            return False
    except OSError:
        return False
    with _started_lock:
        if not _started:
            threading.Thread(
                target=_exit_when_hung_up, args=(engine_pipe,), name="hk3s-engine-watch", daemon=True
            ).start()
            _started = True
    return True


def _exit_when_hung_up(engine_pipe: int) -> None:
    # Registered for no event: poll still reports a hang-up (and errors) and never data, so
    # nothing is read from the pipe and bytes written to it wake nobody.
    poller = select.poll()
    poller.register(engine_pipe, 0)
    while True:
        for _fd, events in poller.poll():
            if events & select.POLLNVAL:
                return  # the descriptor was closed inside this process: no engine's pipe to watch
            if events & (select.POLLHUP | select.POLLERR):
                # os._exit, not sys.exit: the gRPC worker threads in an operation are not daemon
                # threads and would hold an orderly exit until their operation finished.
                os._exit(ENGINE_GONE_EXIT_CODE)
