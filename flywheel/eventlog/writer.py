"""The JSON-lines event log's writer (`FLYWHEEL_EVENTS_FILE`; names and records: flywheel/eventlog/records.py).

Each event is one `os.write()` of one line to an O_APPEND descriptor: no Python buffer to flush, so a line
written before a SIGKILL is in the file, and lines from several processes never interleave.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any


class EventLog:
    """`EventLog(None)` is a no-op log. Which rank writes which event is the caller's choice (see contracts.md)."""

    def __init__(self, path: str | os.PathLike[str] | None):
        self.path = None if path is None else os.fspath(path)
        self._fd: int | None = None
        self._lock = threading.Lock()  # the checkpointer emits from its background thread
        if self.path:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def emit(self, event: str, **fields: Any) -> None:
        if self._fd is None:
            return
        record = {"event": event, "time": time.time(), **{k: _plain(v) for k, v in fields.items()}}
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _plain(value: Any) -> Any:
    """JSON has no NaN/inf: a diverged loss is written as null rather than an unparseable line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
