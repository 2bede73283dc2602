"""Warm spare workers (`spec.replicas.spares`, pure): keep that many spare pods, and fill a worker's place by
promoting a ready spare instead of creating a cold pod.

A spare is started like a worker (image pulled, trainer imported in its warm zygote, etcd lease held) but has no
replica index and stays out of the rendezvous; the pass keeps spares apart from the workers (`split_roles`), so a
spare never counts for success, failure, ranks or the ready workers.

- Promotion replaces `create_missing`'s CreatePod: a replica index without an active pod goes to a ready spare,
  one on a node none of the other workers use first. In a running group (worker scope, an elastic shrink) an index
  whose old pod is still terminating is filled at once -- the spare has its own name, and the old pod's agent is
  leaving (SIGTERM) -- so no terminating pod is in the critical path. A whole new group (job restart, resume) still
  waits for the old group to be gone, since it starts on a fresh rendezvous that the promoted agent must not join
  before the reset.
- Spares survive generations: they never joined a rendezvous, so a job restart has nothing to undo in them; a spare
  of an older generation is only relabelled to the current one.
- A spare created with an older spec than the job's (an edit since, policy/spec_change.py) goes like a failed one.
- A spare that failed goes and a new one is created behind every promoted or failed spare (`<job>-spare-<n>`, n
  counted in status.nextSpare and never reused). Spares above the count go, not-ready ones first; every spare goes
  when the job finishes or is suspended. New spares are created while the job is not Restarting: a spare's start
  does not compete with a recovery. The count is spec.replicas.spares, plus a drain's replacements while it
  waits for them (policy/drain.py), plus the ready spares that replica indices without a worker wait for (a moved
  or lost worker's index is filled a pass or two later, once its old group is gone): a ready spare is never
  deleted as an extra while an index waits for it.
- A worker pod still holding its spare key was relabelled but its agent never got the promotion (the operator
  stopped between the two): it is promoted again (the promotion is idempotent).
"""

from __future__ import annotations

from collections.abc import Sequence

from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreatePod, CreateSpare, DeletePod, Event, Pass, PromoteSpare, Relabel
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import PodView
from flywheel.policy.spare_placement import beside_worker, move_spare, spare_number
from flywheel.policy.spec_change import on_older_spec
from flywheel.spec.status import Phase

ENDED_PHASES = (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED)


def split_roles(pods: Sequence[PodView]) -> tuple[list[PodView], list[PodView]]:
    """(workers, spares) of a job's observed pods."""
    return [p for p in pods if not p.is_spare], [p for p in pods if p.is_spare]


def spare_failed(spare: PodView) -> bool:
    return spare.phase in ("Failed", "Succeeded") or spare.node_lost or spare.liveness_lost


def promotable(spare: PodView) -> bool:
    """Warm and waiting: running, not going away, and its agent holds a ready spare key."""
    return spare.spare_ready and spare.deleting_since is None and spare.phase == "Running" and not spare_failed(spare)


def promotions(job: JobView, indices: Sequence[int]) -> list[PromoteSpare]:
    """Ready spares for `indices` (in order), while they last: a spare on a node none of the job's active workers
    use first, so that a lost node takes as few replicas with it as possible."""
    busy = {p.node for p in job.pods if p.active and p.node}
    ready = sorted((s for s in job.spares if promotable(s)), key=lambda s: (s.node in busy, s.name))
    return [PromoteSpare(s.name, i, job.generation) for s, i in zip(ready, indices, strict=False)]


def promoted_events(out: Pass, job: JobView, promoted: Sequence[PromoteSpare]) -> None:
    """A SparePromoted event per promotion, naming the worker it replaces and why that one went."""
    reason = out.status.last_restart_reason or R.MSG_NO_REASON
    for p in promoted:
        old = next((w.name for w in job.pods if w.index == p.index), None)
        message = (R.MSG_SPARE_PROMOTED.format(spare=p.name, index=p.index, pod=old, reason=reason) if old
                   else R.MSG_SPARE_PROMOTED_GONE.format(spare=p.name, index=p.index, reason=reason))
        out.events.append(Event("Normal", R.SPARE_PROMOTED, message))


def keep_spares(out: Pass, job: JobView) -> Pass:
    """Keep `spec.replicas.spares` spare pods (none once the job ended), at the current generation; repeat an
    interrupted promotion; write status.spares (the ready ones)."""
    status = out.status
    generation = status.generation  # a restart decided in this pass already bumped it
    out.actions += [PromoteSpare(p.name, p.index, p.generation) for p in job.pods
                    if p.spare_ready and p.active and p.index >= 0]
    promoted = {a.name for a in out.actions if isinstance(a, PromoteSpare)}
    node_grace = job.spec.fault_tolerance.node_failure_grace_seconds
    deleted = {a.uid for a in out.actions if isinstance(a, DeletePod)}  # this pass's (a drain's) deletions
    older_spec = {s.uid for s in on_older_spec(job, job.spares)}  # created before an edit: replaced
    kept: list[PodView] = []
    for s in job.spares:
        if s.uid in deleted:
            continue
        if s.deleting_since is not None:
            if s.node_lost and job.now - s.deleting_since >= node_grace:
                out.actions.append(DeletePod(s.name, s.uid, force=True))
        elif s.name in promoted:
            continue
        elif spare_failed(s) or status.phase in ENDED_PHASES or s.uid in older_spec:
            out.actions.append(DeletePod(s.name, s.uid))
        else:
            kept.append(s)
    wanted = 0 if status.phase in ENDED_PHASES else (
        job.spec.replicas.spares + status.drain.replacements
        + min(len(_waiting_indices(out, job, deleted)), sum(1 for s in kept if promotable(s))))
    wanted += move_spare(out, job, kept, {s.name for s in kept if promotable(s)})
    # Extras go: those not ready first, then those beside a worker, then the oldest.
    kept.sort(key=lambda s: (not promotable(s), beside_worker(job, s), -spare_number(s.name)))
    for s in kept[wanted:]:
        out.actions.append(DeletePod(s.name, s.uid))
    kept = kept[:wanted]
    out.actions += [Relabel(s.name, generation) for s in kept if s.generation != generation]
    # A new spare waits for the job to train again: its start (imports, a zygote) would compete for the CPU of a
    # node it shares with workers, and a recovery under way already has the spare it could use.
    for _ in range(0 if status.phase is Phase.RESTARTING else wanted - len(kept)):
        out.actions.append(CreateSpare(status.next_spare, generation))
        status.next_spare += 1
    status.spares = sum(1 for s in kept if promotable(s))
    return out


def _waiting_indices(out: Pass, job: JobView, deleted: set[str]) -> set[int]:
    """Replica indices that no worker holds (or whose worker this pass deletes: `deleted` uids) and that this pass
    fills neither with a promotion nor with a new pod: a ready spare will take each, once the old group is gone."""
    held = {p.index for p in job.pods if p.active and p.uid not in deleted}
    filled = {a.index for a in out.actions if isinstance(a, (PromoteSpare, CreatePod))}
    return set(range(job.desired)) - held - filled
