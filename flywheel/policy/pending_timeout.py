"""Unschedulable workers (pure): the Unschedulable condition names the pod and the scheduler's message, and
`faultTolerance.pendingTimeoutSeconds` bounds the wait. Past it, the job fails -- unless it is elastic and runs at
least `replicas.min` workers: then it has shrunk already (the agents' rendezvous formed without the pending pod,
which joins once it is scheduled, as after any shrink), and it goes on. `unschedulable_due` says when either
comes due."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.decisions import Pass
from flywheel.policy.finish import finish
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import PodView
from flywheel.spec_status import Phase


def unschedulable(job: JobView) -> list[PodView]:
    """The current pods the scheduler could not place, longest waiting first."""
    pending = [p for p in job.current if p.unschedulable_since is not None and p.phase == "Pending"]
    return sorted(pending, key=lambda p: (p.unschedulable_since or 0.0, p.index))


def unschedulable_message(pod: PodView) -> str:
    return R.MSG_UNSCHEDULABLE_POD.format(pod=pod.name, message=pod.scheduler_message or "no node fits")


def pending_timeout(out: Pass, job: JobView) -> Pass | None:
    """Fail the job whose worker stayed unschedulable past pendingTimeoutSeconds (None: not timed out, or an
    elastic job running with at least min workers)."""
    limit = job.spec.fault_tolerance.pending_timeout_seconds
    pending = unschedulable(job)
    if limit is None or not pending:
        return None
    first = pending[0]
    waited = job.now - (first.unschedulable_since or job.now)
    if waited < limit:
        return None
    elastic = job.spec.replicas.min < job.spec.replicas.max
    if elastic and out.status.replicas.ready >= job.spec.replicas.min:
        return None
    message = R.MSG_PENDING_TIMEOUT.format(pod=first.name, seconds=waited, limit=limit,
                                           message=first.scheduler_message or "no node fits")
    return finish(out, job.pods, Phase.FAILED, R.UNSCHEDULABLE, message, job.now)


def unschedulable_due(job: JobView) -> list[float]:
    """When the longest-waiting unschedulable pod shows as Unschedulable (after nodeFailureGraceSeconds, the
    condition `running_state.settle` sets) and when it times out (pendingTimeoutSeconds)."""
    pending = unschedulable(job)
    since = pending[0].unschedulable_since if pending else None
    if since is None:
        return []
    limit = job.spec.fault_tolerance.pending_timeout_seconds
    shown = since + job.spec.fault_tolerance.node_failure_grace_seconds
    return [shown] if limit is None else [shown, since + limit]
