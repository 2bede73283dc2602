"""The deterministic start-up crash rule's count (pure): a worker that crashes with the same reason before its first
step on STARTUP_FAILURE_ATTEMPTS attempts in a row (an import error, a missing file, a bad config) would only crash
again. One count for all who apply the rule: the operator and `flywheel run` fail the job then
(policy/startup_failure.py), and `flywheel launch`'s agent stops restarting its ranks in place (agent/launch.py),
so its pod fails and the job's restart policy decides. Below the policy layer: the trainer may not import policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

STARTUP_FAILURE_ATTEMPTS = 2
# Reasons that may pass by themselves: a rendezvous that timed out waiting for a peer still being scheduled
# (flywheel/agent/launch.py writes this prefix).
TRANSIENT_PREFIXES = ("rendezvous failed",)


@dataclass(frozen=True)
class StartupCrashes:
    """The last failure: its reason when it was a start-up crash, how many in a row had that reason, and the job's
    step when it was decided (the operator's fallback when no attempt says whether it stepped)."""

    reason: str = ""
    attempts: int = 0
    step: int = 0

    @property
    def deterministic(self) -> bool:
        return self.attempts >= STARTUP_FAILURE_ATTEMPTS


Record = TypeVar("Record", bound=StartupCrashes)


def count(previous: Record, *, crash: bool, reason: str, step: int, before_first_step: bool) -> Record:
    """The record after a failure: counted when it is a `crash` (not a signal, a hang, a lost node: not the job's
    own doing, or saying nothing to compare) with a non-transient `reason`, `before_first_step`."""
    cls = type(previous)
    if not crash or not reason or reason.startswith(TRANSIENT_PREFIXES) or not before_first_step:
        return cls(step=step)
    attempts = previous.attempts + 1 if reason == previous.reason else 1
    return cls(reason, attempts, step)
