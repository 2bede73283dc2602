"""Deterministic start-up failures (pure): a worker that crashes with the same reason before the first step on
STARTUP_FAILURE_ATTEMPTS attempts in a row (an import error, a missing file, a bad config) would only crash again:
the job fails with that reason then, not after `maxRestarts` (the count: flywheel/contracts/startup_crashes.py).

"Before the first step" is the failed attempt's own word: the newest attempt in the progress record, when it began
in the current generation (after the last counted recovery), trained a step or not; when none did, this
generation's group never reported its start, so it trained nothing. The job's step cannot tell: a group that
restores checkpoint 400 and crashes at 500 every time shows step 500 at each failure, yet trained 100 steps each
time. Only with no attempt in the record at all does the step decide (unmoved since the previous decided failure).
Only crashes with a reason count (a signal, an OOM kill, a lost node or a hang are not the job's own doing, or say
nothing to compare)."""

from __future__ import annotations

from dataclasses import dataclass

from flywheel.contracts import startup_crashes
from flywheel.policy import reasons as R
from flywheel.policy.failures import FailureKind
from flywheel.policy.observed import ObservedProgress
from flywheel.policy.rank_restarts import last_restart
from flywheel.spec.status import TrainingJobStatus


@dataclass(frozen=True)
class StartupFailures(startup_crashes.StartupCrashes):
    """The last decided failure (startup_crashes.StartupCrashes), with its message."""

    @property
    def final_save(self) -> bool:
        """A retry that only restores and saves the final state, failing each time (the trainer's FinalSaveFailed):
        the same rule, under its own reason and advice."""
        return self.reason.startswith(R.FINAL_SAVE_FAILED + ":")

    @property
    def label(self) -> str:
        """The job's failure reason."""
        return R.FINAL_SAVE_FAILED if self.final_save else R.STARTUP_FAILURE

    @property
    def message(self) -> str:
        words = R.MSG_FINAL_SAVE_FAILED if self.final_save else R.MSG_STARTUP_FAILURE
        return words.format(reason=self.reason, attempts=self.attempts)


def attempt_is_current(status: TrainingJobStatus, progress: ObservedProgress) -> bool:
    """Whether the progress record's newest attempt began after the last counted recovery (always, before any): its
    exit reason and its steps are then about the group that failed now, not an earlier one. A record that names no
    attempt is the first group's only before any recovery."""
    began = last_restart(status)
    if not progress.attempt:
        return began is None and status.generation == 0
    return began is None or progress.attempt >= began


def before_first_step(status: TrainingJobStatus, progress: ObservedProgress) -> bool | None:
    """Whether the current generation's group failed before it trained a step (`group_before_first_step`)."""
    return group_before_first_step(progress.attempt, progress.attempt_stepped, last_restart(status))


def stalled(status: TrainingJobStatus, progress: ObservedProgress) -> bool:
    """Whether no step was trained since the last counted recovery (with no attempt known: ever)."""
    before = before_first_step(status, progress)
    return before if before is not None else status.step == 0


def group_before_first_step(attempt: float, stepped: bool, restarted: float | None) -> bool | None:
    """Whether the group running since the last restart (`restarted`: when it was decided, None: none yet) failed
    before it trained a step, from the newest attempt that reported its start (`attempt`: when; 0: none) and whether
    that attempt `stepped`; None when no attempt is known (then `after_failure` compares the job's step). The
    operator and `flywheel run` both decide by it."""
    if not attempt:
        return None
    if restarted is not None and attempt < restarted:
        return True  # the group since the restart never reported its start
    return not stepped


def after_failure(previous: StartupFailures, kind: FailureKind, reason: str, step: int,
                  first_step: bool | None = None) -> StartupFailures:
    """The start-up failure record after a failure of `kind` with the worker's `reason`, at the job's `step`;
    `first_step`: whether it failed before its first step (`before_first_step`; None: the step has not moved)."""
    before = step == previous.step if first_step is None else first_step
    return startup_crashes.count(previous, crash=kind is FailureKind.CRASH, reason=reason, step=step,
                                 before_first_step=before)
