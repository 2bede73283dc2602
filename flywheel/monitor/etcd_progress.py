"""The job's progress as the operator reads it from etcd (records: flywheel/etcd/progress.py), folded into the
`ObservedProgress` that reconcile reads; pure, fed by the runner's progress watch (and the REST API's follower,
flywheel/api/progress.py, which shows the same view).

Each record is cumulative for its attempt (one trainer group between restarts), so the ledger keeps each attempt's
first and last record and adds attempts up:

- step, world size, done: the newest attempt's last record; the evaluation: the newest attempt's that has one;
  the checkpoint: the newest one committed in any.
- goodput: productive seconds = the sum of the attempts' step times; wall = the newest record's time - the first
  attempt's start; lost steps = for each attempt after another, the previous one's last step - the step it
  resumed from; a recovery = an attempt's first step - the previous attempt's last record (its last step, to
  within the publisher's one-second interval).
- An operator that restarts finds the job's status already counting the attempts before it: `GoodputSeed` (read
  once from that status) is the base, and an attempt that started before this operator counts from its first
  record seen here, not from its start.

With an event log as well (`--events-dir`), `merged` prefers etcd for step, checkpoint and the latest evaluation
(it is never older) and the event log for the history (goodput, recoveries, checkpoints, a failure's reason).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flywheel.etcd.progress import CheckpointRecord, ProgressRecord
from flywheel.policy.checkpoint_events import RECENT_CHECKPOINTS, CommittedCheckpoint
from flywheel.policy.observed import ObservedProgress


@dataclass(frozen=True)
class GoodputSeed:
    """The goodput a previous operator wrote (zero for a new job), and when this operator started."""

    productive_seconds: float = 0.0
    ratio: float = 0.0
    lost_steps: int = 0
    mean_time_to_recover_seconds: float = 0.0
    operator_started: float = 0.0

    @property
    def wall_seconds(self) -> float:
        return self.productive_seconds / self.ratio if self.ratio > 0 else 0.0


@dataclass
class _Attempt:
    first: ProgressRecord
    last: ProgressRecord
    max_step: int
    first_step_time: float | None  # the first record after a step of this attempt
    notices_seen: int = 0  # of its notices_total
    done_time: float | None = None  # the first record saying done


class ProgressLedger:
    def __init__(self) -> None:
        self.attempts: dict[float, _Attempt] = {}
        self.checkpoints: list[CheckpointRecord] = []  # distinct committed checkpoints, in the order seen
        self.notices: list[tuple[str, str]] = []  # every attempt's checkpoint notices, (kind, words), as seen

    def add(self, record: ProgressRecord) -> None:
        attempt = self.attempts.get(record.attempt)
        if attempt is None:
            attempt = self.attempts[record.attempt] = _Attempt(record, record, record.step, None)
        elif record.time < attempt.last.time:
            return  # an older value (a re-listing after a broken watch): nothing new
        attempt.last = record
        attempt.max_step = max(attempt.max_step, record.step)
        if attempt.first_step_time is None and record.stepped:
            attempt.first_step_time = record.time
        if attempt.done_time is None and record.done:
            attempt.done_time = record.time
        if record.checkpoint is not None and record.checkpoint not in self.checkpoints:
            self.checkpoints.append(record.checkpoint)
        new = record.notices_total - attempt.notices_seen
        if new > 0:
            self.notices += record.notices[-new:] if new <= len(record.notices) else record.notices
            attempt.notices_seen = record.notices_total

    def progress(self, seed: GoodputSeed) -> ObservedProgress:
        if not self.attempts:
            return ObservedProgress()
        ordered = [self.attempts[key] for key in sorted(self.attempts)]
        latest = ordered[-1].last
        checkpoint = max(self.checkpoints, key=lambda c: (c.step, c.time), default=None)
        first = max(len(self.checkpoints) - RECENT_CHECKPOINTS, 0)
        evaluated = next((a.last for a in reversed(ordered) if a.last.eval_step), None)
        return ObservedProgress(
            eval_step=evaluated.eval_step if evaluated else 0, eval_loss=evaluated.eval_loss if evaluated else None,
            step=latest.step, world_size=latest.world_size, done=latest.done,
            done_time=ordered[-1].done_time if latest.done else None,
            checkpoint_step=checkpoint.step if checkpoint else 0,
            checkpoint_time=checkpoint.time if checkpoint else None,
            checkpoint_path=checkpoint.path if checkpoint else "", goodput=_goodput(ordered, seed),
            recoveries=_recoveries(ordered, seed),
            checkpoints=tuple(CommittedCheckpoint(first + i + 1, c.step, c.path, c.time)
                              for i, c in enumerate(self.checkpoints[first:])),
            failure_reason=latest.exit_reason,  # the newest attempt's: "" once a new one started
            attempt=latest.attempt, attempt_stepped=latest.stepped,
            already_complete_checkpoint=latest.already_complete,
            checkpoint_notices=tuple((i + 1, kind, words) for i, (kind, words) in enumerate(self.notices)))


def _inherited(attempt: _Attempt, seed: GoodputSeed) -> bool:
    """Started before this operator, with a previous operator's goodput in the status: counted there until now."""
    return seed.productive_seconds > 0 and attempt.first.attempt < seed.operator_started


