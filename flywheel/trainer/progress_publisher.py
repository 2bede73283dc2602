"""Global rank 0 publishes its progress to etcd (`/flywheel/progress/<run_id>/0`, record: flywheel/etcd/progress.py),
so the operator fills the job's status and sees a hang without a shared event-log volume or Prometheus.

Rank 0 alone writes: the ranks step in lockstep (every step ends in a collective), so a rank that stops stops rank
0's steps too, and one writer keeps one record per run. The record follows the events rank 0 already emits
(`PublishingEventLog` hands each to the publisher after writing it to the log, if any), so the loop needs no new
calls, except `activity` (an evaluation batch, the final save's start: not events, and many a second). Writes happen
on a background thread: at most one a second for steps and evaluation batches, at once for `start`, a committed
checkpoint, the final save's start and `done`; the key lives under the thread's own lease, so it vanishes within
the TTL when the process dies or is stopped. A failed write is logged and dropped: it never stops training. At exit
the last record is flushed (bounded by FLUSH_SECONDS; DONE_FLUSH_SECONDS for the done record).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from flywheel.contracts import termination_log
from flywheel.etcd import keys
from flywheel.etcd.progress import PHASE_SAVING, RECENT_NOTICES, CheckpointRecord, ProgressRecord, encode
from flywheel.etcd.session import EtcdSession, KeptLease
from flywheel.eventlog import EventLog, RunFold, parse_record
from flywheel.eventlog.writer import group_of

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 1.0
LEASE_TTL_SECONDS = 5
FLUSH_SECONDS = 3.0
# The done record (the step, an already complete checkpoint) is what the job's Succeeded condition says: an exit
# waits longer for it, when etcd is slow (a busy node, a new connection), than for any other record.
DONE_FLUSH_SECONDS = 10.0
URGENT_EVENTS = frozenset({"start", "checkpoint", "done"})
NOTICE_EVENTS = frozenset({"checkpoint", "checkpoint_failed", "checkpoint_bad"})  # what makes checkpoint notices


class ProgressState:
    """The record built from rank 0's events (pure; `observe` returns whether to publish at once)."""

    def __init__(self) -> None:
        self.record: ProgressRecord | None = None  # None until the attempt's `start`
        self.restored: tuple[str, int] = ("", 0)  # the `restore` report before the next `start`: (source, step)
        self.checkpoints = RunFold(keep_attempts=False)  # fed the checkpoint events: its notices

    def observe(self, event: str, fields: Mapping[str, Any], now: float) -> bool:
        if event in NOTICE_EVENTS and self._noticed(event, fields, now):
            return True
        if event == "restore":
            self.restored = (str(fields.get("source") or "disk"), int(fields.get("step") or 0))
            return False
        if event == "start":
            resumed = int(fields.get("resumed_from") or 0)
            previous = self.record or ProgressRecord(time=now, attempt=now)
            (source, step), self.restored = self.restored, ("", 0)
            self.record = self._with_notices(ProgressRecord(
                time=now, attempt=now, step=resumed, resumed_from=resumed,
                world_size=int(fields.get("world_size") or 0), checkpoint=previous.checkpoint,
                eval_step=previous.eval_step, eval_loss=previous.eval_loss, restore_source=source,
                restore_step=step, restore_seconds=float(fields.get("restore_seconds") or 0.0)))
            return True
        if self.record is None:
            if event != "step":
                return False
            # A user script reports steps only (flywheel.progress): its first step opens the attempt.
            resumed = int(fields["step"]) - 1
            self.record = ProgressRecord(time=now, attempt=now, step=resumed, resumed_from=resumed)
        r = self.record
        first_step = event == "step" and r.step == r.resumed_from  # a recovery's end: published at once
        if event in ("step", "eval", "done"):  # the evaluation or the save is over: training steps (or done)
            r = replace(r, phase="", heartbeat=0.0)
        if event == "step":
            self.record = replace(r, time=now, step=int(fields["step"]), loss=_float(fields.get("loss")),
                                  tokens_per_second=_float(fields.get("tokens_per_second")),
                                  world_size=int(fields.get("world_size") or r.world_size),
                                  productive_seconds=r.productive_seconds + float(fields.get("step_seconds") or 0))
        elif event == "checkpoint":
            checkpoint = CheckpointRecord(int(fields["step"]), str(fields.get("path", "")), now)
            self.record = replace(r, time=now, checkpoint=checkpoint)
        elif event == "eval":
            self.record = replace(r, time=now, eval_step=int(fields["step"]), eval_loss=_float(fields.get("loss")))
        elif event == "done":
            self.record = replace(r, time=now, step=int(fields.get("step") or r.step), done=True,
                                  already_complete=str(fields.get("already_complete_checkpoint") or ""))
        else:
            return False
        return event in URGENT_EVENTS or first_step

    def _noticed(self, event: str, fields: Mapping[str, Any], now: float) -> bool:
        """Fold a checkpoint event; whether it made a notice that the record (if any yet) now carries."""
        record = parse_record({**fields, "event": event, "time": now})
        if record is None:
            return False
        before = len(self.checkpoints.checkpoint_notices)
        self.checkpoints.add(record)
        if len(self.checkpoints.checkpoint_notices) == before or self.record is None:
            return False  # a notice before the attempt's `start` (a restore's) goes out with it
        self.record = replace(self._with_notices(self.record), time=now)
        return True

    def _with_notices(self, record: ProgressRecord) -> ProgressRecord:
        notices = self.checkpoints.checkpoint_notices
        return replace(record, notices=tuple((n.notice, n.words) for n in notices[-RECENT_NOTICES:]),
                       notices_total=len(notices))

    def observe_activity(self, phase: str, now: float) -> bool:
        """A sign of life in `phase` (etcd/progress.py's PHASE_*): kept in the record (none before the attempt's
        `start`). True when it must go out at once: the final save's start (the reader pauses its step check)."""
        if self.record is None:
            return False
        urgent = phase == PHASE_SAVING and self.record.phase != phase
        self.record = replace(self.record, time=now, phase=phase, heartbeat=now)
        return urgent

    def observe_exit(self, reason: str, now: float) -> bool:
        """The process is about to exit with `reason`: kept in the attempt's record (the first reason only; none
        before the attempt's `start`: no record to carry it). True when the record changed (publish at once)."""
        if self.record is None or self.record.exit_reason or not reason:
            return False
        self.record = replace(self.record, time=now, exit_reason=reason)
        return True


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


