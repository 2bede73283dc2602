"""The one reader of an event log while it is written: new complete lines on each call, as typed records.

A half-written last line is held until its newline arrives. A file truncated or replaced (a new run in the same
directory, a rotated log) is read again from its start, and the first batch after that begins with `LogReset`, so
a fold starts over. A line that is not JSON (the fragment of a writer killed mid-line on a filesystem without atomic
appends) or not a record this version knows is skipped: it cannot corrupt what follows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flywheel.eventlog.records import LogReset, Record, parse_record


class EventTail:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file being read

    def read_new(self) -> list[Record]:
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                reset = self._start_over_if_replaced((stat.st_dev, stat.st_ino), stat.st_size)
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        records: list[Record] = [LogReset()] if reset else []
        for line in lines:
            record = _record(line)
            if record is not None:
                records.append(record)
        return records

    def _start_over_if_replaced(self, identity: tuple[int, int], size: int) -> bool:
        replaced = self._identity is not None and identity != self._identity
        truncated = size < self._offset  # the offset counts the held partial line too
        self._identity = identity
        if not (replaced or truncated):
            return False
        self._offset, self._partial = 0, b""
        return True


def _record(line: bytes) -> Record | None:
    if not line.strip():
        return None
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    return parse_record(raw) if isinstance(raw, dict) else None


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    """Every complete record of a log as it is now (offline readers: the benchmarks, tests)."""
    return EventTail(path).read_new()
