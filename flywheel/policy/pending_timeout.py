"""Unschedulable workers (pure): the Unschedulable condition names the pod and the scheduler's message, and
`faultTolerance.pendingTimeoutSeconds` bounds the wait. Past it, the job fails -- unless it is elastic and runs at
least `replicas.min` workers: then it has shrunk already (the agents' rendezvous formed without the pending pod,
which joins once it is scheduled, as after any shrink), and it goes on. `unschedulable_due` says when either
comes due.

The wait counts from `status.unschedulableSince`, when the operator first saw a current worker Unschedulable
(`track_unschedulable`), not from the pod's PodScheduled condition: a pod gated for admission (Kueue) is
PodScheduled=False reason SchedulingGated from its creation, and the scheduler keeps that lastTransitionTime when
it turns the reason to Unschedulable (the status stays False), so the pod's time would count the queueing. The
record survives an operator restart and the pods' recreation while the job is still stuck (a peer's rendezvous
that gave up on the unschedulable pod restarts them, `waiting_for_unschedulable`, without spending the budget); it
is cleared once every worker is scheduled, one is gated again (queued), or the job is suspended or finished."""

from __future__ import annotations

from flywheel.contracts.startup_crashes import TRANSIENT_PREFIXES
from flywheel.policy import reasons as R
from flywheel.policy.conditions import TERMINAL, iso, parse_iso
from flywheel.policy.decisions import Pass
from flywheel.policy.finish import finish
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import PodView
from flywheel.spec.status import Phase, TrainingJobStatus


def unschedulable(job: JobView) -> list[PodView]:
    """The current pods the scheduler could not place, longest waiting first."""
    pending = [p for p in job.current if p.unschedulable_since is not None and p.phase == "Pending"]
    return sorted(pending, key=lambda p: (p.unschedulable_since or 0.0, p.index))


def unschedulable_message(pod: PodView) -> str:
    return R.MSG_UNSCHEDULABLE_POD.format(pod=pod.name, message=pod.scheduler_message or "no node fits")


def settled(job: JobView) -> bool:
    """Whether the job is no longer waiting for a node: every desired worker's pod is scheduled (or ran), or one
    is gated (queued for admission: that wait is the queue's, not the cluster's)."""
    current = job.current
    if any(p.gated for p in current):
        return True
    placed = {p.index for p in current if p.node is not None or p.phase != "Pending"}
    return placed >= set(range(job.desired))


def track_unschedulable(status: TrainingJobStatus, job: JobView) -> None:
    """Record in `status.unschedulableSince` when a current worker was first seen Unschedulable; clear it once the
    job is not waiting for a node (`settled`), is suspended or finished (""). Otherwise (its pods being recreated, or
    created and not yet tried by the scheduler) it stays as it was."""
    if status.phase in TERMINAL or job.spec.suspend:
        status.unschedulable_since = ""  # "", not None: the status is written as a merge patch
    elif unschedulable(job):
        if not status.unschedulable_since:
            status.unschedulable_since = iso(job.now)
    elif settled(job):
        status.unschedulable_since = ""


def unschedulable_since(status: TrainingJobStatus, job: JobView) -> float | None:
    """Since when the job waits for a node, while a current worker is Unschedulable (None: none is)."""
    if not unschedulable(job):
        return None
    try:
        return parse_iso(status.unschedulable_since) or job.now
    except ValueError:  # not a time (edited by hand): from now on
        return job.now


def waiting_for_unschedulable(job: JobView, reason: str) -> bool:
    """Whether a crash with `reason` (the worker's own words) is its rendezvous giving up on a peer the scheduler
    cannot place: a restart for it spends no budget (pendingTimeoutSeconds bounds that wait)."""
    return reason.startswith(TRANSIENT_PREFIXES) and bool(unschedulable(job))


def pending_timeout(out: Pass, job: JobView) -> Pass | None:
    """Fail the job whose worker stayed unschedulable past pendingTimeoutSeconds (None: not timed out, or an
    elastic job running with at least min workers)."""
    limit = job.spec.fault_tolerance.pending_timeout_seconds
    since = unschedulable_since(out.status, job)
    if limit is None or since is None:
        return None
    waited = job.now - since
    if waited < limit:
        return None
    elastic = job.spec.replicas.min < job.spec.replicas.max
    if elastic and out.status.replicas.ready >= job.spec.replicas.min:
        return None
    first = unschedulable(job)[0]
    message = R.MSG_PENDING_TIMEOUT.format(pod=first.name, seconds=waited, limit=limit,
                                           message=first.scheduler_message or "no node fits")
    return finish(out, job.pods, Phase.FAILED, R.UNSCHEDULABLE, message, job.now)


def unschedulable_due(status: TrainingJobStatus, job: JobView) -> list[float]:
    """When the job waiting for a node shows as Unschedulable (after nodeFailureGraceSeconds, the condition
    `running_state.settle` sets) and when it times out (pendingTimeoutSeconds)."""
    since = unschedulable_since(status, job)
    if since is None:
        return []
    limit = job.spec.fault_tolerance.pending_timeout_seconds
    shown = since + job.spec.fault_tolerance.node_failure_grace_seconds
    return [shown] if limit is None else [shown, since + limit]
