"""Checks that hold for every test, whichever process runs it (`make test` runs two, pytest-xdist), and what the
run prints as it goes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from flywheel.trainer.ft import watchdog


@pytest.fixture(autouse=True)
def _no_progress_watchdog_left_running() -> Iterator[None]:
    """A trainer's progress watchdog still running after its test ends os._exit()s the test process once its
    allowance (600 s by default) runs out, in the middle of some later test."""
    yield
    left = [t for t in threading.enumerate() if t.name == watchdog.THREAD_NAME and t.is_alive()]
    assert not left, "a ProgressWatchdog was left running (stop it on every way out of what started it)"


# A test this slow is named as it ends, so that a run cut short by CI's time limit still says where the time went.
SLOW_TEST_SECONDS = 90.0
_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the process that prints (xdist's controller, or the only one)
        _config.append(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Failures and slow tests, named when they happen: `-q` prints one character per test until the end."""
    reporter = _config[0].pluginmanager.get_plugin("terminalreporter") if _config else None
    if reporter is None:
        return
    if report.failed:
        reporter.write_line(f"\nFAILED ({report.when}, {report.duration:.0f} s) {report.nodeid}")
    elif report.when == "call" and report.duration >= SLOW_TEST_SECONDS:
        reporter.write_line(f"\nslow ({report.duration:.0f} s) {report.nodeid}")
