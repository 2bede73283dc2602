"""Spare placement (pure): a ready spare that shares a node with a worker is moved to a node without the job's pods.

A spare is created with a preferred anti-affinity away from the workers, but one created while a node is down (the
node a promoted spare left, in a small pool) lands beside a worker and would stay there: a loss of that node then
takes the worker and its replacement at once, and the job pays a cold pod and a restore from disk. Once a usable
node (Ready, not cordoned, tainted or draining) holds no pod of the job, a new spare is created that may start only
there (CreateSpare.nodes, a required node affinity ANDed with the template's); when it is warm, the spare beside the
worker goes (keep_spares drops the extras beside workers first). A new spare that is not warm within
MOVE_TIMEOUT_SECONDS (no room on those nodes: resources, selectors, taints it does not tolerate) goes instead, and
those nodes are not tried again while they stay usable (only other nodes are), so a move never churns pods.

Moves start only while the job is Running with no drain under way and every spare warm (never competing with a
recovery for the CPU, nor with a spare being replaced); a move whose reason went away (the spare was promoted, the
job restarts, a drain begins) just ends, its new spare an extra like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

from flywheel.contracts.timefmt import parse_rfc3339, rfc3339
from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreateSpare, DeletePod, Event, Pass
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import PodView
from flywheel.spec.status import Phase, SpareMoveStatus, TrainingJobStatus

MOVE_TIMEOUT_SECONDS = 120.0
# A move asks for at most this many nodes (the affinity's and status.spareMove's list): on a large cluster most
# usable nodes hold no pod of the job.
MOVE_NODES = 16


def worker_nodes(job: JobView) -> set[str]:
    return {p.node for p in job.pods if p.active and p.node}


def beside_worker(job: JobView, spare: PodView) -> bool:
    return spare.node is not None and spare.node in worker_nodes(job)


def spare_number(name: str) -> int:
    """n of a spare pod `<job>-spare-<n>` (operator/spare_pods.py names them), else -1."""
    parts = name.rsplit("-", 2)
    return int(parts[2]) if len(parts) == 3 and parts[1] == "spare" and parts[2].isdigit() else -1


def free_nodes(job: JobView, spares: Sequence[PodView]) -> list[str]:
    """Usable nodes with neither a worker nor a spare of the job."""
    return sorted(job.usable_nodes - worker_nodes(job) - {s.node for s in spares if s.node})


def move_spare(out: Pass, job: JobView, kept: list[PodView], ready: set[str]) -> int:
    """Follow or start a move; drops a given-up new spare from `kept` (deleting it). `ready`: the names of the kept
    spares that are warm. Returns the extra spares the move holds beyond the count (1 while its new spare is kept
    and not warm yet, else 0)."""
    move = out.status.spare_move
    if move.spare >= 0:
        return _follow(out, job, kept, ready)
    if (out.status.phase is Phase.RUNNING and not out.status.drain.node and kept
            and all(s.name in ready for s in kept)
            and any(beside_worker(job, s) for s in kept)):
        _start(out, job, kept)
    return 0


def _start(out: Pass, job: JobView, kept: list[PodView]) -> None:
    """A new spare on the free nodes not given up on yet (those still usable: one that left and came back may
    have room now)."""
    status = out.status
    gave_up_on = [n for n in status.spare_move.gave_up_on if n in job.usable_nodes]
    if gave_up_on != status.spare_move.gave_up_on:
        _end(out, gave_up_on)
    nodes = [n for n in free_nodes(job, kept) if n not in gave_up_on][:MOVE_NODES]
    if not nodes:
        return
    out.actions.append(CreateSpare(status.next_spare, status.generation, tuple(nodes)))
    status.spare_move = SpareMoveStatus(spare=status.next_spare, started_at=rfc3339(job.now), nodes=nodes,
                                        gave_up_on=gave_up_on)
    status.next_spare += 1


def _follow(out: Pass, job: JobView, kept: list[PodView], ready: set[str]) -> int:
    move = out.status.spare_move
    new = next((s for s in kept if spare_number(s.name) == move.spare), None)
    old = next((s for s in kept if beside_worker(job, s) and s is not new), None)
    overdue = job.now - (parse_rfc3339(move.started_at) or job.now) >= MOVE_TIMEOUT_SECONDS
    if new is not None and new.name in ready:  # done: the spare beside a worker is now the extra that goes
        if old is not None:
            out.events.append(Event("Normal", R.SPARE_MOVED, R.MSG_SPARE_MOVED.format(
                new=new.name, node=new.node, old=old.name, old_node=old.node)))
        _end(out, gave_up_on=[])
        return 0
    promoted = any(spare_number(p.name) == move.spare for p in job.pods)
    if promoted or old is None or out.status.phase is not Phase.RUNNING or out.status.drain.node:
        _end(out, gave_up_on=move.gave_up_on)  # the reason for the move went away
        return 0
    if overdue:
        if new is not None:
            out.actions.append(DeletePod(new.name, new.uid))
            kept.remove(new)
        out.events.append(Event("Warning", R.SPARE_NOT_MOVED, R.MSG_SPARE_NOT_MOVED.format(
            new=new.name if new else f"number {move.spare}", nodes=", ".join(move.nodes),
            seconds=MOVE_TIMEOUT_SECONDS, old=old.name, old_node=old.node)))
        _end(out, gave_up_on=sorted({*move.gave_up_on, *move.nodes}))
        return 0
    return 1 if new is not None else 0  # not seen yet: the create's answer is ahead of the cache


def move_due(status: TrainingJobStatus) -> float | None:
    """When a move under way is given up."""
    started = parse_rfc3339(status.spare_move.started_at) if status.spare_move.spare >= 0 else None
    return started + MOVE_TIMEOUT_SECONDS if started is not None else None


def _end(out: Pass, gave_up_on: list[str]) -> None:
    out.status.spare_move = SpareMoveStatus(spare=-1, started_at="", nodes=[], gave_up_on=list(gave_up_on))
