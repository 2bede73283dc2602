"""Hang detection from the etcd progress record, without Prometheus (pure; the job's runner calls it each pass and
leaves a `HangReport` in the job's findings inbox: the reconcile pass decides the restart, as for the monitor's).

All times are the operator's own clock: when the runner last saw the record's step change, and since when every
worker pod of the current generation runs. A job is hung when it trains no step for `progressTimeoutSeconds`
(0: never), or, before the current group's first step, for `firstStepTimeoutSeconds` after all its pods run
(start-up, rendezvous, restore and the first step; the trainer's own watchdog uses the same two allowances).
A group begins again without new pods when an agent restarts its ranks in place (a crash, an elastic regrow):
from that restart, or from the new group's first record, the first-step allowance applies again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressClock:
    """What the runner saw, on its own clock (unix seconds)."""

    running_since: float | None  # every worker pod of the current generation Running since; None: not all run
    last_step_seen: float | None  # when the runner last saw the step change (any generation); None: never
    # When the newest group began in these pods: its first record seen, or an agent's restart of its ranks
    # (the agent's clock); None: no such group since the pods ran.
    group_began: float | None = None

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


@dataclass(frozen=True)
class ProgressHang:
    idle_seconds: float
    message: str
    stepped: bool = False  # the current generation trained a step before it stopped


def progress_hang(clock: ProgressClock, now: float, progress_timeout: float,
                  first_step_timeout: float) -> ProgressHang | None:
    """The hang, or None. A step seen before the pods of this generation all ran belongs to an earlier group: the
    first-step allowance applies until the new group steps."""
    began = clock.began
    if began is None or progress_timeout <= 0:
        return None
    stepped = clock.stepped
    if stepped:
        assert clock.last_step_seen is not None
        idle, limit, what = now - clock.last_step_seen, progress_timeout, "progressTimeoutSeconds"
    else:
        idle, limit, what = now - began, first_step_timeout, "firstStepTimeoutSeconds"
    if idle < limit:
        return None
    since = "the last step" if stepped else "its workers started, before the first step"
    return ProgressHang(idle, f"no training step for {idle:.0f} s since {since} (faultTolerance.{what} is "
                              f"{limit:g}; seen from the etcd progress record)", stepped)


def progress_hang_due(clock: ProgressClock, progress_timeout: float, first_step_timeout: float) -> float | None:
    """When `progress_hang` finds the hang if no step is seen before (None: it never will without a change)."""
    began = clock.began
    if began is None or progress_timeout <= 0:
        return None
    if clock.stepped:
        assert clock.last_step_seen is not None
        return clock.last_step_seen + progress_timeout
    return began + first_step_timeout
