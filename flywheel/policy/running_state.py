"""The phase of a job that is neither finished nor restarting (pure): Running once enough workers are ready, else
Pending (or still Restarting), with Unschedulable and Degraded -- fewer workers than desired, or the health
monitor's straggler verdict -- beside it."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition, set_condition, set_phase
from flywheel.policy.decisions import Event, Pass
from flywheel.policy.job_view import JobView
from flywheel.policy.pending_timeout import unschedulable, unschedulable_message, unschedulable_since
from flywheel.spec.status import ConditionType, Phase

STRAGGLER_REASONS = (R.STRAGGLER, R.STRAGGLER_RECOVERED)


def settle(out: Pass, job: JobView, entry_phase: Phase) -> Pass:
    """Set the phase from the ready workers; `entry_phase`: the phase the pass started from (a job that becomes
    Running says so in an event)."""
    status, now = out.status, job.now
    ready, desired = status.replicas.ready, job.desired
    pending = unschedulable(job)
    since = unschedulable_since(status, job)
    unsched = since is not None and now - since >= job.spec.fault_tolerance.node_failure_grace_seconds
    set_condition(status, ConditionType.UNSCHEDULABLE, unsched, R.UNSCHEDULABLE,
                  unschedulable_message(pending[0]) if unsched else R.MSG_UNSCHEDULABLE, now)
    if ready >= job.spec.replicas.min and ready > 0:
        set_phase(status, Phase.RUNNING, R.RUNNING, R.MSG_RUNNING.format(ready=ready), now)
        degraded(out, job)
    else:
        # Not (or no longer) enough workers: Restarting keeps naming the failure that started it; a job waiting
        # for its first workers, or for those of its resume, is Pending.
        waiting = Phase.RESTARTING if job.generation > 0 and entry_phase is not Phase.PENDING else Phase.PENDING
        set_phase(status, waiting, R.WAITING,
                  R.MSG_WAITING.format(ready=ready, desired=desired, min=job.spec.replicas.min), now, refresh=False)
    if status.phase is Phase.RUNNING and entry_phase is not Phase.RUNNING:
        out.events.append(Event("Normal", R.RUNNING, R.MSG_RUNNING.format(ready=ready)))
    return out


def degraded(out: Pass, job: JobView) -> None:
    """Degraded of a Running job: fewer ready workers than desired takes precedence; while every desired worker
    is ready, the health monitor's straggler verdict for this generation decides (an event when it changes)."""
    status, now = out.status, job.now
    ready, desired = status.replicas.ready, job.desired
    old = condition(status, ConditionType.DEGRADED)
    before = None if old is None else (old.status, old.reason, old.message)
    verdict = job.findings.straggler
    if verdict is not None and verdict.generation != job.generation:
        verdict = None  # judged before the last restart: stragglers are judged afresh
    if ready < desired:
        set_condition(status, ConditionType.DEGRADED, True, R.DEGRADED,
                      R.MSG_DEGRADED.format(ready=ready, desired=desired), now)
    elif verdict is not None and verdict.degraded:
        set_condition(status, ConditionType.DEGRADED, True, R.STRAGGLER, verdict.message, now)
    elif old is not None and old.reason == R.STRAGGLER and old.status == "True":
        if verdict is not None:  # the monitor says the stragglers recovered
            set_condition(status, ConditionType.DEGRADED, False, R.STRAGGLER_RECOVERED, verdict.message, now)
    elif old is None or old.reason not in STRAGGLER_REASONS:
        set_condition(status, ConditionType.DEGRADED, False, R.DEGRADED,
                      R.MSG_DEGRADED.format(ready=ready, desired=desired), now)
    new = condition(status, ConditionType.DEGRADED)
    if new is not None and new.reason in STRAGGLER_REASONS and (new.status, new.reason, new.message) != before:
        straggling = new.status == "True"
        out.events.append(Event("Warning" if straggling else "Normal", new.reason, new.message))
