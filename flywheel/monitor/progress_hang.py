"""Hang detection from the etcd progress record, without Prometheus (pure; the job's runner calls it each pass and
leaves a `HangReport` in the job's findings inbox: the reconcile pass decides the restart, as for the monitor's).

All times are the operator's own clock: when the runner last saw the record's step change, and since when every
worker pod of the current generation runs. A job is hung when it trains no step for `progressTimeoutSeconds`
(0: never), or, before the current group's first step, for `firstStepTimeoutSeconds` after all its pods run
(start-up, rendezvous, restore and the first step; the trainer's own watchdog uses the same two allowances).
A group begins again without new pods when an agent restarts its ranks in place (a crash, an elastic regrow):
from that restart, or from the new group's first record, the first-step allowance applies again.

Progress is what the trainer's own watchdog counts (trainer/watchdog.py): a step, or an evaluation batch (the
record's heartbeat while it evaluates). The watchdog stops for the final blocking save; here that save pauses the
step check too, but only for `final_save_allowance`: a save that never ends (a hung filesystem) must not keep the job
Running forever. The Prometheus hang check (policy/health_checks.py) uses the same allowance.
"""

from __future__ import annotations

from dataclasses import dataclass

from flywheel.etcd.progress import final_save_allowance


@dataclass(frozen=True)
class ProgressClock:
    """What the runner saw, on its own clock (unix seconds)."""

    running_since: float | None  # every worker pod of the current generation Running since; None: not all run
    last_step_seen: float | None  # when the runner last saw the step change (any generation); None: never
    # When the newest group began in these pods: its first record seen, or an agent's restart of its ranks
    # (the agent's clock); None: no such group since the pods ran.
    group_began: float | None = None
    last_activity_seen: float | None = None  # when the runner last saw an evaluation batch's heartbeat change
    saving_since: float | None = None  # when the runner saw the final save begin; None: not saving

    @property
    def began(self) -> float | None:
        """Since when the current group runs: its pods, or its restart in place if later."""
        if self.running_since is None or self.group_began is None:
            return self.running_since
        return max(self.running_since, self.group_began)

    @property
    def stepped(self) -> bool:
        began = self.began
        return began is not None and self.last_step_seen is not None and self.last_step_seen >= began


def _allowance(clock: ProgressClock, progress_timeout: float,
               first_step_timeout: float) -> tuple[float, float, str, str] | None:
    """(since, limit, field, what) of the check that applies now, or None (off, or not all pods run)."""
    began = clock.began
    if began is None or progress_timeout <= 0:
        return None
    if clock.saving_since is not None and clock.saving_since >= began:
        field = "firstStepTimeoutSeconds" if first_step_timeout >= progress_timeout else "progressTimeoutSeconds"
        return (clock.saving_since, final_save_allowance(progress_timeout, first_step_timeout), field,
                "the final checkpoint save began (it has not finished)")
    if clock.stepped:
        assert clock.last_step_seen is not None
        since = max(clock.last_step_seen, clock.last_activity_seen or 0.0)  # a step or an evaluation batch
        return since, progress_timeout, "progressTimeoutSeconds", "the last step or evaluation batch"
    return began, first_step_timeout, "firstStepTimeoutSeconds", "its workers started, before the first step"


@dataclass(frozen=True)
class ProgressHang:
    idle_seconds: float
    message: str
    stepped: bool = False  # the current generation trained a step before it stopped


def progress_hang(clock: ProgressClock, now: float, progress_timeout: float,
                  first_step_timeout: float) -> ProgressHang | None:
    """The hang, or None. A step seen before the pods of this generation all ran belongs to an earlier group: the
    first-step allowance applies until the new group steps."""
    allowance = _allowance(clock, progress_timeout, first_step_timeout)
    if allowance is None:
        return None
    since, limit, field, what = allowance
    idle = now - since
    if idle < limit:
        return None
    return ProgressHang(idle, f"no training step for {idle:.0f} s since {what} (faultTolerance.{field} is "
                              f"{limit:g}; seen from the etcd progress record)", clock.stepped)


def progress_hang_due(clock: ProgressClock, progress_timeout: float, first_step_timeout: float) -> float | None:
    """When `progress_hang` finds the hang if no progress is seen before (None: it never will without a change)."""
    allowance = _allowance(clock, progress_timeout, first_step_timeout)
    return None if allowance is None else allowance[0] + allowance[1]
