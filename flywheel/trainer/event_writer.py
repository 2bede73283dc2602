"""The trainer's writer of the event log: `flywheel.eventlog.writer.EventLog` (the contract lives there)."""

from flywheel.eventlog.writer import EventLog

__all__ = ["EventLog"]
