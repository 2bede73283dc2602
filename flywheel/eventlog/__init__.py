"""The event log as a contract (docs/contracts.md, "Event log"): its names and typed records (`records`), its writer
(`writer`), the one tailer that survives truncation and partial lines (`tail`) and the one fold to a run summary
(`fold`). Torch-free and free of the operator, the API and the local runner, which all read it."""

from flywheel.contracts.text import one_line
from flywheel.eventlog.fold import STEPS_NOT_REPORTED, FailureEntry, Incident, RunFold, fold
from flywheel.eventlog.records import (
    Checkpoint,
    CheckpointBad,
    CheckpointFailed,
    Done,
    Eval,
    EventName,
    Failure,
    LogReset,
    Record,
    Recovery,
    Restore,
    Start,
    Step,
    parse_record,
)
from flywheel.eventlog.tail import EventTail, read_records
from flywheel.eventlog.writer import EventLog

__all__ = ["STEPS_NOT_REPORTED", "Checkpoint", "CheckpointBad", "CheckpointFailed", "Done", "Eval", "EventLog",
           "EventName", "EventTail", "Failure", "FailureEntry", "Incident", "LogReset", "Record", "Recovery",
           "Restore", "RunFold", "Start", "Step", "fold", "one_line", "parse_record", "read_records"]
