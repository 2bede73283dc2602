"""Time limits (pure): `runPolicy.activeDeadlineSeconds` while the job runs, `ttlSecondsAfterFinished` after; and
when each comes due (policy/due.py), so that a job with nothing else happening is looked at again exactly then."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import TERMINAL, since
from flywheel.policy.decisions import DeleteJob, DeletePod, Pass
from flywheel.policy.finish import finish
from flywheel.policy.job_view import JobView
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus


def deadline(out: Pass, job: JobView) -> Pass | None:
    """Failed once the job has existed for its active deadline (from its Created condition); None while the
    deadline has not come."""
    limit = job.spec.run_policy.active_deadline_seconds
    created = since(out.status, ConditionType.CREATED) or job.now
    if limit is None or job.now - created < limit:
        return None
    return finish(out, job.pods, Phase.FAILED, R.DEADLINE, R.MSG_DEADLINE.format(seconds=limit), job.now)


def after_finish(out: Pass, job: JobView) -> Pass:
    """A finished job: delete what still runs (force-delete pods stuck on a lost node), and the job itself once
    its TTL after finishing has passed."""
    out.actions += [DeletePod(p.name, p.uid) for p in job.pods if p.active]
    grace = job.spec.fault_tolerance.node_failure_grace_seconds
    for p in job.pods:
        if p.deleting_since is not None and p.node_lost and job.now - p.deleting_since >= grace:
            out.actions.append(DeletePod(p.name, p.uid, force=True))
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    finished = since(out.status, ConditionType(out.status.phase.value))
    if ttl is not None and finished is not None and job.now - finished >= ttl:
        out.actions.append(DeleteJob())
    return out


def deadline_due(spec: TrainingJobSpec, status: TrainingJobStatus) -> float | None:
    """When `deadline` fails the job (None: no deadline, or the job is finished or suspended)."""
    limit = spec.run_policy.active_deadline_seconds
    created = since(status, ConditionType.CREATED)
    if limit is None or created is None or spec.suspend or status.phase in TERMINAL:
        return None
    return created + limit


def ttl_due(spec: TrainingJobSpec, status: TrainingJobStatus) -> float | None:
    """When `after_finish` deletes the finished job (None: no TTL, or not finished)."""
    ttl = spec.run_policy.ttl_seconds_after_finished
    if ttl is None or status.phase not in TERMINAL:
        return None
    finished = since(status, ConditionType(status.phase.value))
    return finished + ttl if finished is not None else None
