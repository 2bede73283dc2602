"""Drain ahead (pure): a worker's node is about to go -- cordoned, tainted by a health or maintenance
controller (NoSchedule/NoExecute with a key in the operator's --drain-taint-keys), or with a fatal GPU XID -- so the
job takes a checkpoint first and the worker is moved, losing no step.

1. A Running job with a current worker on such a node: record `status.drain` {node, cause, startedAt}; spares on
   that node go now (none may be promoted onto it). Warm pods first: unless a ready spare off the leaving nodes
   waits for each worker on the node, spares are started for the drain (`replacements`, beyond spec.replicas.spares;
   the cordon or taint keeps them off the node) and the job trains on until they are ready, for at most
   DRAIN_PREPARE_SECONDS -- a new pod's start (image, imports) would otherwise be a stall of the move. A fatal XID
   does not wait: that GPU may not last.
   Then ask every rank for a checkpoint at its next step boundary (`RequestCheckpoint`: the etcd request key;
   {requestId, requestedAt}). The ranks agree on one step in their per-step collective, save to the memory tier
   (own copy + the peer's replica; a disk save without the tier, or when the move takes some rank's copy and its
   replica both: trainer/checkpoint/request.py), answer {id, step} and stop -- no step is trained
   after the checkpoint.
   The request names the workers it moves (their replica indices): their agents, once their ranks stopped for it,
   wait for their pods' deletion instead of rejoining (agent/drain_hold.py).
2. Once every rank (`status.worldSize`) answered the request: the pods on the node are deleted (their indices go to
   a ready spare through the usual promotion, else to a new pod the cordon or taint keeps off the node), the other
   workers join the new generation, and the job resumes from that checkpoint. One restart in `status.restarts`,
   `lastRestartReason` NodeDraining, no restart budget: a planned move is no failure. The request stays until the
   moved pods are gone (it is what keeps their agents out of the new group); a drain given up deletes it at once.
3. No answer within DRAIN_TIMEOUT_SECONDS (XID_DRAIN_TIMEOUT_SECONDS for a fatal XID: that GPU may never finish
   the step): the worker is moved anyway (from the last checkpoint). A failure or the
   worker leaving the node first ends the drain; the failure is then decided as usual.

Everything is in the status, so passes repeated over operator restarts decide the same; the request is re-sent on
every waiting pass (the executor sends it once per id) and deleted when the drain ends.
"""

from __future__ import annotations

from collections.abc import Mapping

from flywheel.contracts.timefmt import parse_rfc3339, rfc3339
from flywheel.policy import reasons as R
from flywheel.policy.conditions import set_phase
from flywheel.policy.decisions import ClearCheckpointRequest, DeletePod, Event, Pass, Relabel, RequestCheckpoint
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import (
    CORDON_TAINT as CORDON_TAINT,  # re-exported: the operator's drain marks name it
)
from flywheel.policy.observed import (
    DRAIN_TIMEOUT_SECONDS as DRAIN_TIMEOUT_SECONDS,
)
from flywheel.policy.observed import (
    XID_CAUSE as XID_CAUSE,
)
from flywheel.policy.observed import (
    DrainInput as DrainInput,
)
from flywheel.policy.observed import (
    NodeMarks as NodeMarks,
)
from flywheel.policy.observed import (
    PodView,
)
from flywheel.policy.rank_restarts import begin_generation
from flywheel.policy.spares import promotable, spare_failed
from flywheel.spec.status import DrainStatus, Phase, TrainingJobStatus

XID_DRAIN_TIMEOUT_SECONDS = 10.0  # a GPU with a fatal XID may never finish the step: do not wait long for it
# A replacement pod's start (image pull, imports, its warm zygote) takes seconds to minutes; the job trains on
# meanwhile and its memory checkpoints cover the node going sooner.
DRAIN_PREPARE_SECONDS = 120.0
MOVE_GRACE_SECONDS = 1  # the moved pod's ranks already stopped after their checkpoint: nothing to wait for
# Every field set: the merge patch clears the recorded drain.
NO_DRAIN = DrainStatus(node="", cause="", request_id="", requested_at="", started_at="", replacements=0)


