"""`spec.suspend` (pure): stop every worker and keep the checkpoints; on resume start afresh from the last one."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import set_condition, set_phase
from flywheel.policy.decisions import DeletePod, Event, Pass
from flywheel.policy.job_view import JobView
from flywheel.spec.status import ConditionType, Phase


def suspend(out: Pass, job: JobView) -> Pass:
    """Delete every worker (force deletes of stuck pods stay); Suspended turns Hung False, so a pending hang never
    restarts the workers of the resume."""
    status = out.status
    out.keep_only_force_deletes()
    out.actions += [DeletePod(p.name, p.uid) for p in job.pods if p.deleting_since is None and p.phase != "Succeeded"]
    if status.phase is not Phase.SUSPENDED:
        out.events.append(Event("Normal", R.SUSPENDED, R.MSG_SUSPENDED))
    set_phase(status, Phase.SUSPENDED, R.SUSPENDED, R.MSG_SUSPENDED, job.now)
    if job.restart_requested_at:  # resuming starts fresh workers anyway: the request is served
        status.restart_request_handled = job.restart_requested_at
    return out


def resume(out: Pass, job: JobView) -> Phase:
    """The phase the pass starts from: a suspended job resumes as Pending, its workers a new generation created
    afresh once the suspended ones are gone. (In the suspended generation, a pod still terminating after a quick
    resume was read as a current worker deleted by someone else: a PodDeleted restart.) No restart is counted."""
    if out.status.phase is not Phase.SUSPENDED:
        return out.status.phase
    out.status.worker_generation = job.generation + 1
    set_condition(out.status, ConditionType.SUSPENDED, False, R.RESUMED, R.MSG_RESUMED, job.now)
    out.events.append(Event("Normal", R.RESUMED, R.MSG_RESUMED))
    return Phase.PENDING
