"""Objects the operator could not create (pure): the ReplicaFailure condition, as a ReplicaSet's. While a worker
pod or the headless Service is refused (a quota, an admission webhook, the API) and retried, the condition is True
with reason CreateFailed and the API's words for each; once every create went through it turns False. The phase
owns it beyond that: set_phase turns it False in a phase that creates nothing (suspended, finished)."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import TERMINAL, holds, set_condition
from flywheel.policy.job_view import JobView
from flywheel.spec.status import ConditionType, TrainingJobStatus


def track_create_failures(status: TrainingJobStatus, job: JobView) -> None:
    if status.phase in TERMINAL or job.spec.suspend:
        return
    if job.create_failures:
        set_condition(status, ConditionType.REPLICA_FAILURE, True, R.CREATE_FAILED, "; ".join(job.create_failures),
                      job.now)
    elif holds(status, ConditionType.REPLICA_FAILURE):
        set_condition(status, ConditionType.REPLICA_FAILURE, False, R.CREATED_AFTER_FAILURE,
                      R.MSG_CREATED_AFTER_FAILURE, job.now)
