"""What the elastic agent writes to the event log (FLYWHEEL_EVENTS_FILE), whatever its ranks run: the embedded
trainer, a Hugging Face or Lightning script, a plain torchrun script without any Flywheel import.

- `start`: the agent that starts global rank 0 writes one per trainer group it starts (the first, and each restart
  in place or new rendezvous round), with the group's identity (its master address and port, as writer.group_of
  reads them from a rank's environment). The embedded trainer's rank 0 writes its own `start` after its restore;
  the fold takes the two of one group as one start (eventlog/fold.py).
- `rank_exit`: every agent that restarts its ranks in place after they failed writes one per failed rank: its exit
  code or signal and, for the rank that failed first, the reason it left in the termination message (its uncaught
  exception). Ranks the agent stopped itself after that failure (SIGTERM) are not failures of their own. A failure
  that ends the worker is reported by whoever sees the worker exit (`worker_exit`, the pod's status).

The fold turns them into the run's restarts, failures and recovery times, as for the embedded trainer's records."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

from flywheel.contracts import exitcodes, termination_log
from flywheel.eventlog import EventLog, EventName
from flywheel.eventlog.writer import group_of

log = logging.getLogger(__name__)


def group_name(master_addr: str | None, master_port: int | None) -> str:
    """A group's identity as its ranks see it (writer.group_of)."""
    return group_of({"MASTER_ADDR": master_addr or "", "MASTER_PORT": str(master_port or "")})


def stopped_by_agent(code: int) -> bool:
    """SIGTERM or STOPPED: a rank the agent stopped after a peer failed (or one that stopped for a checkpoint)."""
    return exitcodes.shell_code(code) in (128 + signal.SIGTERM, exitcodes.STOPPED)


def failed_ranks(failures: Mapping[int, tuple[int, float]]) -> list[tuple[int, int]]:
    """(global rank, shell exit code) of the ranks that failed by themselves, by rank: those the agent stopped after
    them are left out, unless every rank was stopped (a SIGTERM from outside the agent)."""
    own = {r: exitcodes.shell_code(c) for r, (c, _) in failures.items() if not stopped_by_agent(c)}
    chosen = own or {r: exitcodes.shell_code(c) for r, (c, _) in failures.items()}
    return sorted(chosen.items())


def rank_exit_fields(rank: int, code: int, message: str) -> dict[str, object]:
    """A `rank_exit` record's fields: `kind` (exitcodes.describe: crash, signal-SIGKILL, hang, ...), `detail` (the
    rank and its code or signal) and `reason` (the rank's own message, when it left one)."""
    return {"rank": rank, "exit_code": code, "kind": exitcodes.describe(code),
            "detail": f"rank {rank}: {termination_log.exit_reason(code)}", "reason": message}


class AgentEvents:
    """The agent's writer; a no-op without FLYWHEEL_EVENTS_FILE. Never raises: the event log is a report."""

    def __init__(self, env: Mapping[str, str]):
        self.path = env.get("FLYWHEEL_EVENTS_FILE") or None
        self._logs: dict[str, EventLog] = {}

    def _log(self, group: str) -> EventLog | None:
        if self.path is None:
            return None
        if group not in self._logs:
            for old in self._logs.values():
                old.close()
            self._logs = {group: EventLog(self.path, group=group)}
        return self._logs[group]

    def _emit(self, group: str, event: EventName, **fields: object) -> None:
        try:
            events = self._log(group)
            if events is not None:
                events.emit(event, **fields)
        except OSError as err:
            log.warning("cannot write the event log %s: %s", self.path, err)

    def started(self, group: str, world_size: int, restart_count: int) -> None:
        self._emit(group, EventName.START, world_size=world_size, restart_count=restart_count, source="agent")

    def ranks_failed(self, group: str, failures: Mapping[int, tuple[int, float]], first_rank: int | None) -> None:
        """One `rank_exit` per rank that failed by itself; `first_rank` (the one that failed first) gets the
        termination message's reason."""
        message = termination_log.read()
        for rank, code in failed_ranks(failures):
            self._emit(group, EventName.RANK_EXIT, **rank_exit_fields(rank, code, message if rank == first_rank
                                                                      else ""))

    def close(self) -> None:
        for events in self._logs.values():
            events.close()
        self._logs = {}


def from_environment() -> AgentEvents:
    return AgentEvents(os.environ)