def drain_ahead(out: Pass, job: JobView) -> Pass | None:
    """Start, follow or end a drain; the Pass when this pass moved the worker (a restart decided), else None."""
    seen = job.drain
    if out.status.drain.node:
        return _follow(out, job, seen)
    if seen.request_id and not _moved_pods_left(job):  # a move's request, or one left by an operator stopped
        out.actions.append(ClearCheckpointRequest())
    if out.status.phase is not Phase.RUNNING or job.failed:
        return None
    node = _draining_node(job, seen)
    if node is not None:
        _begin(out, job, node, seen.nodes[node], seen)
    return None


def _draining_node(job: JobView, seen: DrainInput) -> str | None:
    nodes = sorted({p.node for p in job.current if p.active and p.node and p.node in seen.nodes
                    and seen.nodes[p.node].cause is not None})
    return nodes[0] if nodes else None


def _moved_pods_left(job: JobView) -> bool:
    """Pods of an older generation are still there: a move's request keeps their agents out of the new group."""
    return any(p.generation < job.generation for p in job.pods)


def _on(job: JobView, node: str) -> list[PodView]:
    return [p for p in job.current if p.active and p.node == node]


def _names(pods: list[PodView]) -> str:
    return ", ".join(p.name for p in pods) or "(none left)"


def _leaving(seen: DrainInput, node: str) -> set[str]:
    return {node} | {n for n, marks in seen.nodes.items() if marks.cause is not None}


def _staying_spares(job: JobView, away_from: set[str]) -> list[PodView]:
    """The spares not going (deleted, failed) and on none of `away_from` (or not placed yet)."""
    return [s for s in job.spares if s.node not in away_from and s.deleting_since is None and not spare_failed(s)]


def _spares_off(job: JobView, seen: DrainInput, node: str) -> list[PodView]:
    """The spares a worker on `node` may move to: on none of the leaving nodes."""
    return _staying_spares(job, _leaving(seen, node))


def _begin(out: Pass, job: JobView, node: str, marks: NodeMarks, seen: DrainInput) -> None:
    """Record the drain; ask for the checkpoint now, or once warm pods wait for the node's workers."""
    out.actions += [DeletePod(s.name, s.uid) for s in job.spares if s.node == node and s.deleting_since is None]
    moving = _on(job, node)
    spares = _spares_off(job, seen, node)
    ready = [s for s in spares if promotable(s)]
    # The spares the job keeps anyway (spec.replicas.spares) are recreated off the node when those on it go: only
    # the workers beyond them and the spares already off it need one started for the drain.
    kept = _staying_spares(job, {node})
    new = max(0, len(moving) - len(spares) - max(0, job.spec.replicas.spares - len(kept)))
    at_once = bool(marks.fatal_xid) or len(ready) >= len(moving)
    out.status.drain = DrainStatus(node=node, cause=marks.cause or "", started_at=rfc3339(job.now),
                                   replacements=0 if at_once else new)
    if at_once:
        _ask(out, job)
        return
    out.events.append(Event("Normal", R.NODE_DRAINING, R.MSG_DRAIN_PREPARING.format(
        node=node, cause=out.status.drain.cause, count=len(moving) - len(ready), pods=_names(moving), new=new,
        seconds=DRAIN_PREPARE_SECONDS)))


def _ask(out: Pass, job: JobView) -> None:
    drain = out.status.drain
    request_id = f"{drain.node}-g{job.generation}-{int(job.now * 1000)}"
    out.status.drain = drain.model_copy(update={"request_id": request_id, "requested_at": rfc3339(job.now)})
    out.actions.append(_request(job, out.status.drain))
    out.events.append(Event("Normal", R.NODE_DRAINING, R.MSG_DRAIN_REQUESTED.format(
        node=drain.node, cause=drain.cause, request=request_id, pods=_names(_on(job, drain.node)))))


def _prepare(out: Pass, job: JobView, seen: DrainInput) -> None:
    """Waiting for warm pods: ask for the checkpoint once a ready spare off the leaving nodes waits for each worker
    on the node, or once DRAIN_PREPARE_SECONDS are over (a drain recorded without a start asks at once)."""
    drain = out.status.drain
    moving = _on(job, drain.node)
    ready = [s for s in _spares_off(job, seen, drain.node) if promotable(s)]
    started = parse_rfc3339(drain.started_at)
    if started is not None and len(ready) < len(moving):
        if job.now - started < DRAIN_PREPARE_SECONDS:
            return
        out.events.append(Event("Warning", R.NODE_DRAINING, R.MSG_DRAIN_UNPREPARED.format(
            node=drain.node, cause=drain.cause, count=len(moving) - len(ready), seconds=DRAIN_PREPARE_SECONDS,
            pods=_names(moving))))
    _ask(out, job)


