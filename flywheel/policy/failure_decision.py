"""Failures of the current generation (pure): a failed pod, a hang the health monitor found, or a user's restart
request -> the restart decision (policy/restart.py), recorded in the status with the pods to replace.

A hang with no failed pod, while every worker's agent is alive, is answered in place (`in_place`): the pods stay,
relabelled to the new generation, and their agents restart their ranks (`RestartRanks`, an etcd request): no cold
pod, no new scheduling. Counted, named (Hung) and budgeted as the pod restart it replaces; a generation begun that
way that hangs again before a step recreates the pods (`status.inPlaceRestartGeneration`), so a wedged agent
cannot loop.

Deciding bumps the worker generation (`status.workerGeneration`) and `status.restarts` in the status write, so a
pass repeated after a crash sees the pods as an older generation and only cleans up (see policy/reconcile.py)."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition, set_condition, set_phase
from flywheel.policy.decisions import DeletePod, Event, Pass, Relabel, RestartRanks
from flywheel.policy.failures import FailureKind
from flywheel.policy.finish import finish
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import HangReport, ObservedProgress, PodView
from flywheel.policy.pending_timeout import waiting_for_unschedulable
from flywheel.policy.rank_restarts import begin_generation, consequence_window
from flywheel.policy.restart import Action, Decision, Recovery, RestartBudget, decide_restart, recovery
from flywheel.policy.spares import promotable
from flywheel.policy.startup_failure import StartupFailures, after_failure, attempt_is_current, before_first_step
from flywheel.spec.status import ConditionType, Phase, RestartBudgetStatus, StartupFailureStatus, TrainingJobStatus

HUNG_POD_GRACE_SECONDS = 1  # SIGTERM -> SIGKILL for the pods of a job restarted because it hung


def budget_of(status: TrainingJobStatus) -> RestartBudget:
    if status.has_restart_budget:
        return RestartBudget(status.restart_budget.used, status.restart_budget.window_start_step)
    # The schema did not keep the budget: count every restart against it, since the last checkpoint.
    return RestartBudget(status.restarts, status.last_checkpoint.step)


def failure_detail(pod: PodView, kind: FailureKind, now: float) -> str:
    detail = f": {pod.message}" if pod.message else ""
    if pod.disruption is not None and kind is FailureKind.EVICTED:
        return R.MSG_WORKER_DISRUPTED.format(pod=pod.name, kind=kind.value, reason=pod.disruption, detail=detail)
    if pod.phase == "Pending" and pod.waiting_since is not None:
        return R.MSG_WORKER_NOT_STARTING.format(pod=pod.name, kind=kind.value, seconds=now - pod.waiting_since,
                                                reason=pod.reason, detail=detail)
    return R.MSG_WORKER_FAILED.format(pod=pod.name, kind=kind.value, code=pod.exit_code, reason=pod.reason,
                                      detail=detail)


def worker_reason(status: TrainingJobStatus, pod: PodView, progress: ObservedProgress) -> str:
    """The failed worker's own words: its termination message; when that is empty, the progress record's exit
    reason, if the attempt that wrote it began in this generation (until the new group's start, the record is the
    previous group's, whose reason says nothing of this failure)."""
    if pod.message:
        return pod.message
    return progress.failure_reason if attempt_is_current(status, progress) else ""


def record_startup(status: TrainingJobStatus, kind: FailureKind, reason: str,
                   progress: ObservedProgress) -> StartupFailures:
    """Remember the decided failure in `status.startupFailure` (at the job's current step); return the record."""
    was = status.startup_failure
    now = after_failure(StartupFailures(was.reason, was.attempts, was.step), kind, reason, status.step,
                        before_first_step(status, progress))
    status.startup_failure = StartupFailureStatus(reason=now.reason, attempts=now.attempts, step=now.step)
    return now


def restart_reason(reason: str, pod: PodView | None) -> str:
    """status.lastRestartReason: the decision's reason, named as the interruption it was (Hung, XID)."""
    if reason == FailureKind.HANG.value:
        return R.RESTART_HUNG
    if reason == FailureKind.POD_DELETED.value and pod is not None and pod.deleted_for:
        return pod.deleted_for
    return reason


def current_hang(status: TrainingJobStatus, job: JobView) -> HangReport | None:
    """The monitor's hang finding, when it is about this generation of a Running job (else it is stale)."""
    hang = job.findings.hang
    if hang is None or hang.generation != job.generation or status.phase is not Phase.RUNNING:
        return None
    return hang


def in_place(status: TrainingJobStatus, job: JobView, hang: HangReport) -> tuple[list[PodView] | None, str]:
    """Whether a hang (no pod failed) restarts every worker's ranks in place rather than its pods: the pods whose
    agents are asked to (None: recreate the pods), and why not when not.

    In place when every active worker pod of the current generation runs with a live agent (its own liveness key
    held, not lost, its node not lost), at least replicas.min of them -- unless this generation was itself begun by
    such a restart and trained no step since: then a wedged agent or a hang that comes back at once would loop, and
    the pods are recreated."""
    pods = job.current
    if not pods or len(pods) < job.spec.replicas.min:
        return None, ""
    if not all(p.phase == "Running" and p.agent_alive and not p.liveness_lost and not p.node_lost for p in pods):
        return None, ""
    if 0 < status.in_place_restart_generation == job.generation and not hang.stepped:
        return None, R.MSG_HANG_AGAIN
    return pods, ""


def requested_restart(out: Pass, job: JobView) -> Pass | None:
    """A user's restart (REST API or `kubectl annotate`): every worker from the last checkpoint, once per request
    value, without spending the failure budget. None when there is no new request."""
    at = job.restart_requested_at
    status = out.status
    if not at or at == status.restart_request_handled:
        return None
    message = R.MSG_RESTART_REQUESTED.format(at=at)
    status.restart_request_handled = at
    begin_generation(status, job.generation + 1, job.now, merge=False)
    status.last_restart_reason = R.RESTART_REQUESTED
    set_phase(status, Phase.RESTARTING, R.RESTART_REQUESTED, message, job.now)  # also serves a pending hang
    out.events.append(Event("Normal", R.RESTART_REQUESTED, message))
    out.keep_only_force_deletes()
    out.actions += [DeletePod(p.name, p.uid) for p in job.pods if p.deleting_since is None]
    return out


def decide_failure(out: Pass, job: JobView) -> Pass | None:
    """Decide the first failed pod (or the hang): fail the job, or restart it, bumping the generation. None when
    nothing failed."""
    failed = job.failed
    hang = current_hang(out.status, job)
    if not failed and hang is None:
        return None
    if hang is not None:  # the finding is recorded, then (below) answered by the restart or the failure
        set_condition(out.status, ConditionType.HUNG, True, R.HUNG, hang.message, job.now)
        out.events.append(Event("Warning", R.HUNG, hang.message))
    if failed:
        kind = job.failure(failed[0])
        assert kind is not None
        detail = failure_detail(failed[0], kind, job.now)  # with the termination message when there is one
        reason = worker_reason(out.status, failed[0], job.progress)
        if reason and not failed[0].message:  # the worker's own words beat an exit code
            detail = f"{detail}: {reason}"
    else:
        assert hang is not None
        kind, detail, reason = FailureKind.HANG, R.MSG_HANG_DECIDED.format(finding=hang.message), ""
    status = out.status
    startup = record_startup(status, kind, reason, job.progress)
    if startup.deterministic:
        return finish(out, job.pods, Phase.FAILED, startup.label, f"{detail}; {startup.message}", job.now)
    live = sum(1 for p in job.current if p.active and job.failure(p) is None)
    ready_spares = sum(1 for s in job.spares if promotable(s))
    free = waiting_for_unschedulable(job, reason)  # its rendezvous gave up on a peer with no node: not charged
    decision = decide_restart(job.spec, kind, budget_of(status), status.last_checkpoint.step, live, ready_spares,
                              charge=not free)
    status.restart_budget = RestartBudgetStatus(used=decision.budget.used,
                                                window_start_step=decision.budget.window_start_step)
    if recovery(decision.action) is Recovery.END_JOB:
        return finish(out, job.pods, Phase.FAILED, decision.reason, f"{detail}; {decision.message}", job.now)
    if hang is not None and not failed:
        agents, again = in_place(status, job, hang)
        if agents is not None:
            return _restart_ranks(out, job, decision, detail, hang, agents)
        return _restart(out, job, decision, detail, failed, hang, again)
    return _restart(out, job, decision, detail, failed, hang)


def _begin_restart(out: Pass, job: JobView, decision: Decision, detail: str, failed: list[PodView],
                   hang: HangReport | None, note: str, how: str) -> None:
    """The status and the event of a decided restart, however it is carried out (`how`): a new generation, the
    restart counted and named, the Hung condition answered, Restarting; the non-forced deletes decided so far go."""
    status, now = out.status, job.now
    ended = [t for p in failed for t in (p.finished_at, p.deleting_since) if t is not None]
    begin_generation(status, job.generation + 1, now, fault_at=min(ended, default=None), pods=job.pods,
                     window=consequence_window(job.spec.fault_tolerance))
    status.last_restart_reason = restart_reason(decision.reason, failed[0] if failed else None)
    if hang is not None:
        set_condition(status, ConditionType.HUNG, False, R.HANG_RESTARTED,
                      R.MSG_HANG_RESTARTED.format(finding=hang.message), now)
    degraded = condition(status, ConditionType.DEGRADED)
    if degraded is not None and degraded.reason == R.STRAGGLER:
        set_condition(status, ConditionType.DEGRADED, False, R.STRAGGLER_RECOVERED, R.MSG_STRAGGLER_RESTART, now)
    set_phase(status, Phase.RESTARTING, decision.reason, f"{detail}; {note}", now)
    out.events.append(Event("Warning", R.RESTARTING, f"{detail}; {note} ({how})"))
    out.actions = [a for a in out.actions if not isinstance(a, DeletePod) or a.force]


def _restart_ranks(out: Pass, job: JobView, decision: Decision, detail: str, hang: HangReport,
                   agents: list[PodView]) -> Pass:
    """A hang answered in place: the pods of `agents` join the new generation (relabelled, as survivors are), then
    their agents are asked to restart their ranks (they SIGKILL them: a hung rank can take no checkpoint, and
    re-rendezvous); any other pod of the job goes. Counted, named Hung and budgeted as the pod restart would be."""
    generation = job.generation + 1
    _begin_restart(out, job, decision, detail, [], hang,
                   R.MSG_HANG_RESTART_IN_PLACE.format(reason=decision.reason), R.RESTART_IN_PLACE)
    out.status.in_place_restart_generation = generation
    kept = {p.name for p in agents}
    for p in job.pods:
        if p.name in kept:
            out.actions.append(Relabel(p.name, generation))
        elif p.deleting_since is None:
            out.actions.append(DeletePod(p.name, p.uid, grace_seconds=HUNG_POD_GRACE_SECONDS))
    out.actions.append(RestartRanks(generation, hang.message))
    return out


def _restart(out: Pass, job: JobView, decision: Decision, detail: str, failed: list[PodView],
             hang: HangReport | None, note_format: str = "") -> Pass:
    """Record the restart and replace the doomed pods: every one for a job restart (a hang may hold every rank:
    restart all), else the failed ones; the survivors are relabelled to the new generation. `note_format`: what
    the condition and event say of it instead of the decision's message ({reason}: the decision's)."""
    whole = recovery(decision.action) is Recovery.REPLACE_ALL or not failed
    action, note = decision.action, decision.message
    if whole and action is not Action.RESTART_JOB:
        action, note = Action.RESTART_JOB, R.MSG_HANG_RESTART_ALL.format(reason=decision.reason)
    if note_format:
        note = note_format.format(reason=decision.reason)
    _begin_restart(out, job, decision, detail, failed, hang, note, action.value)
    # A hung job cannot take its emergency checkpoint (it is a collective), and a stopped rank would hold the full
    # termination grace: hung pods get a short one. So do the survivors of a lost worker: their collectives wait on
    # a peer that is gone, so their checkpoint cannot complete either.
    peer_lost = any(p.node_lost or p.liveness_lost for p in failed)
    stop_grace = HUNG_POD_GRACE_SECONDS if (hang is not None and not failed) or peer_lost else None
    for p in job.pods:
        if p.deleting_since is None and (whole or job.failure(p) is not None):
            out.actions.append(DeletePod(p.name, p.uid, grace_seconds=stop_grace))
        elif p.deleting_since is None:  # a survivor joins the new generation (worker scope / shrink)
            out.actions.append(Relabel(p.name, job.generation + 1))
    return out