class ProgressPublisher:
    """Puts the latest record on a daemon thread; `observe` only updates memory and wakes the thread."""

    def __init__(self, endpoints: str, run_id: str, rank: int = 0) -> None:
        self.endpoints, self.key = endpoints, keys.progress_key(run_id, rank)
        self.state = ProgressState()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._urgent = False
        self._dirty = False
        self._published: ProgressRecord | None = None
        self._last_put = 0.0  # monotonic
        self._closed = False
        self._session: EtcdSession | None = None
        self._lease: KeptLease | None = None
        self._thread = threading.Thread(target=self._run, name="flywheel-progress", daemon=True)

    def start(self) -> ProgressPublisher:
        self._thread.start()
        atexit.register(self.close)
        return self

    def observe(self, event: str, fields: Mapping[str, Any]) -> None:
        with self._lock:
            urgent = self.state.observe(event, fields, time.time())
            self._dirty = self._dirty or self.state.record is not self._published
            self._urgent = self._urgent or urgent
            self._wake.notify()

    def activity(self, phase: str) -> None:
        """A sign of life that is no event (an evaluation batch, the final save's start): rate-limited like steps."""
        with self._lock:
            urgent = self.state.observe_activity(phase, time.time())
            self._dirty = self._dirty or self.state.record is not self._published
            self._urgent = self._urgent or urgent
            self._wake.notify()

    def observe_exit(self, reason: str) -> None:
        """A reason this process exits with (termination_log's listener): published at once, flushed by close()."""
        with self._lock:
            if self.state.observe_exit(reason, time.time()):
                self._dirty = self._urgent = True
                self._wake.notify()

    def close(self) -> None:
        """Flush the last record (waiting at most FLUSH_SECONDS, DONE_FLUSH_SECONDS for an unpublished done), then
        drop the session; the key expires."""
        termination_log.remove_listener(self.observe_exit)
        with self._lock:
            if self._closed:
                return
            self._closed, self._urgent = True, True
            record = self.state.record
            done_pending = record is not None and record.done and record is not self._published
            self._wake.notify()
        # The thread drops the session after its last put (_run).
        self._thread.join(DONE_FLUSH_SECONDS if done_pending else FLUSH_SECONDS)

    def _next_record(self) -> ProgressRecord | None:
        """Waits until a record is due (urgent, or dirty and a second since the last put); None when closed."""
        with self._lock:
            while True:
                due = self._last_put + MIN_INTERVAL_SECONDS - time.monotonic()
                if self._dirty and (self._urgent or due <= 0):
                    self._dirty, self._urgent = False, False
                    return self.state.record
                if self._closed:
                    return None
                self._wake.wait(max(due, 0.05) if self._dirty else None)

    def _run(self) -> None:
        while (record := self._next_record()) is not None:
            self._last_put = time.monotonic()
            try:
                self._put(record)
                self._published = record
            except Exception as exc:  # noqa: BLE001 - etcd down or slow: training goes on, the next put retries
                log.warning("could not publish progress to etcd (%s: %s)", type(exc).__name__, exc)
        # Here, not in close(): a put still retrying an unreachable etcd when close() stops waiting ends later.
        if self._session is not None:
            if self._lease is not None:
                self._lease.stop()
            self._session.close()

    def _put(self, record: ProgressRecord) -> None:
        if self._session is None:
            self._session = EtcdSession(self.endpoints, retry_seconds=5.0, name="flywheel-progress-etcd")
        if self._lease is None:
            self._lease = self._session.start_lease(LEASE_TTL_SECONDS, on_new_lease=self._reattach)
        lease_id, value = self._lease.lease_id, encode(record)
        self._session.call(lambda c: c.put(self.key, value, lease=lease_id))

    async def _reattach(self, lease_id: int) -> None:
        """A new lease (the old one expired during an etcd outage): put the last record under it again."""
        record = self._published
        if record is not None and self._session is not None:
            value = encode(record)
            await self._session.call_async(lambda c: c.put(self.key, value, lease=lease_id))


