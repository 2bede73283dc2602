"""Hang detection from the etcd progress record, without Prometheus (pure): a step of the reconcile pass
(`judge_progress`), which turns a hang into the pass's `HangReport` finding, decided like the health monitor's.

All times are the operator's own clock (its progress follower's, operator/progress_follower.py): when the runner
last saw the record's step change, and since when every worker pod of the current generation runs. A job is hung
when it trains no step for `progressTimeoutSeconds` (0: never), or, before the current group's first step, for
`firstStepTimeoutSeconds` after all its pods run (start-up, rendezvous, restore and the first step; the trainer's
own watchdog uses the same two allowances).
A group begins again without new pods when an agent restarts its ranks in place (a crash, an elastic regrow):
from that restart, or from the new group's first record, the first-step allowance applies again.

Progress is what the trainer's own watchdog counts (trainer/ft/watchdog.py): a step, or an evaluation batch (the
record's heartbeat while it evaluates). The watchdog stops for the final blocking save; here that save pauses the
step check too, but only for `final_save_allowance`: a save that never ends (a hung filesystem) must not keep the job
Running forever. The Prometheus hang check (policy/health_checks.py) uses the same allowance.
"""

from __future__ import annotations

from dataclasses import replace

from flywheel.etcd.progress import final_save_allowance
from flywheel.policy.decisions import Pass, ProgressHang
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import HangReport, ProgressClock
from flywheel.spec.status import Phase

# The phases whose workers cannot hang: finished, or stopped on purpose.
_NOT_JUDGED = (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED)


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


def judge_progress(out: Pass, job: JobView) -> JobView:
    """The hang seen in the progress, at most one report per generation (`out.hang_reported`: the generation whose
    hang was reported, the executor's memory, passed in and returned): the view with the hang as its finding, in
    place of the health monitor's, and `out.hang` for the executor to log and measure. The view keeps the clock
    only while a hang may still come (`hang_due`). Run first: the phase read is the remembered one."""
    clock = job.progress_clock
    if clock is None or out.status.phase in _NOT_JUDGED or out.hang_reported == job.generation:
        return replace(job, progress_clock=None)
    ft = job.spec.fault_tolerance
    hang = progress_hang(clock, job.now, ft.progress_timeout_seconds, ft.first_step_timeout_seconds)
    if hang is None:
        return job
    out.hang, out.hang_reported = hang, job.generation
    finding = HangReport(hang.message, job.generation, hang.stepped)
    return replace(job, findings=replace(job.findings, hang=finding), progress_clock=None)


def hang_due(job: JobView) -> float | None:
    """When `judge_progress` finds the hang if no progress is seen before (None: it never will without a change)."""
    if job.progress_clock is None:
        return None
    ft = job.spec.fault_tolerance
    return progress_hang_due(job.progress_clock, ft.progress_timeout_seconds, ft.first_step_timeout_seconds)
