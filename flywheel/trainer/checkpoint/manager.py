"""Checkpointer: DCP saves, asynchronous by default, committed atomically, restored with resharding.

How a save runs (async):
  1. save(step) on the training thread, right after optimizer.step(): takes the state dict (live references to
     parameters and optimizer state; copies of buffers, scheduler, data position and RNG) and hands it to the
     writer thread. This is all the loop waits for (a few ms).
  2. The writer thread copies the tensors into reusable CPU buffers (pinned when CUDA) while the loop runs the
     next forward/backward, which do not change parameters or optimizer state.
  3. wait_staged(), called by the loop just before the next optimizer.step(), returns once that copy is done:
     the saved state is exactly the state after `step`.
  4. The writer thread runs dcp.save from the buffers on its own gloo group (DCP on the training group deadlocks
     against FSDP's collectives), then global rank 0 writes the commit marker, applies retention and removes torn
     folders. Only committed folders are ever restored.

One save is in flight at a time. A save requested while the previous one is still being written on any rank is
skipped on every rank, with a warning: waiting would stall training for the rest of a write (sync checkpointing
in disguise), while skipping only makes the next checkpoint come later. blocking=True (final or emergency saves)
waits for the in-flight write instead, then saves and returns once committed.

Failures (disk full, read-only or missing directory, a rank's write raising) are logged by each rank with its own
cause. Global rank 0, the committing rank, decides for all: the failed save's partial folder is removed (each rank
removes it where it sees it, so a per-pod directory loses its part too), and the most telling cause of all ranks'
(failure.py: no space before a peer's follow-on error) is reported once per failed save, in words with
the newest good checkpoint, as a `checkpoint_failed` record and flywheel_checkpoint_failures_total{reason}. When the
disk is full, committed checkpoints older than the newest good one (restored from disk or committed last by this
run) are deleted to make room. Training continues; a failed step does not count as saved (a final save retries it).

Memory tier (checkpoint.memoryEverySteps, tiers/peer.py): saves of its own into host shared memory with a
replica on the next worker, on its own thread; restore (restore.py) prefers it when it holds the newest
step complete for every rank. A step due for both tiers is copied once: the memory tier writes from the disk
save's staged copy (two copies of the state at once ran past the next forward/backward and held the loop).

restore() ends by allocating both tiers' staging buffers (`reserve_staging`), before the first save.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from flywheel.spec import storage as object_store
from flywheel.spec.job import CheckpointSpec
from flywheel.trainer.checkpoint import integrity, store
from flywheel.trainer.checkpoint import restore as checkpoint_restore
from flywheel.trainer.checkpoint.failure import SaveFailed, describe_failure, report_failure
from flywheel.trainer.checkpoint.rank_gather import gather_causes, gather_checksums
from flywheel.trainer.checkpoint.save_record import SaveRecord, snapshot, staged_copy
from flywheel.trainer.checkpoint.schedule import SaveSchedule
from flywheel.trainer.checkpoint.staging import StagingBuffers, snapshot_unsafe_tensors
from flywheel.trainer.checkpoint.state import AppState
from flywheel.trainer.checkpoint.tiers.peer import MemoryTier
from flywheel.trainer.checkpoint.tiers.remote import RemoteTier

__all__ = ["AppState", "Checkpointer", "describe_failure"]

log = logging.getLogger("flywheel.checkpoint")

_FAILURES = (Exception, CheckpointException)  # DCP's CheckpointException derives from BaseException
# torch.cuda.Stream's constructor has no annotations; this is its signature as used here.
_new_cuda_stream: Callable[[], torch.cuda.Stream] = torch.cuda.Stream


class Checkpointer:
    """Construct on every rank after dist.init_process_group (it creates two gloo groups, a collective)."""

    def __init__(self, cfg: CheckpointSpec, directory: str | os.PathLike[str], *, events: Any = None,
                 metrics: Any = None, memory_dir: Path | None = None, ranks_per_worker: int = 1) -> None:
        """memory_dir: where the memory tier keeps this worker's copies (tiers/memory.memory_root); None, or
        memoryEverySteps 0, turns the tier off. ranks_per_worker: the ring's stride, so replicas leave the host."""
        self.cfg = cfg
        # An object-store dir (s3://...) is written through a local staging directory (tiers/remote.py).
        self.directory = Path(object_store.local_dir(str(directory), cfg.local_dir))
        self.events = events
        self.metrics = metrics
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        # The writer group carries DCP's collectives (writer thread); the control group the training thread's
        # small agreements (due, skip, restore). Two groups, so the two threads never share a communicator.
        self._write_group = dist.new_group(backend="gloo") if self.distributed else None
        self._control_group = dist.new_group(backend="gloo") if self.distributed else None
        self._cuda = torch.cuda.is_available()
        self._stream = _new_cuda_stream() if self._cuda else None
        self._buffers = StagingBuffers(pin_memory=self._cuda)
        self._buffers_reader: Future[None] | None = None  # a memory save still reading the disk save's copy
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-checkpoint")
        self._inflight: SaveRecord | None = None
        self._last_requested_step = -1  # the newest step saved, or being saved (a failed save does not count)
        # The newest disk checkpoint known to load: the one restored from disk, or the last committed by this run.
        # Make-room never deletes it, and a final step restored from memory only is still written to disk.
        self.committed_step: int | None = None
        self._disk_due: dict[int, bool] = {}  # step -> whether due() found the disk tier due (else memory only)
        self.remote = RemoteTier(str(directory), self.directory, rank=self.rank, world_size=self.world_size,
                                 group=self._write_group, keep=cfg.keep, events=events, metrics=metrics) \
            if object_store.is_url(str(directory)) else None
        if self.remote is not None:
            self.remote.claim_staging()  # before the memory tier reads the staging dir's identity
        # The memory tier saves on its own thread, buffers and gloo group: a disk write in flight never holds it up.
        self.memory = MemoryTier(memory_dir, cfg.memory_every_steps, rank=self.rank, world_size=self.world_size,
                                 ranks_per_worker=ranks_per_worker, pin_memory=self._cuda, metrics=metrics,
                                 events=events, run_dir=self.directory) \
            if memory_dir is not None and cfg.memory_every_steps > 0 else None
        self.restored_path: str | None = None  # the committed checkpoint restore() loaded
        self.failure: str | None = None  # why the last disk save failed (rank 0: every rank's cause, in words)
        self._schedule = SaveSchedule(cfg, self.world_size, self._control_group)
        self._closed = False
        self.memory_bytes: int | None = None  # after close(): the memory tier's bytes over all ranks

    @property
    def control_group(self) -> Any:
        """The gloo group of the saves' own collectives (the memory tier's agreement too)."""
        return self._control_group

    @property
    def transfer_groups(self) -> list[Any]:
        """The groups a memory restore sends replicas over, the control group first: every gloo group this
        checkpointer owns, each its own socket between two ranks. Only for a restore: no save is under way then, so
        none of them is in use by another thread."""
        owned = [self._control_group, self.memory.group if self.memory is not None else None, self._write_group]
        return [g for g in owned if g is not None] or [None]

    # ---- agreement between ranks -------------------------------------------------------------------------------

    def _agree(self, flag: bool, group: Any, *, any_rank: bool) -> bool:
        """any_rank: true if true on some rank; otherwise true only if true on every rank."""
        if not self.distributed:
            return flag
        t = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if any_rank else dist.ReduceOp.MIN, group=group)
        return bool(t.item())

    # ---- the loop's calls --------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether to save after `step`; the same answer on every rank. Call it once per step on every rank (the
        disk tier's schedule: schedule.py). A step due for the memory tier only (memoryEverySteps) is due too;
        save() then writes no disk checkpoint."""
        disk = self._schedule.disk_is_due(step)
        self._disk_due = {step: disk}
        return disk or (self.memory is not None and self.memory.due(step))

    def save(self, step: int, app: AppState, *, blocking: bool = False) -> None:
        """Checkpoint the state after `step`. Call on every rank, right after optimizer.step()."""
        started = time.monotonic()
        # blocking (a final or emergency save) always writes to disk and skips memory; `async: false` only makes
        # the due disk saves wait, so a memory-only step stays a memory copy.
        disk = blocking or self._disk_due.pop(step, True)
        memory = self.memory is not None and self.memory.due(step) and not blocking and \
            self.memory.begin(step, self._control_group)
        shared = self._save_disk(step, app, blocking or not self.cfg.async_, started) if disk else None
        if memory and self.memory is not None:
            # Started last: a thread started earlier would take the GIL from the loop's thread mid-save (measured:
            # +4 ms of stall). With a disk save under way it reads that save's staged copy.
            if shared is not None and self._inflight is not None:
                self._buffers_reader = self.memory.start(step, shared, borrow=staged_copy(self._inflight))
            else:
                self.memory.start(step, snapshot(app, step) if shared is None else shared)

    def reserve_staging(self, app: AppState) -> None:
        """Allocate the staging buffers of the tiers that save (pinned on a GPU host) for `app`'s state now, so that
        the first save does not (after the restore: the state's shapes are known)."""
        cfg = self.cfg
        disk = cfg.async_ and (cfg.every_steps > 0 or cfg.every_seconds > 0)
        # Memory copies at steps without a disk save stage into the tier's own buffers.
        memory_alone = self.memory is not None and not (
            disk and cfg.every_seconds <= 0 and self.memory.every_steps % cfg.every_steps == 0)
        if disk or memory_alone:
            template = app.staging_template()
            if disk:
                self._buffers.reserve(template)
            if memory_alone and self.memory is not None:
                self.memory.reserve(template)

    @property
    def busy(self) -> bool:
        """Whether a disk save is still under way on this rank (its commit's clean-up included)."""
        future = self._inflight.future if self._inflight is not None else None
        return future is not None and not future.done()

    def on_disk(self, step: int) -> bool:
        """Whether `step` is committed on disk: restored from there, or saved by this run (a save still in flight
        does not count yet)."""
        return self.committed_step == step

    def holds(self, step: int) -> bool:
        """Whether `step` is saved where the job keeps its checkpoints: committed on disk and, for an object-store
        dir, in the bucket (rank 0 lists it). The same answer on every rank."""
        if not self.on_disk(step):
            return False
        if self.remote is None:
            return True
        return self._agree(self.rank != 0 or self.remote.holds(step), self._control_group, any_rank=False)

    def save_final(self, step: int, app: AppState) -> None:
        """A blocking save of the run's final state, also when `step` was saved before: a step committed on disk
        whose upload failed is written again (the other ranks' shards of a per-pod dir went with the upload)."""
        self._last_requested_step = min(self._last_requested_step, step - 1)
        self.save(step, app, blocking=True)

    def unsaved_reason(self, step: int) -> str | None:
        """None when holds(step); else why not, in rank 0's words, on every rank. After close()."""
        why = None
        if not self.holds(step):
            remote = self.remote.failure if self.remote is not None and self.on_disk(step) else None
            why = remote or self.failure or "its save did not commit"
        if not self.distributed:
            return why
        box = [why]
        dist.broadcast_object_list(box, src=0, group=self._control_group)
        return box[0]

    def save_to_memory(self, step: int, app: AppState) -> None:
        """A memory-tier save of the state after `step` now, due or not (a checkpoint request). Every rank."""
        if self.memory is not None and self.memory.begin(step, self._control_group):
            self.memory.start(step, snapshot(app, step))

    def _save_disk(self, step: int, app: AppState, blocking: bool, started: float) -> dict[str, Any] | None:
        """The disk part of save(): the state dict handed to the writer thread, or None (skipped, or blocking)."""
        if blocking:
            self._wait_inflight()
        else:
            if self._agree(self.busy, self._control_group, any_rank=True):
                prev = self._inflight.step if self._inflight else "?"
                log.warning("checkpoint at step %d skipped: the save of step %s is still being written; saves are "
                            "requested faster than storage absorbs them (raise everySteps/everySeconds)", step, prev)
                return None
            self._wait_inflight()  # finished everywhere: collect its result and blocking time
        if step <= self._last_requested_step:
            log.info("checkpoint at step %d already taken; not saving it again", step)
            return None
        self._last_requested_step = step
        self._schedule.started()
        record = SaveRecord(step=step, path=store.step_dir(self.directory, step), started=started,
                       blocking_call=blocking)
        state = app.state_dict()
        state["step"] = step
        if blocking:
            self._write(record, state, stage=False)
            record.blocking = time.monotonic() - started
            self._report_blocking(record)
            return None
        state = snapshot_unsafe_tensors(state, app.parameter_storages())
        if self._stream is not None:
            # The staging stream must see the optimizer step's results; enqueued here, waited for on the GPU.
            self._stream.wait_stream(torch.cuda.current_stream())
        self._inflight = record
        record.after = self._buffers_reader
        record.future = self._executor.submit(self._write, record, state, True)
        record.blocking += time.monotonic() - started
        return state

    def catch_up(self, step: int) -> None:
        """Call before `step` is reported: a step due for a memory copy waits for the previous copy still under
        way (MemoryTier.catch_up), so a node loss replays at most memoryEverySteps steps. The wait is the loop's
        checkpoint blocking time."""
        if self.memory is None:
            return
        waited = self.memory.catch_up(step)
        if waited > 0 and self.metrics is not None:
            self.metrics.checkpoint_blocking_seconds.observe(waited)

    def wait_staged(self) -> None:
        """Return once the in-flight saves no longer read live tensors. Call before optimizer.step()."""
        if self.memory is not None:
            self.memory.wait_staged()
        record = self._inflight
        if record is None or record.blocking_reported:
            return
        t0 = time.monotonic()
        record.staged.wait()
        record.blocking += time.monotonic() - t0
        self._report_blocking(record)

    def close(self) -> None:
        """Wait for the in-flight save to commit or fail. Call on every rank before destroying process groups."""
        if self._closed:
            return
        self._closed = True
        self._wait_inflight()
        if self.memory is not None:
            self.memory.close()
            self.memory_bytes = self.memory.total_bytes(self._control_group)
        self._schedule.close()
        self._executor.shutdown(wait=True)

    # ---- restore -----------------------------------------------------------------------------------------------

    def restore(self, app: AppState) -> int | None:
        """Load the newest state a tier holds into app: memory when it is complete there for every rank, else
        the newest committed disk checkpoint (resharding to this world size); its step, or None.
        See restore.py."""
        self._wait_inflight()
        if self.memory is not None:
            self.memory.wait()
        restored = checkpoint_restore.restore(self._restore_context(), app)
        self.reserve_staging(app)  # the state's shapes are known now; the first save then allocates nothing
        if restored is None:
            return None
        self.restored_path = restored.path
        # A restored memory step is not on disk: the final save still writes it (train_loop).
        if restored.source == checkpoint_restore.DISK:
            self._last_requested_step = restored.step
            self.committed_step = restored.step
        self._schedule.restored()
        return restored.step

    def _restore_context(self) -> checkpoint_restore.RestoreContext:
        return checkpoint_restore.RestoreContext(
            rank=self.rank, world_size=self.world_size, distributed=self.distributed, directory=self.directory,
            memory=self.memory, remote=self.remote, control_group=self._control_group, write_group=self._write_group,
            transfer_groups=self.transfer_groups, events=self.events, metrics=self.metrics,
            all_agree=lambda flag: self._agree(flag, self._write_group, any_rank=False))

    # ---- the write (writer thread for async saves, training thread for blocking ones) -------------------------

    def _write(self, record: SaveRecord, state: dict[str, Any], stage: bool) -> None:
        try:
            staging_error: BaseException | None = None
            try:
                if stage and record.after is not None:
                    wait_for_futures([record.after])
                staged = self._buffers.stage(state, self._stream) if stage else state
                record.copy = staged if stage else None
                if self.rank == 0:
                    # A leftover bad-marked folder of this step would hide this save's commit from every listing.
                    integrity.set_aside_if_bad(record.path)
                    store.retract_commit(record.path)  # a stale marker must not vouch for files being rewritten
            except _FAILURES as err:
                staging_error = err
            finally:
                record.staged.set()
            # Every rank must enter dcp.save or none: a rank that stays out would leave the others hanging.
            causes = gather_causes(staging_error, self.rank, self.world_size, self._write_group)
            if causes:
                raise SaveFailed(causes)
            dcp_save(staged, storage_writer=FileSystemWriter(record.path), process_group=self._write_group)
            # dcp.save returns on rank 0 only after .metadata is written, i.e. after every rank's write finished.
            sums = gather_checksums(record.path, self.rank, self.world_size, self._write_group)
            commit_error: BaseException | None = None
            if self.rank == 0:
                try:
                    store.write_commit(record.path, record.step, self.world_size, sums)
                except _FAILURES as err:
                    commit_error = err
            committed = self.rank == 0 and commit_error is None
            if not self._agree_commit(record, committed):
                raise commit_error or RuntimeError("rank 0 could not write the commit marker")
        except _FAILURES as err:
            self._on_failure(record, err, state)
            return
        self._on_commit(record)
        if self.remote is not None:  # committed locally; the bucket's copy follows (its marker last)
            self.remote.upload(record.path, record.step)

    def _agree_commit(self, record: SaveRecord, committed: bool) -> bool:
        """Whether the save committed, agreed by every rank. Once rank 0 wrote the marker (every rank's files were
        written and checksummed by then) the checkpoint is committed and restores use it, even when the agreement
        itself fails (a rank lost in between): rank 0 then says so rather than report it abandoned."""
        try:
            return self._agree(committed, self._write_group, any_rank=True)
        except _FAILURES as err:
            if not committed:
                raise
            log.warning("checkpoint at step %d: committed, but the ranks could not agree on it afterwards (%s)",
                        record.step, describe_failure(err))
            return True

    def _on_commit(self, record: SaveRecord) -> None:
        self.committed_step = record.step
        total = time.monotonic() - record.started
        blocking = total if record.blocking_call else record.blocking
        log.info("checkpoint at step %d committed to %s (loop blocked %.3f s, total %.2f s)", record.step,
                 record.path, blocking, total)
        if self.metrics is not None:
            self.metrics.checkpoint_total_seconds.observe(total)
            self.metrics.checkpoint_last_step.set(record.step)
        if self.rank != 0:
            return
        if self.events is not None:
            self.events.emit("checkpoint", step=record.step, blocking_seconds=blocking, total_seconds=total,
                             path=str(record.path))
        store.tidy_after_commit(self.directory, self.cfg.keep, record.step)

    def _on_failure(self, record: SaveRecord, err: BaseException, state: dict[str, Any]) -> None:
        log.error("checkpoint at step %d to %s failed on rank %d: %s", record.step, record.path, self.rank,
                  describe_failure(err))
        if self._last_requested_step == record.step:  # not taken: a later save of this step (the final) retries
            self._last_requested_step = self.committed_step if self.committed_step is not None else -1
        try:
            store.remove_partial(record.path)  # every rank: a per-pod directory holds that rank's part only
        except OSError as cleanup_error:
            log.warning("could not remove the failed checkpoint %s: %s", record.path, cleanup_error)
        self.failure = describe_failure(err)
        if self.rank == 0:  # the committing rank reports, with every rank's cause
            self.failure = report_failure(self.directory, record, err, state, self.committed_step,
                                          events=self.events, metrics=self.metrics)

    # ---- bookkeeping -------------------------------------------------------------------------------------------

    def _report_blocking(self, record: SaveRecord) -> None:
        if record.blocking_reported:
            return
        record.blocking_reported = True
        if self.metrics is not None:
            self.metrics.checkpoint_blocking_seconds.observe(record.blocking)

    def _wait_inflight(self) -> None:
        """Wait for the in-flight save (its failures are already reported) and account its blocking time."""
        record = self._inflight
        if record is None:
            return
        self.wait_staged()
        if record.future is not None:
            record.future.result()  # _write catches its own failures
        self._inflight = None

