"""One reconcile pass of a TrainingJob, as a pure function: spec + remembered status + observed pods -> the new
status and the actions that make the world match it.

The Kubernetes executor (`flywheel/operator/`) observes, calls `reconcile`, writes the returned status once (with
a resourceVersion precondition) and carries the actions out only when that write succeeded. Everything the operator
must remember across its own restarts is in the status it writes, so a killed operator resumes where it stopped:

- `status.restarts` is also the worker *generation*: every pod carries the generation it was created for (label
  `flywheel.dev/generation`). A failure is decided only for pods of the current generation; deciding bumps the
  generation in the status write, so a pass repeated after a crash sees an older generation and only cleans up.
- With `restartScope: job` every pod of an older generation is deleted and recreated; with `worker` (and when an
  elastic job shrinks) only the failed ones are, and the survivors are relabelled to the new generation (they keep
  running; the elastic agent re-rendezvouses with the newcomer). An operator killed between the status write and
  the relabel leaves survivors one generation behind: a later failure of one of them is then replaced without
  being counted (the only non-idempotent window, and it errs towards not failing the job).
- Pods are named per replica index, so a pod can never be duplicated: a missing index is created, a name still
  held by a terminating pod waits until it is gone (force-deleted after `nodeFailureGraceSeconds` on a lost node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flywheel.policy import reasons as R
from flywheel.policy.checkpoint_events import CommittedCheckpoint
from flywheel.policy.conditions import condition, iso, parse_iso, set_condition, set_phase
from flywheel.policy.failures import FailureKind, classify_pod, classify_waiting
from flywheel.policy.restart import Action, RestartBudget, decide_restart
from flywheel.spec import TrainingJobSpec

TERMINAL = ("Succeeded", "Failed")
LIVENESS_GRACE_SECONDS = 1.0  # a key gone this long while the pod still runs means the agent is gone
HUNG_POD_GRACE_SECONDS = 1  # SIGTERM -> SIGKILL for the pods of a job restarted because it hung


@dataclass(frozen=True)
class PodView:
    """What one observed worker pod means for the job (built by the executor from the Pod object)."""

    name: str
    uid: str
    index: int
    generation: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool = False
    deleting_since: float | None = None  # unix time of metadata.deletionTimestamp
    node_lost: bool = False  # bound to a node that is not Ready
    reason: str | None = None  # container terminated/waiting reason, or the pod's reason
    exit_code: int | None = None
    unschedulable_since: float | None = None
    liveness_lost: bool = False  # its etcd liveness key vanished while the pod still ran
    finished_at: float | None = None  # when its container terminated (the failure's time, for metrics)
    message: str | None = None  # the container's waiting message (why it cannot start)
    waiting_since: float | None = None  # its container is waiting (not started yet) since then
    disruption: str | None = None  # reason of a True DisruptionTarget condition (preempted, evicted)

    @property
    def active(self) -> bool:
        return self.deleting_since is None and self.phase in ("Pending", "Running", "Unknown")


@dataclass(frozen=True)
class Progress:
    """Training progress read from the job's event log (see flywheel/operator/event_log.py)."""

    step: int = 0
    world_size: int = 0
    checkpoint_step: int = 0
    checkpoint_time: float | None = None
    checkpoint_path: str = ""
    done: bool = False
    goodput: dict[str, Any] = field(default_factory=dict)
    # (time of the first step after a restart, seconds since the last step before it), oldest first.
    recoveries: tuple[tuple[float, float], ...] = ()
    checkpoints: tuple[CommittedCheckpoint, ...] = ()  # the most recent committed checkpoints, oldest first


@dataclass(frozen=True)
class CreatePod:
    index: int
    generation: int


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str
    force: bool = False
    grace_seconds: int | None = None  # None: the pod's terminationGracePeriodSeconds


@dataclass(frozen=True)
class Relabel:
    name: str
    generation: int


