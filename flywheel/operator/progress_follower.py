"""One job's etcd progress for its runner: the watch of `/flywheel/progress/<run_id>/`, the ledger it feeds
(monitor/etcd_progress.py), and the clock a progress hang is judged by (policy/progress_hang.py), on the operator's
clock.

The watch's callback runs on the etcd session's thread; it hands each change to the runner's event loop, where
everything here is read and written (no lock needed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from flywheel.etcd.progress import PHASE_EVALUATING, PHASE_SAVING, ProgressRecord
from flywheel.etcd.progress_watch import ProgressWatch, watch_progress
from flywheel.etcd.session import EtcdSession
from flywheel.monitor.etcd_progress import GoodputSeed, ProgressLedger, merged
from flywheel.policy.observed import ObservedProgress, PodView, ProgressClock
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import GoodputStatus


class JobProgress:
    def __init__(self, poke: Callable[[], None]) -> None:
        self.poke = poke
        self.ledger = ProgressLedger()
        self.watch: ProgressWatch | None = None
        self.started = time.time()  # this operator's first look at the job
        self.seed: GoodputSeed | None = None  # from the status read by the first pass
        self.last_step_seen: float | None = None
        self.last_step: tuple[float, int] | None = None  # (attempt, step) of the last record that stepped
        # Evaluation batches are progress (policy/progress_hang.py): the last heartbeat seen, and when.
        self.last_activity: tuple[float, float] | None = None  # (attempt, heartbeat)
        self.last_activity_seen: float | None = None
        self.saving: tuple[float, float] | None = None  # (attempt, when first seen) while its final save runs
        self.newest_attempt: tuple[float, float] | None = None  # (attempt, when first seen) of the newest one
        self.ranks_restarted = 0.0  # the latest restart of the current pods' ranks in place, as the last `clock` saw
        self.done = False
        self.running: tuple[int, float] | None = None  # (generation, since) while all its worker pods run

    def start(self, session: EtcdSession, run_id: str) -> None:
        if self.watch is not None:
            return
        loop = asyncio.get_running_loop()

        def changed(records: dict[str, ProgressRecord]) -> None:
            loop.call_soon_threadsafe(self._apply, records)

        self.watch = watch_progress(session, run_id, changed, shared=True)

    def _apply(self, records: dict[str, ProgressRecord]) -> None:
        if not records:  # none yet, or the keys went with their lease: the ledger keeps what they said
            return
        now = time.time()  # one time for both: a new group's first record may already have stepped
        for record in records.values():
            self.ledger.add(record)
            if self.newest_attempt is None or record.attempt > self.newest_attempt[0]:
                # A new group (ranks restarted in place, a regrow): its restore and first step are start-up.
                self.newest_attempt = (record.attempt, now)
            key = (record.attempt, record.step)
            if record.stepped and key != self.last_step and (self.last_step is None or key > self.last_step):
                self.last_step, self.last_step_seen = key, now
            self._apply_phase(record, now)
            self.done = self.done or record.done
        self.poke()

    def _apply_phase(self, record: ProgressRecord, now: float) -> None:
        """An evaluation batch counts as a step; the final save pauses the step check (bounded) until the record
        says otherwise (done, or a new attempt)."""
        key = (record.attempt, record.heartbeat)
        if record.phase == PHASE_EVALUATING and record.stepped and (self.last_activity is None
                                                                    or key > self.last_activity):
            self.last_activity, self.last_activity_seen = key, now
        if record.phase == PHASE_SAVING:
            if self.saving is None or self.saving[0] != record.attempt:
                self.saving = (record.attempt, now)
        elif self.saving is not None and record.attempt >= self.saving[0]:
            self.saving = None

    def observe(self, from_log: ObservedProgress | None, status_goodput: GoodputStatus) -> ObservedProgress:
        """The pass's progress: etcd's, merged with the event log's when there is one."""
        if self.seed is None:  # what the operator before this one counted (0 for a new job)
            self.seed = GoodputSeed(status_goodput.productive_seconds, status_goodput.ratio,
                                    status_goodput.lost_steps, status_goodput.mean_time_to_recover_seconds,
                                    self.started)
        from_etcd = self.ledger.progress(self.seed) if self.ledger.attempts else None
        return merged(from_etcd, from_log)

    def clock(self, spec: TrainingJobSpec, views: list[PodView], generation: int, now: float) -> ProgressClock | None:
        """What the current generation's progress looked like, to judge a hang by (None once done, or with no
        progress followed). Called each pass the hang is looked for: it notes since when all its pods run."""
        current = [v for v in views if v.active and v.generation == generation and not v.is_spare]
        all_running = bool(current) and len(current) >= spec.replicas.min and \
            all(v.phase == "Running" for v in current)
        if not all_running:
            self.running = None
        elif self.running is None or self.running[0] != generation:
            self.running = (generation, now)
        self.ranks_restarted = max((v.rank_restart_at for v in current), default=0.0)
        if self.done or self.watch is None:
            return None
        began = max(self.ranks_restarted, self.newest_attempt[1] if self.newest_attempt else 0.0)
        return ProgressClock(self.running[1] if self.running else None, self.last_step_seen, began or None,
                             self.last_activity_seen, self.saving[1] if self.saving else None)

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None
