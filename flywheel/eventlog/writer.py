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
from collections.abc import Mapping
from typing import Any


class EventLog:
    """`EventLog(None)` is a no-op log. Which rank writes which event is the caller's choice (see contracts.md)."""

    def __init__(self, path: str | os.PathLike[str] | None, group: str = ""):
        self.path = None if path is None else os.fspath(path)
        # The trainer group (rendezvous round) the writing rank belongs to, on every record: a failure logged by a
        # group that is no longer the current one (a cut-off worker's ranks resuming) is told from a new one.
        self.group = group
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
        if self.group:
            record.setdefault("group", self.group)
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def group_of(env: Mapping[str, str]) -> str:
    """A trainer group's identity as its ranks see it: the rendezvous round's master address and port (a fresh store,
    so a fresh port, every round); empty outside torch elastic."""
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    return f"{addr}:{port}" if addr and port else ""


def _plain(value: Any) -> Any:
    """JSON has no NaN/inf: a diverged loss is written as null rather than an unparseable line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