def publish_activity(events: EventLog, phase: str) -> None:
    """Hands a sign of life in `phase` to `events`' progress publisher, if it has one (rank 0 of an etcd run)."""
    if isinstance(events, PublishingEventLog):
        try:
            events.publisher.activity(phase)
        except Exception as exc:  # noqa: BLE001 - progress is best effort
            log.debug("progress publisher: %s", exc)


class PublishingEventLog(EventLog):
    """The event log (or none: `path` None) that also hands every event to the progress publisher."""

    def __init__(self, path: str | None, publisher: ProgressPublisher, group: str = "") -> None:
        super().__init__(path, group)
        self.publisher = publisher

    def emit(self, event: str, **fields: Any) -> None:
        super().emit(event, **fields)
        try:
            self.publisher.observe(str(event), fields)
        except Exception as exc:  # noqa: BLE001 - progress is best effort; the event was logged
            log.debug("progress publisher: %s", exc)


def progress_events(events_file: str | None, rank: int, environ: Mapping[str, str] | None = None) -> EventLog:
    """Rank 0's event log with etcd progress when the run's rendezvous is etcd-v3 (`PET_RDZV_*`, as the operator
    sets them), else the plain event log."""
    env = os.environ if environ is None else environ
    endpoint, run_id = env.get("PET_RDZV_ENDPOINT", ""), env.get("PET_RDZV_ID", "")
    group = group_of(env)
    if rank != 0 or env.get("PET_RDZV_BACKEND") != "etcd-v3" or not endpoint or not run_id or "/" in run_id:
        return EventLog(events_file, group)
    publisher = ProgressPublisher(endpoint, run_id).start()
    termination_log.add_listener(publisher.observe_exit)  # the exit reason goes to the progress key too
    return PublishingEventLog(events_file, publisher, group)
