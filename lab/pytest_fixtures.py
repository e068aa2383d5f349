"""pytest fixtures for real lab hosts (see :mod:`lab.hosts`).

Use from a conftest (or a test module)::

    from lab.pytest_fixtures import lab, fresh_lab  # noqa: F401

``lab`` is module-scoped: one set of bridges per test module (the base tree is
cached for all), torn down when the module ends whatever happened (failures,
Ctrl-C, SIGTERM).
It skips, with the reason, when the machine cannot run lab hosts (not root,
no systemd-nspawn, no debootstrap, ...).  Tests add their hosts with
``lab.add_host(HostSpec(...))`` and ``lab.wait_ssh_ready([...])``.

Environment:

* ``HK3S_LAB_CACHE``: where base trees are kept (default /var/cache/hk3s-lab).
* ``HK3S_LAB_RUN``: where per-lab state goes (default /var/tmp/hk3s-lab).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from lab.hosts import DEFAULT_CACHE_DIR, Lab, LabError, missing_prerequisites, reap_stale_labs

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
