"""The local run's record: the event log folded by the one fold (flywheel/eventlog), plus what only the supervisor
knows (worker recreations), and the run summary written to summary.json.

The supervisor writes a `worker_exit` record to the event log for every worker that exits unasked, so the failures
table, the API's local-run view and an offline fold of events.jsonl all see the same failures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from flywheel.eventlog import CheckpointFailed, Done, EventTail, FailureEntry, Record, RunFold, parse_record

__all__ = ["EventTail", "Recreation", "RunRecord", "fold", "perplexity"]

MAX_LOG_PERPLEXITY = 700.0  # exp() of more overflows a float


@dataclass(frozen=True)
class Recreation:
    time: float
    replicas: tuple[int, ...]
    action: str
    reason: str
    spare: str = ""  # the warm spare promoted to the replica (`flywheel run --spares`), "" for a cold start


@dataclass
class RunRecord:
    """Everything known about one run, folded from records in arrival order."""

    log: RunFold = field(default_factory=RunFold)
    recreations: list[Recreation] = field(default_factory=list)

    def add_event(self, event: Record | dict[str, Any]) -> None:
        record = parse_record(event) if isinstance(event, dict) else event
        if record is not None:
            self.log.add(record)

    def add_recreation(self, time: float, replicas: tuple[int, ...], action: str, reason: str,
                       spare: str = "") -> None:
        self.recreations.append(Recreation(time=time, replicas=replicas, action=action, reason=reason, spare=spare))

    # --- views the supervisor and the progress bar use ------------------------------------------------------------
    @property
    def done(self) -> Done | None:
        return self.log.done

    @property
    def last_step(self) -> int:
        return self.log.last_step

    @property
    def committed_step(self) -> int:
        return self.log.committed_step

    @property
    def last_loss(self) -> float | None:
        return self.log.last_loss

    @property
    def tokens_per_second(self) -> float | None:
        return self.log.last.tokens_per_second if self.log.last else None

    @property
    def last_checkpoint_step(self) -> int | None:
        return self.log.checkpoints[-1].step if self.log.checkpoints else None

    @property
    def restarts(self) -> int:
        return self.log.restarts

    def summary(self, *, job: str, status: str, exit_code: int, world_size: int, start_time: float,
                wall_seconds: float) -> dict[str, Any]:
        """summary.json. Goodput here is productive seconds over the runner's own wall time (start-up included)."""
        log = self.log
        productive = log.productive_seconds
        return {
            "job": job,
            "status": status,
            "exit_code": exit_code,
            "world_size": world_size,
            "steps_completed": log.steps_completed,
            "losses": log.losses(),
            "final_loss": log.last_loss,
            "evals": [{"step": step, "loss": loss, "perplexity": perplexity(loss)} for step, loss in log.eval_losses()],
            "final_eval_loss": log.last_eval.loss if log.last_eval else None,
            "final_eval_step": log.last_eval.step if log.last_eval else None,
            "final_params_sha256": log.done.params_sha256 if log.done else None,
            "restarts": log.restarts,
            # The agents' restarts in place: every start not made by a worker recreation (rank 0's agent counts
            # only its own ranks' failures in restart_count, not a restart a peer's failure made).
            "agent_restarts": max(log.restarts - len(self.recreations), 0),
            "worker_recreations": [{"time": r.time - start_time, "replicas": list(r.replicas), "action": r.action,
                                    "reason": r.reason, "spare": r.spare or None} for r in self.recreations],
            "failures": [_failure_row(f, start_time) for f in log.failures],
            "failure_reason": log.failure_reason or None,
            "mean_time_to_recover_seconds": log.mean_time_to_recover,
            "checkpoints": [{"step": c.step, "blocking_seconds": c.blocking_seconds,
                             "total_seconds": c.total_seconds, "path": c.path} for c in log.checkpoints],
            "checkpoint_failures": len(log.checkpoint_failures),
            "checkpoint_failure_reports": [_checkpoint_failure_row(f, log) for f in log.checkpoint_failure_reports],
            "bad_checkpoints": [{"step": b.step, "path": b.path, "reason": b.reason, "source": b.source,
                                 "words": b.words} for b in log.bad_checkpoints],
            "resumed_from": [s.resumed_from for s in log.starts],
            "restores": [{"step": r.step, "source": r.source, "path": r.path} for r in log.restores],
            "checkpoint_memory_bytes": log.done.checkpoint_memory_bytes if log.done else None,
            "lost_steps": log.lost_steps,
            "productive_seconds": productive,
            # Unknown (None) when the command reports no steps: no productive time can be told from lost time.
            "steps_reported": log.steps_reported,
            "goodput": (productive / wall_seconds if wall_seconds > 0 else 0.0) if log.steps_reported else None,
            "wall_seconds": wall_seconds,
        }


def perplexity(loss: float | None) -> float | None:
    """exp(loss); None for no loss or one whose exp overflows (JSON has no inf)."""
    if loss is None or loss > MAX_LOG_PERPLEXITY:
        return None
    return math.exp(loss)


def _failure_row(f: FailureEntry, start_time: float) -> dict[str, Any]:
    r = f.record
    return {"time": r.time - start_time, "rank": r.rank, "replica": r.replica, "kind": r.kind,
            "exit_code": r.exit_code, "detail": f.detail, "reason": f.reason or None,
            "recovered_seconds": f.recovered_seconds, "restored_from": _restored_from(f)}


def _restored_from(f: FailureEntry) -> dict[str, Any] | None:
    """The checkpoint its recovery loaded: where from (memory-own, memory-peer, disk) and its step."""
    restore = f.incident.restore
    return None if restore is None else {"source": restore.source, "step": restore.step}


def _checkpoint_failure_row(f: CheckpointFailed, log: RunFold) -> dict[str, Any]:
    """One reported cause: its first failure's step and words, and how many failed saves it stands for (it and the
    failures after it up to the next report)."""
    reported = {id(r) for r in log.checkpoint_failure_reports}
    start = next(i for i, g in enumerate(log.checkpoint_failures) if g is f)
    later = log.checkpoint_failures[start + 1:]
    count = 1 + next((i for i, g in enumerate(later) if id(g) in reported), len(later))
    return {"step": f.step, "reason": f.reason or None, "message": f.words, "count": count}


def fold(events: list[Record] | list[dict[str, Any]]) -> RunRecord:
    """A RunRecord from a list of records or raw event objects (pure; what the tests and offline reports use)."""
    record = RunRecord()
    for ev in events:
        record.add_event(ev)
    return record
