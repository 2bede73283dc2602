"""The one fold of an event log into what the run did (pure: records in, numbers out; no I/O).

The local runner's summary, the operator's status, the API's local-run view and the benchmarks all read these
numbers, so they agree. Two definitions (docs/contracts.md, "Event log"):

- An *incident* is one interruption of training. It begins at its first failure record (a rank's `fault`, `hang`,
  `collective_timeout` or `user_error`, an agent's `rank_exit`, or a `worker_exit`) or, for a restart that left no
  failure record (a pod killed outright), at the last step before the `start` that followed. It ends at its
  *recovery*: the first step of a group started after it began (in a log without `start` records, the first step
  after it).
- **Recovery time** = that first step's time - the incident's beginning.
- **Lost steps** = the highest step reached before the recovery (since the previous one) - the step resumed from
  (the first step after the recovery - 1): the steps trained again. An incident never recovered lost none yet.

A step replayed after a recovery replaces the lost attempt: losses and productive seconds count each step's last
attempt once; so does an evaluation repeated after a step replayed (`evals`: the last record per step).

A *start* is one trainer group (rendezvous round) starting: the agent that starts rank 0 records it for any command,
and the embedded trainer's rank 0 again after its restore (with the step it resumed from); the records of one group
(the same `group`) are one start. Of a start's rank failure records the likeliest cause is its failure
(records.cause_rank: a peer's SIGKILL over the connection error it caused in the others).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flywheel.contracts import exitcodes
from flywheel.eventlog.records import (
    RANK_FAILURES,
    Checkpoint,
    CheckpointBad,
    CheckpointFailed,
    Done,
    Eval,
    Failure,
    LogReset,
    Record,
    Recovery,
    Restore,
    Start,
    Step,
    cause_rank,
    follows_a_peer,
)

RESTART_WITHOUT_RECORD = "restart"  # an incident's cause when the log holds no failure record for it
# A failed save's reasons that are the storage's own (checkpoint_failure.FailureReason), whatever else failed.
STORAGE_REASONS = frozenset({"no_space", "permission"})
# What a run whose command reports no steps is told instead of a goodput of 0 (the summary, the progress line).
STEPS_NOT_REPORTED = ("steps not reported: call flywheel.progress.step(step, loss=loss) after each optimizer step, "
                      "or add flywheel.integrations' Hugging Face or Lightning callback (docs/user-scripts.md)")


@dataclass
class Incident:
    began: float
    cause: str  # the first failure record's kind, or RESTART_WITHOUT_RECORD
    step_at_failure: int  # the highest step reached since the previous recovery (in-flight steps included)
    healthy_until: float | None  # the last step before it began
    reason: str = ""  # the first reason a failure record of it gave
    starts: int = 0  # `start` records since it began
    recovered_at: float | None = None
    resumed_from: int | None = None
    restore: Restore | None = None  # the checkpoint load that recovered it (its source: memory-own/-peer, disk)

    @property
    def recovery_seconds(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.began

    @property
    def lost_steps(self) -> int:
        return 0 if self.resumed_from is None else max(self.step_at_failure - self.resumed_from, 0)


@dataclass(frozen=True)
class FailureEntry:
    """A failure record and the incident it belongs to."""

    record: Failure
    incident: Incident

    @property
    def recovered_seconds(self) -> float | None:
        at = self.incident.recovered_at
        return None if at is None else at - self.record.time

    @property
    def reason(self) -> str:
        """The record's own reason; a worker's USER_ERROR exit takes its rank's (the `user_error` record)."""
        if self.record.reason or self.record.exit_code != exitcodes.USER_ERROR:
            return self.record.reason
        return self.incident.reason

    @property
    def detail(self) -> str:
        """What the failures table shows: the record's detail, and its reason when the detail lacks it."""
        detail, reason = self.record.detail, self.reason
        return f"{detail}: {reason}" if reason and reason not in detail else detail


