"""One reconcile pass of a TrainingJob, as a pure function: spec + remembered status + observed pods, progress and
health findings -> the new status and the actions that make the world match it.

The Kubernetes executor (`flywheel/operator/`) observes, calls `reconcile`, writes the returned status once (with
a resourceVersion precondition) and carries the actions out only when that write succeeded. Everything the operator
must remember across its own restarts is in the status it writes, so a killed operator resumes where it stopped:

- `status.workerGeneration` is the worker *generation*: every pod carries the generation it was created for (label
  `flywheel.dev/generation`). A failure is decided only for pods of the current generation; deciding bumps the
  generation (and `restarts`) in the status write, so a pass repeated after a crash sees an older generation and
  only cleans up. `restarts` also counts the ranks the agents restarted in place (policy/rank_restarts.py), which
  leave the generation as it is.
- With `restartScope: job` every pod of an older generation is deleted and recreated; with `worker` (and when an
  elastic job shrinks) only the failed ones are, and the survivors are relabelled to the new generation (they keep
  running; the elastic agent re-rendezvouses with the newcomer). An operator killed between the status write and
  the relabel leaves survivors one generation behind: a later failure of one of them is then replaced without
  being counted (the only non-idempotent window, and it errs towards not failing the job).
- Pods are named per replica index, so a pod can never be duplicated: a missing index is created, a name still
  held by a terminating pod waits until it is gone (force-deleted after `nodeFailureGraceSeconds` on a lost node).

Each step is a policy of its own module; `PRECEDENCE` names the order between those that may decide. The pass also
says when it is next due with nothing else changed (`Pass.next_due`, policy/due.py): the executors run a pass on
every change of what it reads, and otherwise only then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from flywheel.policy import reasons as R
from flywheel.policy.checkpoint_events import checkpoint_posts, event_due
from flywheel.policy.checkpoint_sharing import wait_for_checkpoint_dir
from flywheel.policy.conditions import TERMINAL, condition, iso, set_condition
from flywheel.policy.create_failures import track_create_failures
from flywheel.policy.deadline_ttl import after_finish, deadline
from flywheel.policy.decisions import DeletePod, Event, Pass
from flywheel.policy.drain import drain_ahead
from flywheel.policy.due import next_due
from flywheel.policy.failure_decision import decide_failure, requested_restart
from flywheel.policy.finish import invalid_job, success
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import Observed, PodView
from flywheel.policy.pending_timeout import pending_timeout, track_unschedulable
from flywheel.policy.progress_hang import judge_progress
from flywheel.policy.rank_restarts import consequence_window, count_rank_restarts
from flywheel.policy.running_state import settle
from flywheel.policy.scale_create import clean_up, create_missing
from flywheel.policy.spares import keep_spares, split_roles
from flywheel.policy.spec_change import regroup_if_mixed, track_spec_change
from flywheel.policy.startup_failure import stalled
from flywheel.policy.suspend_resume import resume, suspend
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import (
    CheckpointStatus,
    ConditionType,
    GoodputStatus,
    ReplicaStatus,
    RestoreStatus,
    TrainingJobStatus,
)

LIVENESS_GRACE_SECONDS = 1.0  # a key gone this long while the pod still runs means the agent is gone

__all__ = ["LIVENESS_GRACE_SECONDS", "PRECEDENCE", "Observed", "PodView", "reconcile"]

Step = Callable[[Pass, JobView], Pass | None]

# The policies that may decide a pass, first to last: the first that returns its Pass decides it. An overdue pending
# timeout comes before a failure: a peer's rendezvous gives up on the unschedulable worker, and restarting for it
# (policy/pending_timeout.py) would only put the verdict off.
PRECEDENCE: tuple[Step, ...] = (deadline, success, requested_restart, drain_ahead, pending_timeout, decide_failure)


def reconcile(spec: TrainingJobSpec | None, invalid: str | None, status_in: TrainingJobStatus, observed: Observed,
              now: float) -> Pass:
    """Decide one pass. `spec` is None when the TrainingJob is invalid (`invalid` says why); `observed`: everything
    else the pass reads, with the executor's memory of earlier passes (policy/observed.py)."""
    out = _begin(status_in, observed.generation, now)
    out.hang_reported = observed.hang_reported
    if spec is None:
        decided = invalid_job(out, observed.pods, invalid, now)  # spares included: every pod of the job goes
    else:
        decided = _decide_job(out, _view(spec, status_in, observed, out.status.generation, now), observed.pods)
    return _post_checkpoints(decided, status_in, observed, now)


def _decide_job(out: Pass, job: JobView, pods: list[PodView]) -> Pass:
    """A valid job's pass: the progress judged, the policies, the spares; when it is next due."""
    job = judge_progress(out, job)  # a hang found here is decided in this pass
    decided = keep_spares(_decide(out, job), job)
    remember_own_deletions(decided, pods)
    decided.next_due = next_due(decided.status, job)
    return decided


