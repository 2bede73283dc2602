"""When a job's next pass is due with nothing else changed (pure).

A pass is run when something it reads changes (a watch event on the job or its pods, an etcd liveness or progress
change, a health finding, a poke) -- and when a rule that depends on the clock comes due. `next_due` gathers the
latter from the policies that own them: the earliest time at which a pass, seeing the same pods, progress and
status, would decide something different. Each rule's time is its policy's own threshold, so a pass run at that
time decides it; times not after `now` are left out (their rule was decided in this pass, or waits for the world
to catch up with an action already taken, which a watch event reports).
"""

from __future__ import annotations

from flywheel.policy.checkpoint_sharing import recheck_due
from flywheel.policy.conditions import TERMINAL
from flywheel.policy.deadline_ttl import deadline_due, ttl_due
from flywheel.policy.drain import drain_due
from flywheel.policy.finish import done_report_due, lingering_stop_at
from flywheel.policy.job_view import JobView
from flywheel.policy.pending_timeout import unschedulable_due
from flywheel.policy.progress_hang import hang_due
from flywheel.policy.rank_restarts import cause_wait_due, consequence_window
from flywheel.policy.scale_create import force_delete_due
from flywheel.policy.spare_placement import move_due
from flywheel.policy.startup_failure import stalled
from flywheel.spec.status import TrainingJobStatus


def next_due(status: TrainingJobStatus, job: JobView) -> float | None:
    """The earliest time after `job.now` a time-based rule comes due for `job`, whose pass left `status`; None:
    none will (only a change wakes the job). The CheckpointCommitted events held back add theirs
    (policy/checkpoint_events.py, after the pass)."""
    spec = job.spec
    times: list[float | None] = [*force_delete_due(job), hang_due(job)]
    if status.phase in TERMINAL:
        times.append(ttl_due(spec, status))
    elif not spec.suspend:
        times += [deadline_due(spec, status), *unschedulable_due(status, job), *job.start_failures_due(),
                  *cause_wait_due(status, job.pods, consequence_window(spec.fault_tolerance),
                                 stalled(status, job.progress)), drain_due(status),
                  move_due(status), recheck_due(status, job),
                  lingering_stop_at(job.progress.done_time, spec.fault_tolerance.finish_grace_seconds),
                  done_report_due(job)]
    return min((t for t in times if t is not None and t > job.now), default=None)
