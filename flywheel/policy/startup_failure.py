"""Deterministic start-up failures (pure): a worker that crashes with the same reason before the first step on
STARTUP_FAILURE_ATTEMPTS attempts in a row (an import error, a missing file, a bad config) would only crash again:
the job fails with that reason then, not after `maxRestarts`.

"Before the first step": the job's step has not moved since the previous decided failure (or since the start, at
step 0). The step is the one trained last, so it moves after a restore too. Only crashes with a reason count (a
signal, an OOM kill, a lost node or a hang are not the job's own doing, or say nothing to compare)."""

from __future__ import annotations

from dataclasses import dataclass

from flywheel.policy import reasons as R
from flywheel.policy.failures import FailureKind

STARTUP_FAILURE_ATTEMPTS = 2
# Reasons that may pass by themselves: a rendezvous that timed out waiting for a peer still being scheduled
# (flywheel/trainer/launch.py writes this prefix).
TRANSIENT_PREFIXES = ("rendezvous failed",)


@dataclass(frozen=True)
class StartupFailures:
    """The last decided failure: its reason when it was a start-up failure, how many in a row had that reason, and
    the job's step when it was decided."""

    reason: str = ""
    attempts: int = 0
    step: int = 0

    @property
    def deterministic(self) -> bool:
        return self.attempts >= STARTUP_FAILURE_ATTEMPTS

    @property
    def message(self) -> str:
        return R.MSG_STARTUP_FAILURE.format(reason=self.reason, attempts=self.attempts)


def after_failure(previous: StartupFailures, kind: FailureKind, reason: str, step: int) -> StartupFailures:
    """The start-up failure record after a failure of `kind` with the worker's `reason`, at the job's `step`."""
    if kind is not FailureKind.CRASH or not reason or reason.startswith(TRANSIENT_PREFIXES) or step != previous.step:
        return StartupFailures(step=step)
    attempts = previous.attempts + 1 if reason == previous.reason else 1
    return StartupFailures(reason, attempts, step)