@dataclass(frozen=True)
class DeleteJob:
    pass


@dataclass(frozen=True)
class ResetRendezvous:
    """Forget the run's rendezvous state before an entirely new set of workers starts (after a job restart or a
    resume): otherwise the new agents wait for the old participants' heartbeats to expire (keep_alive_interval x
    keep_alive_max_attempt, 6 s) before their group forms. Only when no pod of the job exists any more."""


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Pass:
    status: dict[str, Any]
    actions: list[CreatePod | DeletePod | Relabel | DeleteJob | ResetRendezvous] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


__all__ = ["CreatePod", "DeleteJob", "DeletePod", "Event", "Pass", "PodView", "Progress", "Relabel",
           "ResetRendezvous", "condition", "iso", "parse_iso", "reconcile", "set_condition"]


def _budget(status: dict[str, Any]) -> RestartBudget:
    saved = status.get("restartBudget")
    if isinstance(saved, dict):
        return RestartBudget(int(saved.get("used", 0)), int(saved.get("windowStartStep", 0)))
    # The schema did not keep the budget: count every restart against it, since the last checkpoint.
    return RestartBudget(int(status.get("restarts", 0)), int(status.get("lastCheckpoint", {}).get("step", 0)))


def _failure_of(pod: PodView, now: float, start_grace: float) -> FailureKind | None:
    """The failure `pod` shows at `now`, or None. `start_grace`: how long a container may wait on a retryable start
    failure (an image pull error, a missing Secret or ConfigMap) first: the job's startFailureGraceSeconds."""
    if pod.phase == "Succeeded":
        return None
    if pod.liveness_lost or pod.node_lost:
        return FailureKind.NODE_LOST
    if pod.disruption is not None:
        return classify_pod(pod.phase, pod.reason, pod.exit_code, disruption=True)
    if pod.phase == "Pending" and pod.waiting_since is not None:
        return classify_waiting(pod.reason, now - pod.waiting_since, start_grace)
    if pod.phase != "Failed":
        return None
    return classify_pod(pod.phase, pod.reason, pod.exit_code) or FailureKind.CRASH


def _failure_detail(pod: PodView, kind: FailureKind, now: float) -> str:
    detail = f": {pod.message}" if pod.message else ""
    if pod.disruption is not None and kind is FailureKind.EVICTED:
        return R.MSG_WORKER_DISRUPTED.format(pod=pod.name, kind=kind.value, reason=pod.disruption, detail=detail)
    if pod.phase == "Pending" and pod.waiting_since is not None:
        return R.MSG_WORKER_NOT_STARTING.format(pod=pod.name, kind=kind.value, seconds=now - pod.waiting_since,
                                                reason=pod.reason, detail=detail)
    return R.MSG_WORKER_FAILED.format(pod=pod.name, kind=kind.value, code=pod.exit_code, reason=pod.reason)


def _progress_status(status: dict[str, Any], progress: Progress) -> None:
    if progress.step:
        status["step"] = progress.step  # the step trained last (it goes back after a restore)
    if progress.world_size:
        status["worldSize"] = progress.world_size
    if progress.checkpoint_step >= int(status.get("lastCheckpoint", {}).get("step", 0)) and progress.checkpoint_path:
        status["lastCheckpoint"] = {"step": progress.checkpoint_step, "path": progress.checkpoint_path,
                                    "time": iso(progress.checkpoint_time) if progress.checkpoint_time else None}
    if progress.goodput:
        status["goodput"] = dict(progress.goodput)


def _finish(out: Pass, pods: list[PodView], phase: str, reason: str, message: str, now: float) -> Pass:
    set_phase(out.status, phase, reason, message, now)
    out.actions += [DeletePod(p.name, p.uid) for p in pods if p.active]
    out.events.append(Event("Normal" if phase == "Succeeded" else "Warning", reason, message))
    return out


