"""A rank that exits USER_ERROR writes its reason (the exception's last line) to the event log."""

from __future__ import annotations

from pathlib import Path

from flywheel.contracts import exitcodes
from flywheel.eventlog import Failure, read_records
from flywheel.trainer.entry import main


def test_a_user_error_puts_its_reason_in_the_event_log(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "FLYWHEEL_EVENTS_FILE": str(events)}  # no spec
    assert main(env) == exitcodes.USER_ERROR
    [record] = read_records(events)
    assert isinstance(record, Failure) and record.kind == "user-error" and record.rank == 0
    assert record.reason.startswith("UserError: ") and "FLYWHEEL_SPEC" in record.reason
