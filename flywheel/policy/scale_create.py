"""Pods to delete and to create (pure): the leftovers of a decided failure or of a scale-down go, a pod stuck
terminating on a lost node is force-deleted, and every missing replica index is created -- a whole new group only
once the old one is gone, on a fresh rendezvous."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition
from flywheel.policy.decisions import CreatePod, DeletePod, Event, Pass, ResetRendezvous
from flywheel.policy.job_view import JobView
from flywheel.policy.spares import promoted_events, promotions
from flywheel.policy.spec_change import on_older_spec
from flywheel.spec.status import ConditionType


def clean_up(out: Pass, job: JobView) -> Pass:
    """Delete pods above the desired count and the leftovers of a decided failure (pods of an older generation:
    never decided again) or of a regroup for an edited spec (policy/spec_change.py); force-delete a pod stuck
    terminating on a lost node after nodeFailureGraceSeconds."""
    scope_job = job.spec.fault_tolerance.restart_scope == "job"
    # Hangs and requested restarts restart every worker.
    restart_all = out.status.last_restart_reason in (R.RESTART_HUNG, R.RESTART_REQUESTED)
    older_spec = {p.uid for p in on_older_spec(job, (p for p in job.pods if p.generation < job.generation))}
    node_grace = job.spec.fault_tolerance.node_failure_grace_seconds
    for p in job.pods:
        if p.deleting_since is not None:
            if (p.node_lost or p.liveness_lost) and job.now - p.deleting_since >= node_grace:
                out.actions.append(DeletePod(p.name, p.uid, force=True))
                out.events.append(Event("Warning", R.FORCE_DELETED, R.MSG_FORCE_DELETED.format(pod=p.name)))
        elif p.index >= job.desired or (p.generation < job.generation
                                         and (scope_job or job.failure(p) is not None or restart_all
                                              or p.uid in older_spec)):
            out.actions.append(DeletePod(p.name, p.uid))
    return out


def force_delete_due(job: JobView) -> list[float]:
    """When each pod stuck terminating on a lost node (or without liveness) is force-deleted (by `clean_up`, or
    by `after_finish` for a finished job): nodeFailureGraceSeconds after its deletion began."""
    grace = job.spec.fault_tolerance.node_failure_grace_seconds
    return [p.deleting_since + grace for p in job.pods
            if p.deleting_since is not None and (p.node_lost or p.liveness_lost)]


def create_missing(out: Pass, job: JobView) -> Pass:
    """Fill every replica index below the desired count: with a ready spare where one is left (policy/spares.py),
    else a new pod where the index's name is free (a name is reused only once its old pod is gone). A whole new
    group (job restart, resume) starts once the old group is gone -- pods on a lost node or without liveness
    excepted -- on a fresh rendezvous, so that it forms at once."""
    held = {p.index for p in job.pods}
    missing = [i for i in range(job.desired) if i not in held]
    # Held only by a terminating pod: a spare (its own name) may take the index at once (policy/spares.py).
    leaving = [i for i in range(job.desired) if i in held and not any(p.index == i and p.active for p in job.pods)]
    new_group = not any(p.generation >= job.generation for p in job.pods)
    if new_group:
        leaving = []  # promoted spares too start a whole new group only on its fresh rendezvous
    if missing and new_group:
        if any(not (p.node_lost or p.liveness_lost) for p in job.pods):
            missing = []
        elif job.generation > 0 or condition(out.status, ConditionType.SUSPENDED) is not None:
            out.actions.append(ResetRendezvous())
    promoted = promotions(job, sorted(missing + leaving))
    promoted_events(out, job, promoted)
    taken = {p.index for p in promoted}
    out.actions += promoted
    created = [CreatePod(i, job.generation) for i in missing if i not in taken]
    out.actions += created
    # Counted by the pass that creates them, as the Job controller counts the pods it creates in `active`: the pass
    # on their watch events then has nothing new to write. A create that fails is retried by a pass soon after.
    out.status.replicas.current += len(created) + len(promoted)
    return out
