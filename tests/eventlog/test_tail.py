"""The one tailer (flywheel/eventlog/tail.py): partial lines wait, a truncated or replaced file is read anew."""

from __future__ import annotations

import json
import os
from pathlib import Path

from flywheel.eventlog import EventTail, LogReset, RunFold, Step


def line(n: int, t: float = 1.0) -> str:
    return json.dumps({"event": "step", "time": t, "step": n}) + "\n"


def test_a_half_written_line_is_held_until_complete(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read_new() == []  # no file yet
    path.write_text(line(1) + '{"event": "step", "ti')
    assert [r.step for r in tail.read_new() if isinstance(r, Step)] == [1]
    assert tail.read_new() == []
    with open(path, "a") as f:
        f.write('me": 2, "step": 2}\nnot json\n' + line(3))
    assert [r.step for r in tail.read_new() if isinstance(r, Step)] == [2, 3]


def test_a_truncated_file_is_read_from_its_start_and_the_fold_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(line(1) + line(2) + line(3))
    tail, log = EventTail(path), RunFold()
    log.add_all(tail.read_new())
    assert log.last_step == 3
    path.write_text(line(1))  # a new run truncates the log (same inode, shorter)
    records = tail.read_new()
    assert isinstance(records[0], LogReset)
    log.add_all(records)
    assert log.last_step == 1 and len(log.attempts) == 1


def test_a_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(line(1))
    tail = EventTail(path)
    assert len(tail.read_new()) == 1
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(line(7) + line(8) + line(9))  # longer than what was read: only the inode tells
    os.replace(replacement, path)
    records = tail.read_new()
    assert isinstance(records[0], LogReset) and [r.step for r in records[1:] if isinstance(r, Step)] == [7, 8, 9]


def test_a_partial_line_before_a_truncation_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(line(1) + line(2) + '{"event": "st')
    tail = EventTail(path)
    tail.read_new()
    path.write_text(line(5))
    assert [r.step for r in tail.read_new() if isinstance(r, Step)] == [5]