def _post_checkpoints(out: Pass, status_in: TrainingJobStatus, seen: Observed, now: float) -> Pass:
    """The checkpoint events to post after the actions (policy/checkpoint_events.py); held-back ones make the
    pass due again."""
    progress = seen.progress
    out.checkpoints = checkpoint_posts(progress.checkpoints, progress.checkpoint_notices, seen.checkpoint_events,
                                       status_in, now, finished=out.status.phase in TERMINAL)
    held = event_due(progress.checkpoints, out.checkpoints.memory)
    if held is not None and (out.next_due is None or held < out.next_due):
        out.next_due = held
    return out


def _view(spec: TrainingJobSpec, status_in: TrainingJobStatus, seen: Observed, generation: int,
          now: float) -> JobView:
    """What every policy reads of this pass: the observations split into workers and spares."""
    workers, spares = split_roles(seen.pods)
    return JobView(spec, workers, seen.progress, now, generation, seen.restart_requested_at, seen.findings, spares,
                   seen.usable_nodes - set(seen.drain.nodes), seen.create_failures,
                   frozenset(status_in.deleted_by_operator), spec_generation=seen.generation, sharing=seen.sharing,
                   drain=seen.drain, progress_clock=seen.progress_clock)


def remember_own_deletions(out: Pass, pods: list[PodView]) -> None:
    """status.deletedByOperator: the pods this pass deletes, and those deleted before that are still there."""
    present = {p.uid for p in pods}
    kept = [uid for uid in out.status.deleted_by_operator if uid in present]
    deleted = kept + [a.uid for a in out.actions if isinstance(a, DeletePod) and a.uid and a.uid not in kept]
    if deleted != out.status.deleted_by_operator:
        out.status.deleted_by_operator = deleted


def _decide(out: Pass, job: JobView) -> Pass:
    """Everything but the spares (policy/spares.py), whose count follows whatever this decides."""
    _observe(out.status, job)
    track_unschedulable(out.status, job)
    track_spec_change(out, job)
    track_create_failures(out.status, job)
    out.events += count_rank_restarts(out.status, job.pods, job.generation, job.now,
                                      consequence_window(job.spec.fault_tolerance),
                                      stalled(out.status, job.progress))
    decided = _first_policy(out, job)
    regroup_if_mixed(decided, job)  # whichever policy adds a worker: never beside workers on an older spec
    return decided


def _first_policy(out: Pass, job: JobView) -> Pass:
    """The pass after the observations: the first policy (by precedence) that decides."""
    if out.status.phase in TERMINAL:
        return after_finish(out, job)
    clean_up(out, job)
    if job.spec.suspend:
        return suspend(out, job)
    entry_phase = resume(out, job)
    if out.status.generation != job.generation:  # resumed: the pass decides for the new generation
        job = replace(job, generation=out.status.generation)
    for step in PRECEDENCE:
        decided = step(out, job)
        if decided is not None:
            return decided
    held = wait_for_checkpoint_dir(out, job)  # before any worker is created
    if held is not None:
        return held
    create_missing(out, job)
    return settle(out, job, entry_phase)


def _begin(status_in: TrainingJobStatus, generation: int, now: float) -> Pass:
    """A copy of the remembered status for this pass, with a Created condition (and event) the first time."""
    # Validated again from its dump rather than model_copy(deep=True): the same status, in a quarter of the time
    # (pydantic's core against copy.deepcopy, on every pass of every job).
    out = Pass(TrainingJobStatus.model_validate(status_in.model_dump(by_alias=True)))
    out.status.observed_generation = generation
    if condition(out.status, ConditionType.CREATED) is None:
        set_condition(out.status, ConditionType.CREATED, True, R.CREATED, R.MSG_CREATED, now)
        out.events.append(Event("Normal", R.CREATED, R.MSG_CREATED))
    return out


def _observe(status: TrainingJobStatus, job: JobView) -> None:
    """What the pods and the event log say, as the status shows it."""
    active = [p for p in job.pods if p.active]
    # A worker whose agent holds its liveness key trains, whatever a NotReady node made of its Ready condition.
    status.replicas = ReplicaStatus(desired=job.desired, current=len(active),
                                    ready=sum(1 for p in active if (p.ready or p.agent_alive) and p.phase == "Running"))
    status.world_size = status.world_size  # always written (0 until the event log says)
    progress = job.progress
    if progress.step:
        status.step = progress.step  # the step trained last (it goes back after a restore)
    if progress.world_size:
        status.world_size = progress.world_size
    if progress.eval_step:
        status.eval_step, status.eval_loss = progress.eval_step, progress.eval_loss
    if progress.checkpoint_step >= status.last_checkpoint.step and progress.checkpoint_path:
        status.last_checkpoint = CheckpointStatus(
            step=progress.checkpoint_step, path=progress.checkpoint_path,
            time=iso(progress.checkpoint_time) if progress.checkpoint_time else None)
    if progress.goodput:
        status.goodput = GoodputStatus.model_validate(progress.goodput)
    if progress.last_restore is not None:
        status.last_restore = RestoreStatus(source=progress.last_restore[0], step=progress.last_restore[1])
