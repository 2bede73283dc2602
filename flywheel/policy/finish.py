"""Ending a job (pure): an invalid spec, success seen from the pods or the event log, and the common `finish`."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import set_condition, set_phase
from flywheel.policy.decisions import DeletePod, Event, Pass
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import PodView
from flywheel.spec.status import ConditionType, Phase


def finish(out: Pass, pods: list[PodView], phase: Phase, reason: str, message: str, now: float) -> Pass:
    """Set the terminal `phase`, delete every active pod, and say so in an event."""
    set_phase(out.status, phase, reason, message, now)
    out.actions += [DeletePod(p.name, p.uid) for p in pods if p.active]
    out.events.append(Event("Normal" if phase is Phase.SUCCEEDED else "Warning", reason, message))
    return out


def invalid_job(out: Pass, pods: list[PodView], problems: str | None, now: float) -> Pass:
    """A TrainingJob whose spec does not parse fails once, with the problems as the reason's message."""
    if out.status.phase is Phase.FAILED:
        return out
    set_condition(out.status, ConditionType.INVALID, True, R.INVALID, problems or "", now)
    return finish(out, pods, Phase.FAILED, R.INVALID, problems or R.INVALID, now)


def lingering_stop_at(done_time: float | None, grace: float) -> float | None:
    """When workers still running after the trainer reported done are stopped (its final checkpoint is committed,
    so only teardown is left: a rank stuck, or restarted in place by its agent, in it must not hold the job); None:
    no done report (a user script: every worker is waited for)."""
    return None if done_time is None else done_time + grace


# A trainer's done report travels apart from its pod's exit (etcd's watch, the event log's tail) and may be seen a
# moment after the pod Succeeded: the pass waits this long for it, so the condition says what the report says (the
# step, an already complete checkpoint). A user script (spec.command) reports no done: nothing is waited for.
DONE_REPORT_WAIT_SECONDS = 10.0


def done_report_due(job: JobView) -> float | None:
    """Until when a success waits for the trainer's done report: the first worker to succeed's exit plus the wait,
    while an attempt of the trainer was seen to start and its done is not (None: nothing to wait for)."""
    if job.spec.command or job.progress.done or not job.progress.attempt:
        return None
    ended = [p.finished_at for p in job.current if p.phase == "Succeeded" and p.finished_at is not None]
    return min(ended) + DONE_REPORT_WAIT_SECONDS if ended else None


def finished_message(step: int | None, already_complete: str, stopped: list[int], grace: float) -> str:
    """A success in words, for the operator's condition and `flywheel run` alike: the step (None: no report of
    one), a resumed run's complete checkpoint, and the workers stopped after the finish grace."""
    words = "training finished" if step is None else R.MSG_SUCCEEDED.format(step=step)
    if already_complete:
        words = R.MSG_ALREADY_COMPLETE.format(step=step, path=already_complete)
    if stopped:
        words += R.MSG_LINGERING_STOPPED.format(workers=", ".join(map(str, stopped)), grace=f"{grace:g}")
    return words


def success(out: Pass, job: JobView) -> Pass | None:
    """Succeeded once a worker of the current generation succeeded (or the event log says done) and none of the
    others still runs (and the trainer's done report was seen, or waited for), or the done report is
    finishGraceSeconds old; while they exit the job stays Running and nothing is replaced. None: not finishing."""
    current = job.current
    if not any(p.phase == "Succeeded" for p in current) and not job.progress.done:
        return None
    lingering = sorted(p.index for p in current if p.phase in ("Running", "Pending") and p.index < job.desired)
    report_due = done_report_due(job)
    awaiting_report = report_due is not None and job.now < report_due
    stop_at = lingering_stop_at(job.progress.done_time, job.spec.fault_tolerance.finish_grace_seconds)
    overdue = stop_at is not None and job.now >= stop_at
    if (not lingering and not awaiting_report) or overdue:
        done = finished_message(out.status.step, job.progress.already_complete_checkpoint,
                                lingering if overdue else [], job.spec.fault_tolerance.finish_grace_seconds)
        return finish(out, job.pods, Phase.SUCCEEDED, R.SUCCEEDED, done, job.now)
    ready = out.status.replicas.ready
    set_phase(out.status, Phase.RUNNING, R.RUNNING, R.MSG_RUNNING.format(ready=ready), job.now, refresh=False)
    return out