def reconcile(spec: TrainingJobSpec | None, invalid: str | None, status_in: dict[str, Any], pods: list[PodView],
              progress: Progress, now: float, generation: int = 0, restart_requested_at: str | None = None) -> Pass:
    """Decide one pass. `spec` is None when the TrainingJob is invalid (`invalid` says why).
    `restart_requested_at`: the job's flywheel.dev/restart-requested-at annotation (REST API `restart`)."""
    status: dict[str, Any] = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                              for k, v in status_in.items()}
    status["conditions"] = [dict(c) for c in status_in.get("conditions", [])]
    status["observedGeneration"] = generation
    out = Pass(status)
    if condition(status, "Created") is None:
        set_condition(status, "Created", True, R.CREATED, R.MSG_CREATED, now)
        out.events.append(Event("Normal", R.CREATED, R.MSG_CREATED))

    if spec is None:
        if status.get("phase") != "Failed":
            set_condition(status, "Invalid", True, R.INVALID, invalid or "", now)
            return _finish(out, pods, "Failed", R.INVALID, invalid or R.INVALID, now)
        return out

    desired = spec.replicas.desired
    current_gen = int(status.get("restarts", 0))
    mine = [p for p in pods if p.index < desired or not p.active]
    status["replicas"] = {"desired": desired,
                          "current": sum(1 for p in pods if p.active),
                          "ready": sum(1 for p in pods if p.active and p.ready and p.phase == "Running")}
    status.setdefault("worldSize", 0)
    _progress_status(status, progress)

    phase = status.get("phase", "Pending")
    if phase in TERMINAL:
        return _after_finish(out, spec, pods, now)

    # Pods of an older generation: leftovers of a decided failure; never decided again.
    scope_job = spec.fault_tolerance.restart_scope == "job"
    # Hangs and requested restarts restart every worker.
    hang_restart = status.get("lastRestartReason") in (FailureKind.HANG.value, R.RESTART_REQUESTED)
    start_grace = spec.fault_tolerance.start_failure_grace_seconds

    def failure(p: PodView) -> FailureKind | None:  # this job's start-failure grace, at this pass's time
        return _failure_of(p, now, start_grace)

    grace = spec.fault_tolerance.node_failure_grace_seconds
    for p in pods:
        if p.deleting_since is not None:
            if (p.node_lost or p.liveness_lost) and now - p.deleting_since >= grace:
                out.actions.append(DeletePod(p.name, p.uid, force=True))
                out.events.append(Event("Warning", R.FORCE_DELETED, R.MSG_FORCE_DELETED.format(pod=p.name)))
        elif p.index >= desired or (p.generation < current_gen and (scope_job or failure(p) is not None
                                                                      or hang_restart)):
            out.actions.append(DeletePod(p.name, p.uid))

    if spec.suspend:
        out.actions = [a for a in out.actions if isinstance(a, DeletePod) and a.force]
        out.actions += [DeletePod(p.name, p.uid) for p in pods if p.deleting_since is None and p.phase != "Succeeded"]
        if phase != "Suspended":
            out.events.append(Event("Normal", R.SUSPENDED, R.MSG_SUSPENDED))
        set_phase(status, "Suspended", R.SUSPENDED, R.MSG_SUSPENDED, now)  # Hung False: no restart on resume
        if restart_requested_at:  # resuming starts fresh workers anyway: the request is served
            status["restartRequestHandled"] = restart_requested_at
        return out
    if phase == "Suspended":
        set_condition(status, "Suspended", False, R.RESUMED, R.MSG_RESUMED, now)
        out.events.append(Event("Normal", R.RESUMED, R.MSG_RESUMED))
        phase = "Pending"

    created = parse_iso((condition(status, "Created") or {}).get("lastTransitionTime")) or now
    deadline = spec.run_policy.active_deadline_seconds
    if deadline is not None and now - created > deadline:
        return _finish(out, pods, "Failed", R.DEADLINE, R.MSG_DEADLINE.format(seconds=deadline), now)

    current = [p for p in mine if p.generation == current_gen and p.deleting_since is None]
    if any(p.phase == "Succeeded" for p in current) or progress.done:
        if not any(p.phase in ("Running", "Pending") and p.index < desired for p in current):
            done = R.MSG_SUCCEEDED.format(step=status.get("step", 0))  # no event log: no step
            return _finish(out, pods, "Succeeded", R.SUCCEEDED, done, now)
        # Finishing: the other workers are exiting; replace nothing.
        set_phase(status, "Running", R.RUNNING, R.MSG_RUNNING.format(ready=status["replicas"]["ready"]), now,
                  refresh=False)
        return out

    if restart_requested_at and restart_requested_at != status.get("restartRequestHandled"):
        return _requested_restart(out, pods, restart_requested_at, current_gen, now)

    # A pod preempted or evicted (DisruptionTarget) is being deleted by someone else: still a failure to decide.
    disrupted = [p for p in mine if p.generation == current_gen and p.deleting_since is not None and p.disruption]
    failed = sorted((p for p in current + disrupted if failure(p) is not None), key=lambda p: p.index)
    # A True Hung condition is the health monitor's restart request (policy/health_status.py).
    hung = condition(status, "Hung")
    hang = str(hung.get("message", "")) if hung is not None and hung.get("status") == "True" else None
    if failed or hang is not None:
        if failed:
            pod = failed[0]
            kind = failure(pod)
            assert kind is not None
            detail = _failure_detail(pod, kind, now)
        else:
            kind, detail = FailureKind.HANG, R.MSG_HANG_DECIDED.format(finding=hang)
        live = sum(1 for p in current if p.active and failure(p) is None)
        decision = decide_restart(spec, kind, _budget(status), int(status.get("lastCheckpoint", {}).get("step", 0)),
                                  live)
        status["restartBudget"] = {"used": decision.budget.used, "windowStartStep": decision.budget.window_start_step}
        if decision.action is Action.FAIL:
            return _finish(out, pods, "Failed", decision.reason, f"{detail}; {decision.message}", now)
        # The doomed pods: job scope -> all; otherwise the failed ones (each deleted once the status is written).
        whole = decision.action is Action.RESTART_JOB or not failed  # a hang may hold every rank: restart all
        action, note = decision.action, decision.message
        if whole and action is not Action.RESTART_JOB:
            action, note = Action.RESTART_JOB, R.MSG_HANG_RESTART_ALL.format(reason=decision.reason)
        status["restarts"] = current_gen + 1
        status["lastRestartReason"] = decision.reason
        if hang is not None:
            set_condition(status, "Hung", False, R.HANG_RESTARTED, R.MSG_HANG_RESTARTED.format(finding=hang), now)
        if (condition(status, "Degraded") or {}).get("reason") == R.STRAGGLER:
            set_condition(status, "Degraded", False, R.STRAGGLER_RECOVERED, R.MSG_STRAGGLER_RESTART, now)
        set_phase(status, "Restarting", decision.reason, f"{detail}; {note}", now)
        out.events.append(Event("Warning", R.RESTARTING, f"{detail}; {note} ({action.value})"))
        out.actions = [a for a in out.actions if not isinstance(a, DeletePod) or a.force]
        # A hung job cannot take its emergency checkpoint (it is a collective), and a stopped rank would hold
        # the full termination grace: hung pods get a short one. So do the survivors of a lost worker: their
        # collectives wait on a peer that is gone, so their checkpoint cannot complete either.
        peer_lost = any(p.node_lost or p.liveness_lost for p in failed)
        grace = HUNG_POD_GRACE_SECONDS if (hang is not None and not failed) or peer_lost else None
        for p in pods:
            if p.deleting_since is None and (whole or failure(p) is not None):
                out.actions.append(DeletePod(p.name, p.uid, grace_seconds=grace))
            elif p.deleting_since is None:  # a survivor joins the new generation (worker scope / shrink)
                out.actions.append(Relabel(p.name, current_gen + 1))
        return out

    held = {p.index for p in pods}  # a name is reused only once its old pod is gone
    creates = [CreatePod(i, current_gen) for i in range(desired) if i not in held]
    if creates and not any(p.generation >= current_gen for p in pods):
        # A whole new group (job restart, resume): start it once the old group is gone -- pods on a lost node
        # or without liveness excepted -- on a fresh rendezvous, so that it forms at once.
        if any(not (p.node_lost or p.liveness_lost) for p in pods):
            creates = []
        elif current_gen > 0 or condition(status, "Suspended") is not None:
            out.actions.append(ResetRendezvous())
    out.actions += creates

    ready = status["replicas"]["ready"]
    pending_since = [p.unschedulable_since for p in current if p.unschedulable_since is not None]
    unsched = bool(pending_since) and now - min(pending_since) >= spec.fault_tolerance.node_failure_grace_seconds
    set_condition(status, "Unschedulable", unsched, R.UNSCHEDULABLE, R.MSG_UNSCHEDULABLE, now)
    running_enough = ready >= spec.replicas.min and ready > 0
    if running_enough:
        set_phase(status, "Running", R.RUNNING, R.MSG_RUNNING.format(ready=ready), now)
        # The health monitor owns Degraded for stragglers while every desired worker is ready.
        straggler = (condition(status, "Degraded") or {}).get("reason") in (R.STRAGGLER, R.STRAGGLER_RECOVERED)
        if ready < desired or not straggler:
            set_condition(status, "Degraded", ready < desired, R.DEGRADED,
                          R.MSG_DEGRADED.format(ready=ready, desired=desired), now)
    else:
        # Not (or no longer) enough workers: Restarting keeps naming the failure that started it.
        set_phase(status, "Restarting" if current_gen > 0 else "Pending", R.WAITING,
                  R.MSG_WAITING.format(ready=ready, desired=desired, min=spec.replicas.min), now, refresh=False)
    if status["phase"] == "Running" and phase != "Running":
        out.events.append(Event("Normal", R.RUNNING, R.MSG_RUNNING.format(ready=ready)))
    return out


