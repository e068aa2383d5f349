"""pytest fixtures for real lab hosts (see :mod:`lab.hosts`).

Use from a conftest (or a test module)::

    from lab.pytest_fixtures import lab, fresh_lab  # noqa: F401

``lab`` is module-scoped: one set of bridges per test module (the base tree is
cached for all), torn down when the module ends whatever happened (failures,
Ctrl-C, SIGTERM).
It skips, with the reason, when the machine cannot run lab hosts (not root,
no systemd-nspawn, no debootstrap, ...).  Tests add their hosts with
``lab.add_host(HostSpec(...))`` and ``lab.wait_ssh_ready([...])``.

``_no_stack_process_left`` (automatic, once per test session) ends every process that
the session's stacks left running when the session ends, and reports each (see
:func:`end_leftover_processes`).

Environment:

* ``HK3S_LAB_CACHE``: where base trees are kept (default /var/cache/hk3s-lab).
* ``HK3S_LAB_RUN``: where per-lab state goes (default /var/tmp/hk3s-lab).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from lab.hosts import DEFAULT_CACHE_DIR, Lab, LabError, missing_prerequisites, reap_stale_labs
from lab.stack_processes import StackProcess, end_processes, processes_under

log = logging.getLogger("lab.pytest_fixtures")


def lab_skip_reason() -> str | None:
    """Why lab hosts cannot run here, or None."""
    missing = missing_prerequisites()
    if missing:
        return "lab hosts need root, systemd-nspawn and debootstrap: " + "; ".join(missing)
    return None


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so fixture finalizers (teardown) still run."""
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt("SIGTERM")

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _make_lab() -> Iterator[Lab]:
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    with _sigterm_as_interrupt():
        for stale in reap_stale_labs():
            log.warning("tore down stale lab %s (its owner process is gone)", stale)
        the_lab = Lab(cache_dir=DEFAULT_CACHE_DIR)
        try:
            try:
                the_lab.ensure_base()
            except LabError as err:
                pytest.fail(f"could not build the lab base tree: {err}")
            yield the_lab
        finally:
            the_lab.teardown()


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """One lab per test module (its tests share the hosts they add); always torn down.
    Per module, not per session: a lab holds at most MAX_HOSTS hosts, fewer than the
    whole suite adds."""
    yield from _make_lab()


@pytest.fixture
def fresh_lab() -> Iterator[Lab]:
    """A lab of its own for one test; always torn down."""
    yield from _make_lab()


class LeftoverProcessWarning(pytest.PytestWarning):
    """Processes of the session's stacks were still running when the session ended."""


def end_leftover_processes(directory: Path) -> list[StackProcess]:
    """End every process that still belongs to `directory` (lab/stack_processes.py) and warn,
    naming each: a run left it behind (a killed `pulumi up`'s language host or plugin, a
    provider process of a release that did not end with its engine). Returns them."""
    leftovers = processes_under(directory)
    if not leftovers:
        return []
    unended = end_processes(leftovers)
    listing = "\n".join(f"  {process}" for process in leftovers)
    message = f"{len(leftovers)} process(es) of the stacks under {directory} were still running; ended:\n{listing}"
    if unended:
        message += "\nstill running after SIGKILL: " + ", ".join(str(process.pid) for process in unended)
    warnings.warn(LeftoverProcessWarning(message), stacklevel=2)
    return leftovers


@pytest.fixture(scope="session", autouse=True)
def _no_stack_process_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite ends every process it started. Every stack of a test lives under the session's
    base temporary directory (one per pytest run, and one per worker with pytest-xdist), so what
    still runs from there when the session ends is this session's and nobody else's: another
    session's runs (another checkout's, another worker's) live under their own and are left
    alone. Automatic and session-wide: set up before any session fixture a test asks for, so it
    runs after their teardowns."""
    yield
    end_leftover_processes(tmp_path_factory.getbasetemp())