def _recoveries(ordered: list[_Attempt], seed: GoodputSeed) -> tuple[tuple[float, float], ...]:
    return tuple((b.first_step_time, b.first_step_time - a.last.time) for a, b in zip(ordered, ordered[1:])
                 if b.first_step_time is not None and not _inherited(b, seed))


def _goodput(ordered: list[_Attempt], seed: GoodputSeed) -> dict[str, float | int]:
    latest = ordered[-1].last
    productive = seed.productive_seconds + sum(
        a.last.productive_seconds - (a.first.productive_seconds if _inherited(a, seed) else 0.0) for a in ordered)
    if seed.productive_seconds > 0:
        wall = seed.wall_seconds + max(latest.time - min(a.first.time for a in ordered), 0.0)
    else:
        wall = latest.time - ordered[0].first.attempt
    lost = seed.lost_steps + sum(max(a.max_step - b.first.resumed_from, 0)
                                 for a, b in zip(ordered, ordered[1:]) if not _inherited(b, seed))
    recoveries = [seconds for _, seconds in _recoveries(ordered, seed)]
    mean = sum(recoveries) / len(recoveries) if recoveries else seed.mean_time_to_recover_seconds
    return {"ratio": round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
            "productiveSeconds": round(productive, 3), "lostSteps": lost,
            "meanTimeToRecoverSeconds": round(mean, 3)}


def merged(from_etcd: ObservedProgress | None, from_log: ObservedProgress | None) -> ObservedProgress:
    """One view from both sources (either may be missing or empty)."""
    if from_log is None or (from_etcd is not None and not from_log.step and not from_log.goodput):
        return from_etcd or ObservedProgress()
    if from_etcd is None or (not from_etcd.step and not from_etcd.checkpoint_path):
        return from_log
    newer_checkpoint = from_etcd.checkpoint_step >= from_log.checkpoint_step and from_etcd.checkpoint_path
    source = from_etcd if newer_checkpoint else from_log
    evaluated = from_etcd if from_etcd.eval_step else from_log
    # The newest attempt and its reason from the source that knows it: etcd's exit reason is that attempt's own,
    # the log's the first of its open incident (which may have begun in an earlier attempt).
    said, other = (from_etcd, from_log) if from_etcd.attempt and from_etcd.attempt >= from_log.attempt else \
        (from_log, from_etcd)
    return replace(from_log, eval_step=evaluated.eval_step, eval_loss=evaluated.eval_loss, step=from_etcd.step,
                   world_size=from_etcd.world_size or from_log.world_size,
                   done=from_etcd.done or from_log.done,
                   done_time=min((t for t in (from_etcd.done_time, from_log.done_time) if t is not None),
                                 default=None), checkpoint_step=source.checkpoint_step,
                   checkpoint_time=source.checkpoint_time, checkpoint_path=source.checkpoint_path,
                   failure_reason=said.failure_reason or other.failure_reason,
                   attempt=said.attempt, attempt_stepped=said.attempt_stepped,
                   already_complete_checkpoint=(from_log.already_complete_checkpoint
                                                or from_etcd.already_complete_checkpoint))
