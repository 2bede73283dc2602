"""The operator's optional second source of step, checkpoint and goodput numbers: the job's event log (the first is
the etcd progress record, monitor/etcd_progress.py; `merged` there combines the two).

The operator gives every worker `FLYWHEEL_EVENTS_FILE=<events-dir>/<namespace>_<name>_<uid>.jsonl` on a path that
it shares with the workers (the test cluster: one host; a real cluster: a ReadWriteMany volume mounted by the
operator and the workers). Global rank 0 appends one JSON line per event (docs/contracts.md); `EventLogTail` reads
what was appended since the last pass with the one tailer and folds it with the one fold (flywheel/eventlog), then
maps the fold to the `Progress` that reconcile reads (pure: `progress_of`). Without an events dir the status
takes these numbers from etcd alone (docs/operator.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flywheel.eventlog import CheckpointBad, CheckpointFailed, EventTail, RunFold
from flywheel.policy.checkpoint_events import RECENT_CHECKPOINTS, CommittedCheckpoint
from flywheel.policy.observed import ObservedProgress as Progress


def progress_of(log: RunFold) -> Progress:
    """The reconcile view of a fold. goodput.ratio = productive step time / wall time since the first `start`;
    lostSteps and meanTimeToRecoverSeconds follow the fold's definitions (flywheel/eventlog/fold.py);
    `recoveries` holds (time of the recovering step, recovery seconds) per recovered incident; `checkpoints` the
    most recent committed checkpoints, numbered in log order (for the CheckpointCommitted events)."""
    wall, productive = log.log_wall_seconds, log.productive_seconds
    mean = log.mean_time_to_recover
    goodput = {"ratio": round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
               "productiveSeconds": round(productive, 3), "lostSteps": log.lost_steps,
               "meanTimeToRecoverSeconds": round(mean, 3) if mean is not None else 0.0}
    first = max(len(log.checkpoints) - RECENT_CHECKPOINTS, 0)
    checkpoints = tuple(CommittedCheckpoint(first + i + 1, c.step, c.path, c.time)
                        for i, c in enumerate(log.checkpoints[first:]))
    last = log.checkpoints[-1] if log.checkpoints else None
    return Progress(step=log.current_step, world_size=log.last.world_size if log.last else 0,
                    checkpoint_step=last.step if last else 0, checkpoint_time=last.time if last else None,
                    checkpoint_path=last.path if last else "", done=log.done is not None,
                    done_time=log.done.time if log.done else None,
                    goodput=goodput if log.steps_reported else {},  # unknown, not 0, without steps
                    recoveries=tuple((i.recovered_at, i.recovery_seconds) for i in log.recoveries
                                     if i.recovered_at is not None and i.recovery_seconds is not None),
                    checkpoints=checkpoints, failure_reason=log.failure_reason,
                    already_complete_checkpoint=(log.done.already_complete_checkpoint or "") if log.done else "",
                    eval_step=log.last_eval.step if log.last_eval else 0,
                    eval_loss=log.last_eval.loss if log.last_eval else None,
                    checkpoint_notices=notices_of(log.checkpoint_notices),
                    attempt=log.attempt, attempt_stepped=log.attempt_stepped)


def notices_of(notices: Sequence[CheckpointFailed | CheckpointBad]) -> tuple[tuple[int, str, str], ...]:
    """A fold's checkpoint notices as ObservedProgress numbers them: (ordinal, kind, words)."""
    return tuple((i + 1, n.notice, n.words) for i, n in enumerate(notices))


class EventLogTail:
    """Reads the new complete lines of one event log on each call (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path, self.tail, self.fold = path, EventTail(path), RunFold(keep_attempts=False)

    def poll(self) -> Progress:
        self.fold.add_all(self.tail.read_new())
        return progress_of(self.fold)

    @property
    def failure_reason(self) -> str:
        """Why training last stopped, in one line (a rank's user error), or ""; for the job's condition message."""
        return self.fold.failure_reason


def events_file(events_dir: str, namespace: str, name: str, uid: str) -> Path:
    return Path(events_dir) / f"{namespace}_{name}_{uid}.jsonl"
