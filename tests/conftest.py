"""Checks that hold for every test, whichever process runs it (`make test` runs two, pytest-xdist)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from flywheel.trainer import watchdog


@pytest.fixture(autouse=True)
def _no_progress_watchdog_left_running() -> Iterator[None]:
    """A trainer's progress watchdog still running after its test ends os._exit()s the test process once its
    allowance (600 s by default) runs out, in the middle of some later test."""
    yield
    left = [t for t in threading.enumerate() if t.name == watchdog.THREAD_NAME and t.is_alive()]
    assert not left, "a ProgressWatchdog was left running (stop it on every way out of what started it)"
