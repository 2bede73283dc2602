"""Progress reporting for user scripts (`spec.command`): one call after each optimizer step.

    from flywheel import progress
    for step in range(1, steps + 1):
        ...
        progress.step(step, loss=loss.item(), tokens=tokens_in_global_batch)
        if saved:
            progress.checkpoint(step, path)  # once the save is complete
    # at start-up: progress.begin(), or after loading a checkpoint: progress.resumed(step, path)

It publishes what the embedded trainer publishes, under the same names and labels: the Prometheus metrics
(flywheel_train_steps_total, flywheel_train_last_step_timestamp_seconds, flywheel_train_loss,
flywheel_train_step_seconds, flywheel_train_tokens_per_second; served by each worker's local rank 0 on
FLYWHEEL_METRICS_PORT), rank 0's `step` events in FLYWHEEL_EVENTS_FILE and its etcd progress record. So the hang
checks, the job's `status.step`/goodput and the API's timeline work for a user script as they do for the trainer;
`checkpoint` and `resumed` make its `checkpoint` and `restore` events (the job's lastCheckpoint, what a restart resumed
from). The Hugging Face and Lightning callbacks (flywheel/integrations) make these calls for a framework's loop.
Without Flywheel's environment (plain `python`, `torchrun`) every call is a cheap no-op. Imports neither torch nor
anything of the operator.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping

from flywheel.agent import first_step
from flywheel.eventlog import EventName
from flywheel.trainer.metrics import TrainerMetrics
from flywheel.trainer.progress_publisher import progress_events

log = logging.getLogger(__name__)


class ProgressReporter:
    """Built from the worker environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `FLYWHEEL_JOB`,
    `FLYWHEEL_REPLICA_INDEX`, `FLYWHEEL_METRICS_PORT`, `FLYWHEEL_EVENTS_FILE`)."""

    def __init__(self, env: Mapping[str, str]):
        self.rank = int(env.get("RANK", "0") or 0)
        self.world_size = int(env.get("WORLD_SIZE", "1") or 1)
        namespace, _, job = env.get("FLYWHEEL_JOB", "default/flywheel").rpartition("/")
        labels = {"job": job, "namespace": namespace or "default", "replica": env.get("FLYWHEEL_REPLICA_INDEX", "0"),
                  "rank": str(self.rank)}
        port = int(env.get("FLYWHEEL_METRICS_PORT", "0") or 0) if env.get("LOCAL_RANK", "0") == "0" else 0
        try:
            self.metrics = TrainerMetrics(port, labels)
        except OSError as err:  # the port is still held by the previous incarnation: go on without serving
            log.warning("cannot serve progress metrics on port %d (%s); continuing without", port, err)
            self.metrics = TrainerMetrics(0, labels)
        # Rank 0's steps also go to the run's etcd progress record (the operator's status and hang check).
        self.events = progress_events((env.get("FLYWHEEL_EVENTS_FILE") or None) if self.rank == 0 else None,
                                      self.rank, env)
        self._last: float | None = None  # when the step being timed began: unknown until begin() or a step

    def begin(self) -> None:
        self._last = time.monotonic()

    def step(self, step: int, *, loss: float | None = None, tokens: int | None = None) -> None:
        now = time.monotonic()
        # A first step with no begin() before it has no known duration: none is made up (a near-zero one read as a
        # burst of millions of tokens a second).
        seconds, self._last = (None if self._last is None else now - self._last), now
        m = self.metrics
        m.train_steps_total.inc()
        m.train_last_step_timestamp_seconds.set(time.time())
        if seconds is not None:
            m.train_step_seconds.observe(seconds)
        first_step.mark()
        if loss is not None:
            m.train_loss.set(loss)
        tokens_per_second = tokens / seconds if tokens and seconds else None
        if tokens_per_second is not None:
            m.train_tokens_per_second.set(tokens_per_second)
        self.events.emit(EventName.STEP, step=int(step), loss=loss, step_seconds=seconds or 0.0,
                         tokens_per_second=tokens_per_second, world_size=self.world_size)


    def checkpoint(self, step: int, path: str) -> None:
        self.events.emit(EventName.CHECKPOINT, step=int(step), path=path)

    def resumed(self, step: int, path: str) -> None:
        log.warning("resumed from the checkpoint of step %d (%s)", step, path or "path not given")
        self.events.emit(EventName.RESTORE, step=int(step), path=path, source="disk")
        self._last = time.monotonic()  # the first step's time is not the restore's


_reporter: ProgressReporter | None = None
_lock = threading.Lock()


def in_flywheel(env: Mapping[str, str] = os.environ) -> bool:
    """True when this process was started by a Flywheel worker (the agent sets FLYWHEEL_JOB)."""
    return "FLYWHEEL_JOB" in env


def _the_reporter() -> ProgressReporter | None:
    global _reporter
    if not in_flywheel():
        return None
    if _reporter is None:
        _reporter = ProgressReporter(os.environ)
    return _reporter


def begin() -> None:
    """Training begins now (call it before the first step): the first step's time counts from here. Optional; without
    it the first step's duration is not reported."""
    with _lock:
        reporter = _the_reporter()
        if reporter is not None:
            reporter.begin()


def step(step: int, *, loss: float | None = None, tokens: int | None = None) -> None:
    """Report that optimizer step `step` (1-based) finished; `loss` of that step and `tokens` in its global batch
    are optional."""
    with _lock:
        reporter = _the_reporter()
        if reporter is not None:
            reporter.step(step, loss=loss, tokens=tokens)


def checkpoint(step: int, path: str = "") -> None:
    """Report that the checkpoint of step `step` is saved, complete, at `path` (call it once the save returned)."""
    with _lock:
        reporter = _the_reporter()
        if reporter is not None:
            reporter.checkpoint(step, path)


def resumed(step: int, path: str = "") -> None:
    """Report that this run resumed from the checkpoint of step `step` at `path` (after a restart: the steps after
    it are trained again)."""
    with _lock:
        reporter = _the_reporter()
        if reporter is not None:
            reporter.resumed(step, path)


def checkpoint_dir(default: str) -> str:
    """Where the worker contract says checkpoints go (FLYWHEEL_CHECKPOINT_DIR: the job's `checkpoint.dir`, on storage
    that outlives the worker), else `default`: a script saves there to resume after a restart."""
    return os.environ.get("FLYWHEEL_CHECKPOINT_DIR") or default