class RunFold:
    """Folds records in log order. `keep_attempts=False` keeps one record per step, not every attempt (a long-lived
    reader such as the operator does not need the timeline)."""

    def __init__(self, keep_attempts: bool = True) -> None:
        self.keep_attempts = keep_attempts
        self._clear()

    def _clear(self) -> None:
        self.steps: dict[int, Step] = {}  # the last attempt of each step
        self.attempts: list[Step] = []  # every attempt in log order (keep_attempts)
        self.last: Step | None = None  # the latest step record
        self.starts: list[Start] = []
        self.restores: list[Restore] = []
        self.recovery_records: list[Recovery] = []  # the operator's, one per recovery it decided
        self.checkpoints: list[Checkpoint] = []
        self.checkpoint_failures: list[CheckpointFailed] = []
        # The first failure of each cause: a save failing again for the reason already reported (no commit since)
        # is counted in checkpoint_failures, not reported again.
        self.checkpoint_failure_reports: list[CheckpointFailed] = []
        # Per failing tier (CheckpointFailed.source): the reason reported since that tier last worked. The disk's
        # works again at a commit; the bucket's at a commit whose upload did not fail before the next commit came
        # (an upload follows its step's local commit).
        self._failing: dict[str, str] = {}
        self._upload_unanswered = False  # the latest commit's upload has not failed (yet)
        self.bad_checkpoints: list[CheckpointBad] = []  # damaged after their commit, skipped by a restore
        # What the user is told about checkpoints going wrong, in log order: each cause of failing saves (its
        # first failure) and each damaged checkpoint (their `words`; the operator's Warning events).
        self.checkpoint_notices: list[CheckpointFailed | CheckpointBad] = []
        self._failures: list[FailureEntry] = []
        self.incidents: list[Incident] = []
        self.done: Done | None = None
        self.evals: dict[int, Eval] = {}  # the last evaluation after each step
        self.last_eval: Eval | None = None  # the latest evaluation record
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.productive_seconds = 0.0  # step_seconds of the last attempt of each step
        self._open: Incident | None = None
        self._high = 0  # the highest step since the previous recovery
        self._stepped_since_start = False
        self._rank_failure: FailureEntry | None = None  # the newest start's rank failure, once one was recorded

    def add_all(self, records: list[Record]) -> RunFold:
        for record in records:
            self.add(record)
        return self

    def add(self, record: Record) -> None:
        if isinstance(record, LogReset):
            self._clear()
            return
        t = record.time
        self.first_time = t if self.first_time is None else min(self.first_time, t)
        self.last_time = t if self.last_time is None else max(self.last_time, t)
        if isinstance(record, Step):
            self._on_step(record)
        elif isinstance(record, Start):
            self._on_start(record)
        elif isinstance(record, Failure):
            self._on_failure(record)
        elif isinstance(record, Checkpoint):
            self._on_checkpoint(record)
        elif isinstance(record, CheckpointFailed):
            self._on_checkpoint_failed(record)
        elif isinstance(record, CheckpointBad):
            self.bad_checkpoints.append(record)
            self.checkpoint_notices.append(record)
        elif isinstance(record, Restore):
            self.restores.append(record)
            if self._open is not None and self._open.restore is None:
                self._open.restore = record
        elif isinstance(record, Eval):
            self.evals[record.step] = self.last_eval = record
        elif isinstance(record, Recovery):
            self.recovery_records.append(record)
        else:
            self.done = record

    def _on_step(self, s: Step) -> None:
        incident = self._open
        if incident is not None and (incident.starts > 0 or not self.starts):
            incident.recovered_at, incident.resumed_from = s.time, s.step - 1
            self._open, self._high = None, 0
        elif incident is not None:  # the failed group's step in flight: reached, and to be trained again
            incident.step_at_failure = max(incident.step_at_failure, s.step)
        previous = self.steps.get(s.step)
        self.productive_seconds += s.step_seconds - (previous.step_seconds if previous else 0.0)
        self.steps[s.step] = s
        if self.keep_attempts:
            self.attempts.append(s)
        self.last = s
        self._high = max(self._high, s.step)
        self._stepped_since_start = True

    def _on_checkpoint(self, record: Checkpoint) -> None:
        self.checkpoints.append(record)
        self._failing.pop("disk", None)
        if self._upload_unanswered:  # the previous commit's upload did not fail: the bucket works again
            self._failing.pop("bucket", None)
        self._upload_unanswered = True

    def _on_checkpoint_failed(self, record: CheckpointFailed) -> None:
        """Once per cause and tier: again only when the reason changes, or after that tier worked again. The memory
        tier's saves leave no record when they work: its trainer reports once per cause itself, so each of its
        records is a notice. A save that broke after a rank of its group failed was abandoned for that failure:
        said so, naming it (the transport's error stays in `error`), and no fault of the storage."""
        if self._rank_failure is not None and record.source != "memory" and record.reason not in STORAGE_REASONS:
            record = replace(record, message=abandoned_words(record, self._rank_failure, self.committed_step))
            self.checkpoint_failures.append(record)
            self.checkpoint_failure_reports.append(record)
            self.checkpoint_notices.append(record)
            return
        self.checkpoint_failures.append(record)
        if record.source == "memory" or not record.reason or record.reason != self._failing.get(record.source):
            self.checkpoint_failure_reports.append(record)
            self.checkpoint_notices.append(record)
        if record.source != "memory":
            self._failing[record.source] = record.reason
        if record.source == "bucket":
            self._upload_unanswered = False

    def _on_start(self, s: Start) -> None:
        previous = self.starts[-1] if self.starts else None
        if previous is not None and s.group and s.group == previous.group:  # the same group, from its other writer
            self.starts[-1] = Start(min(previous.time, s.time), max(previous.world_size, s.world_size),
                                    max(previous.restart_count, s.restart_count),
                                    previous.resumed_from if s.resumed_from is None else s.resumed_from, s.group)
            return
        if self._open is not None:
            self._open.starts += 1
        elif self._stepped_since_start and self.last is not None:
            self._begin(self.last.time, RESTART_WITHOUT_RECORD).starts = 1
        self.starts.append(s)
        self._stepped_since_start, self._rank_failure = False, None

    def _on_failure(self, f: Failure) -> None:
        current = self.starts[-1].group if self.starts else ""
        if f.event in RANK_FAILURES and f.group and current and f.group != current:
            return  # a group that is no longer the current one (a replaced worker's ranks, a late straggler)
        if f.event in RANK_FAILURES and self._rank_failure is not None:  # the same outage seen by another rank
            self._another_account(self._rank_failure, f)
            return
        incident = self._open or self._begin(f.time, f.kind)
        incident.reason = incident.reason or f.reason
        entry = FailureEntry(f, incident)
        self._failures.append(entry)
        if f.event in RANK_FAILURES:
            self._rank_failure = entry

    def _another_account(self, entry: FailureEntry, f: Failure) -> None:
        """A second rank failure record of one start: it replaces the first when it is the likelier cause."""
        incident = entry.incident
        if cause_rank(f) >= cause_rank(entry.record):
            incident.reason = incident.reason or f.reason
            return
        better = FailureEntry(f, incident)
        self._failures[next(i for i, e in enumerate(self._failures) if e is entry)] = better
        self._rank_failure = better
        if incident.cause == entry.record.kind and incident.began == entry.record.time:  # it began with that record
            incident.cause, incident.began = f.kind, min(incident.began, f.time)
        incident.reason = f.reason or incident.reason

    def _begin(self, t: float, cause: str) -> Incident:
        self._open = Incident(began=t, cause=cause, step_at_failure=self._high,
                              healthy_until=self.last.time if self.last else None)
        self.incidents.append(self._open)
        return self._open

    # --- views -------------------------------------------------------------------------------------------------
    @property
    def failures(self) -> list[FailureEntry]:
        """The failure records, less those that may follow a peer's failure in an incident that another record
        explains (a rank whose peer died sees its collective fail: a symptom, not a second failure)."""
        explained = {id(f.incident) for f in self._failures if not follows_a_peer(f.record)}
        return [f for f in self._failures if not follows_a_peer(f.record) or id(f.incident) not in explained]

    @property
    def steps_reported(self) -> bool:
        """Whether the command reports its steps (the embedded trainer, flywheel.progress, an integration): without
        them goodput and lost steps are unknown, not 0."""
        return self.last is not None or self.done is not None

    @property
    def last_step(self) -> int:
        """The highest step trained."""
        return max(self.steps, default=0)

    @property
    def current_step(self) -> int:
        """Where training is now: the latest step record's (lower than last_step while replaying), or done's."""
        current = self.last.step if self.last else 0
        return max(current, self.done.step) if self.done else current

    @property
    def attempt(self) -> float:
        """When the newest trainer group reported its start (0: none did)."""
        return self.starts[-1].time if self.starts else 0.0

    @property
    def attempt_stepped(self) -> bool:
        """Whether a step followed the newest start: that group got past its start-up."""
        return bool(self.starts) and self.last is not None and self.last.time >= self.starts[-1].time

    @property
    def steps_completed(self) -> int:
        return self.done.step if self.done else self.last_step

    @property
    def last_loss(self) -> float | None:
        return self.steps[self.last_step].loss if self.steps else None

    @property
    def committed_step(self) -> int:
        return max((c.step for c in self.checkpoints), default=0)

    @property
    def restarts(self) -> int:
        """Times training started again: every rank-level restart or worker recreation logs a new `start`."""
        return max(len(self.starts) - 1, 0)

    @property
    def open_incident(self) -> Incident | None:
        """The incident training has not recovered from yet, if any."""
        return self._open

    @property
    def recoveries(self) -> list[Incident]:
        return [i for i in self.incidents if i.recovered_at is not None]

    @property
    def lost_steps(self) -> int:
        return sum(i.lost_steps for i in self.incidents)

    @property
    def mean_time_to_recover(self) -> float | None:
        seconds = [i.recovery_seconds for i in self.recoveries if i.recovery_seconds is not None]
        return sum(seconds) / len(seconds) if seconds else None

    @property
    def failure_reason(self) -> str:
        """Why training is stopped: the reason the incident not recovered from gave (a user error's), or ""."""
        return self._open.reason if self._open is not None else ""

    @property
    def log_wall_seconds(self) -> float:
        """From the first `start` (the first record when there is none) to the latest record."""
        first = self.starts[0].time if self.starts else self.first_time
        return max(self.last_time - first, 0.0) if first is not None and self.last_time is not None else 0.0

    def eval_losses(self) -> list[tuple[int, float | None]]:
        """(step, eval loss) of each evaluated step's last evaluation, by step."""
        return [(step, self.evals[step].loss) for step in sorted(self.evals)]

    def losses(self) -> list[float | None]:
        """One value per step 1..N (N = steps completed); None for a step never seen or reported without a loss."""
        last = max(self.steps_completed, self.last_step)
        return [self.steps[s].loss if s in self.steps else None for s in range(1, last + 1)]


def abandoned_words(record: CheckpointFailed, failure: FailureEntry, newest: int) -> str:
    """A save broken by a rank's failure, in the job's terms: which rank, why, and what is safe."""
    f, detail = failure.record, failure.detail
    who = detail if detail.startswith("rank ") else f"rank {f.rank}: {f.kind}" + (f" ({detail})" if detail else "")
    newest_words = f"step {newest}" if newest else "none yet"
    return (f"checkpoint at step {record.step} abandoned: {who} during the save; newest good checkpoint: "
            f"{newest_words}")


def fold(records: list[Record], keep_attempts: bool = True) -> RunFold:
    return RunFold(keep_attempts).add_all(records)
