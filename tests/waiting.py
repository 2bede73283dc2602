"""Polling for the multi-process tests: wait until `check()` returns something truthy, and return it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T | None], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
