"""Polling for the multi-process tests: wait until `check()` returns something truthy, and return it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T | None], timeout: float = 10.0, what: str | Callable[[], str] = "condition",
               interval: float = 0.05) -> T:
    """`what` may be a callable: it is called at the timeout, to say the state the wait ended in."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(interval)