def answered_step(status_world_size: int, request_id: str, answers: Mapping[int, tuple[str, int]]) -> int | None:
    """The step every rank holds for `request_id`, once all `status_world_size` ranks answered it; else None."""
    steps = [step for rid, step in answers.values() if rid == request_id]
    if status_world_size <= 0 or len(steps) < status_world_size:
        return None
    return min(steps)


def _follow(out: Pass, job: JobView, seen: DrainInput) -> Pass | None:
    drain = out.status.drain
    on_node = _on(job, drain.node)
    step = answered_step(out.status.world_size, drain.request_id, seen.answers) if drain.request_id else None
    if step is not None:
        return _move(out, job, R.MSG_DRAIN_MOVED.format(node=drain.node, cause=drain.cause, step=step,
                                                        pods=_names(on_node)), answered=True)
    failed = [p for p in job.failed if p.node != drain.node or not p.active]
    if failed or not on_node:
        why = f"worker {failed[0].name} failed first" if failed else "no worker of the job is on it any more"
        _end(out, R.MSG_DRAIN_ABANDONED.format(node=drain.node, cause=drain.cause, why=why), "Warning")
        return None
    if not drain.request_id:
        _prepare(out, job, seen)
        return None
    requested = parse_rfc3339(drain.requested_at) or job.now
    bound = _bound(drain, seen.timeout_seconds)
    if job.now - requested >= bound:
        return _move(out, job, R.MSG_DRAIN_TIMED_OUT.format(node=drain.node, cause=drain.cause, seconds=bound,
                                                            pods=_names(on_node)))
    out.actions.append(_request(job, drain))
    return None


def _request(job: JobView, drain: DrainStatus) -> RequestCheckpoint:
    moving = tuple(sorted(p.index for p in _on(job, drain.node)))
    return RequestCheckpoint(drain.request_id, f"node {drain.node} {drain.cause}", moving)


def _bound(drain: DrainStatus, timeout_seconds: float) -> float:
    """How long a drain waits for the ranks' answers before it moves the worker anyway."""
    return min(timeout_seconds, XID_DRAIN_TIMEOUT_SECONDS) if drain.cause.startswith(XID_CAUSE) else timeout_seconds


def drain_due(status: TrainingJobStatus, timeout_seconds: float = DRAIN_TIMEOUT_SECONDS) -> float | None:
    """When a drain waiting for warm pods asks for its checkpoint anyway, or one waiting for its answers moves the
    worker anyway (policy/due.py); None: no drain."""
    drain = status.drain
    if drain.node and not drain.request_id:
        started = parse_rfc3339(drain.started_at)
        return None if started is None else started + DRAIN_PREPARE_SECONDS
    requested = parse_rfc3339(drain.requested_at) if drain.request_id else None
    return None if requested is None else requested + _bound(drain, timeout_seconds)


def _end(out: Pass, message: str, kind: str, *, keep_request: bool = False) -> None:
    out.status.drain = NO_DRAIN.model_copy()
    if not keep_request:  # a kept one is deleted once the moved pods are gone (drain_ahead)
        out.actions.append(ClearCheckpointRequest())
    out.events.append(Event("Warning" if kind == "Warning" else "Normal", R.NODE_DRAINING, message))


def _move(out: Pass, job: JobView, message: str, *, answered: bool = False) -> Pass:
    """The worker(s) on the node go (to a spare or a new pod, next pass); the others join the new generation. One
    restart, no budget. A request every rank answered stays until the moved pods are gone; one not answered goes
    now (the new group's ranks would otherwise take it for theirs)."""
    status, node = out.status, out.status.drain.node
    begin_generation(status, job.generation + 1, job.now)
    status.last_restart_reason = R.NODE_DRAINING
    set_phase(status, Phase.RESTARTING, R.NODE_DRAINING, message, job.now)
    _end(out, message, "Normal", keep_request=answered)
    for p in job.pods:
        if p.deleting_since is not None:
            continue
        if p.node == node or job.failure(p) is not None:  # a rank that stopped after the checkpoint may be done
            out.actions.append(DeletePod(p.name, p.uid, grace_seconds=MOVE_GRACE_SECONDS))
        else:
            out.actions.append(Relabel(p.name, job.generation + 1))
    out.actions += [DeletePod(s.name, s.uid) for s in job.spares if s.node == node and s.deleting_since is None]
    return out
