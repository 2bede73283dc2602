"""`CheckpointCommitted` events (pure): the cluster's record of checkpoints over time, rate-limited per job.

The operator learns of committed checkpoints from the job's event log (flywheel/operator/event_log.py keeps the most
recent `RECENT_CHECKPOINTS`, numbered in the order they were logged). Each one becomes a Kubernetes event, but at
most one event per job every `CHECKPOINT_EVENT_INTERVAL_SECONDS`: events are objects in the API server's etcd,
and a job that checkpoints every few steps must not post one a second. Checkpoints committed within the interval
are coalesced into the next event, which names the newest (its step and path: what a restore would use) and
lists the steps it stands for, with `count` = their number and first/last timestamps = the oldest's and the
newest's commit times (as Kubernetes aggregates repeated events). When the job finishes, what is pending is posted
at once, so the record is complete.

A step of the reconcile pass (`checkpoint_posts`): its memory is a small value the executor keeps between passes
(`CheckpointEventState`, handed in with the observations and back with the Pass), which takes the events' place
once they are posted after the pass's actions.

After an operator restart the event log is read again from its start; checkpoints at or before the
`status.lastCheckpoint` the previous operator wrote count as handled (`seed`), so none is posted twice. An event
lost to a crash between the status write and the post is not repeated (as for every other event).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from flywheel.contracts.timefmt import parse_rfc3339
from flywheel.policy import reasons as R
from flywheel.spec.status import TrainingJobStatus

CHECKPOINT_EVENT_INTERVAL_SECONDS = 30.0
RECENT_CHECKPOINTS = 64  # per job, kept by the event-log fold; older pending ones are counted, not listed
MAX_LISTED_STEPS = 10  # steps named in one coalesced event's message


@dataclass(frozen=True)
class CommittedCheckpoint:
    ordinal: int  # 1 for the job's first checkpoint record, 2 for the next, ...
    step: int
    path: str
    time: float  # when it was committed (the worker's clock)


@dataclass(frozen=True)
class CheckpointEventState:
    """What the executor remembers between passes for one job."""

    handled: int = 0  # ordinals up to this one are posted (or coalesced, or were before this process)
    last_posted_at: float | None = None
    notices_posted: int | None = None  # the highest checkpoint notice posted (None: none looked at yet)


@dataclass(frozen=True)
class CheckpointEvent:
    step: int
    message: str
    count: int
    first_time: float
    last_time: float


def seed(recent: Sequence[CommittedCheckpoint], committed_through: float | None) -> CheckpointEventState:
    """The state of a new executor (e.g. after an operator restart), from the time of the `status.lastCheckpoint`
    written before it (None: none). That time has whole seconds, so a checkpoint within the same second counts as
    handled: an event may be missed, never posted twice."""
    if committed_through is None or not recent:
        return CheckpointEventState()
    newer = [c for c in recent if c.time >= committed_through + 1.0]
    return CheckpointEventState(handled=(newer[0].ordinal - 1) if newer else recent[-1].ordinal)


@dataclass(frozen=True)
class CheckpointPosts:
    """What a pass posts after its actions: the notices' Warning events (reason, message), then the coalesced
    CheckpointCommitted event; `memory` is the executor's once they are posted."""

    notices: list[tuple[str, str]]
    event: CheckpointEvent | None
    memory: CheckpointEventState


def checkpoint_posts(recent: Sequence[CommittedCheckpoint], notices: Sequence[tuple[int, str, str]],
                     memory: CheckpointEventState | None, status_in: TrainingJobStatus, now: float,
                     finished: bool) -> CheckpointPosts:
    """The events of the checkpoints and notices the progress shows. `memory` None: a new executor, seeded from the
    status the operator before it wrote; `finished`: the pass left the job finished (what is pending goes now)."""
    state = memory if memory is not None else seed(recent, last_checkpoint_time(status_in))
    posts, notices_posted = notice_events(notices, state.notices_posted)
    event, state = next_event(recent, state, now, flush=finished)
    return CheckpointPosts(posts, event, replace(state, notices_posted=notices_posted))


def last_checkpoint_time(status: TrainingJobStatus) -> float | None:
    try:
        return parse_rfc3339(status.last_checkpoint.time)
    except ValueError:
        return None


def next_event(recent: Sequence[CommittedCheckpoint], state: CheckpointEventState, now: float, *,
               flush: bool = False, interval: float = CHECKPOINT_EVENT_INTERVAL_SECONDS,
               ) -> tuple[CheckpointEvent | None, CheckpointEventState]:
    """The event to post in this pass, if any, and the state for the next. `recent`: the most recent committed
    checkpoints, oldest first. `flush`: the job finished; post what is pending without waiting for the interval."""
    total = recent[-1].ordinal if recent else 0
    if total <= state.handled:
        return None, state
    if not flush and state.last_posted_at is not None and now - state.last_posted_at < interval:
        return None, state
    pending = [c for c in recent if c.ordinal > state.handled]
    newest, count = pending[-1], total - state.handled
    message = R.MSG_CHECKPOINT_COMMITTED.format(step=newest.step, path=newest.path)
    if count > 1:
        steps = [str(c.step) for c in pending[-MAX_LISTED_STEPS:]]
        if len(pending) < count or len(pending) > MAX_LISTED_STEPS:
            steps.insert(0, "...")
        message += R.MSG_CHECKPOINTS_COALESCED.format(count=count, steps=", ".join(steps))
    event = CheckpointEvent(step=newest.step, message=message, count=count, first_time=pending[0].time,
                            last_time=newest.time)
    return event, replace(state, handled=total, last_posted_at=now)


def event_due(recent: Sequence[CommittedCheckpoint], state: CheckpointEventState,
              interval: float = CHECKPOINT_EVENT_INTERVAL_SECONDS) -> float | None:
    """When `next_event` posts the checkpoints still pending (held back by the interval); None: none pending."""
    total = recent[-1].ordinal if recent else 0
    if total <= state.handled or state.last_posted_at is None:
        return None
    return state.last_posted_at + interval


def notice_events(notices: Sequence[tuple[int, str, str]], handled: int | None
                  ) -> tuple[list[tuple[str, str]], int]:
    """The Warning events to post, (reason, message): each notice once (the trainer reports a cause of failing
    saves again only when it changes or after a commit; a damaged checkpoint once, when a restore skips it).
    `notices`: (ordinal, kind, message), oldest first; `handled`: the highest ordinal already posted, or None in
    a new executor, which counts what the sources hold now as posted (after an operator restart they are read again
    from their start: a warning may be missed, never posted twice)."""
    newest = notices[-1][0] if notices else 0
    if handled is None:
        return [], newest
    return [(NOTICE_REASONS.get(kind, R.CHECKPOINT_FAILED), message) for ordinal, kind, message in notices
            if ordinal > handled], max(handled, newest)


NOTICE_REASONS = {"failed": R.CHECKPOINT_FAILED, "damaged": R.CHECKPOINT_DAMAGED}  # a notice's kind -> its reason