def _requested_restart(out: Pass, pods: list[PodView], requested_at: str, current_gen: int, now: float) -> Pass:
    """A user's restart (REST API or `kubectl annotate`): every worker from the last checkpoint, once per request
    value, without spending the failure budget."""
    status = out.status
    message = R.MSG_RESTART_REQUESTED.format(at=requested_at)
    status["restartRequestHandled"] = requested_at
    status["restarts"] = current_gen + 1
    status["lastRestartReason"] = R.RESTART_REQUESTED
    set_phase(status, "Restarting", R.RESTART_REQUESTED, message, now)  # also serves a pending Hung request
    out.events.append(Event("Normal", R.RESTART_REQUESTED, message))
    out.actions = [a for a in out.actions if isinstance(a, DeletePod) and a.force]
    out.actions += [DeletePod(p.name, p.uid) for p in pods if p.deleting_since is None]
    return out


def _after_finish(out: Pass, spec: TrainingJobSpec, pods: list[PodView], now: float) -> Pass:
    status = out.status
    out.actions += [DeletePod(p.name, p.uid) for p in pods if p.active]
    for p in pods:
        if p.deleting_since is not None and p.node_lost and \
                now - p.deleting_since >= spec.fault_tolerance.node_failure_grace_seconds:
            out.actions.append(DeletePod(p.name, p.uid, force=True))
    ttl = spec.run_policy.ttl_seconds_after_finished
    finished = parse_iso((condition(status, status["phase"]) or {}).get("lastTransitionTime"))
    if ttl is not None and finished is not None and now - finished >= ttl:
        out.actions.append(DeleteJob())
    return out
