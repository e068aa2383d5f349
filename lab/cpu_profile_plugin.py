"""pytest plugin of the CI profile (lab/cpu_profile.py), inert unless HK3S_CPU_PROFILE_EVENTS
names the events file: then every pytest process (each xdist worker, or the one process
without xdist) marks itself and what it starts with HK3S_CPU_ACCOUNT=tests:<worker> and
appends a line "monotonic time, account, pid, module" to the events file whenever it starts a
test of another module than its previous one."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from lab.cpu_profile import ACCOUNT_VAR, EVENTS_VAR

_current: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(EVENTS_VAR):
        # An xdist worker by its name; with workers, the process that starts them is the controller.
        controller = "controller" if getattr(config.option, "numprocesses", None) else "main"
        worker = os.environ.get("PYTEST_XDIST_WORKER", controller)
        _current["account"] = f"tests:{worker}"
        # Inherited by every process the tests start from now on.
        os.environ[ACCOUNT_VAR] = _current["account"]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    events = os.environ.get(EVENTS_VAR)
    module = item.nodeid.split("::", 1)[0]
    if events and "account" in _current and _current.get("module") != module:
        _current["module"] = module
        # One short line in append mode: the kernel writes it whole, beside the other workers'.
        with open(events, "a") as out:
            out.write(f"{time.monotonic()}\t{_current['account']}\t{os.getpid()}\t{module}\n")
    yield
