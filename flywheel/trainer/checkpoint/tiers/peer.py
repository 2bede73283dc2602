"""The memory tier's executor: saves into host shared memory with a replica on the next worker (a ring over the
checkpointer's gloo group), and restores from them (tiers/memory.py holds the layout and the plan).

Ring: rank r sends its copy to rank r + ranks_per_worker (mod world size), the same local rank on the next worker,
so that losing a whole worker leaves every one of its ranks' copies on another host. With one worker there is no
peer and only the own copies are kept.

The tier is a pipeline of its own beside the disk saves: its own thread, staging buffers and gloo group (a thread
never shares a communicator with another), so a disk write in flight never holds up a memory save. Like a disk
save, the loop waits for the copy into the staging buffers (wait_staged, before optimizer.step()). A step due for a
copy while the previous copy is still under way waits for that one before it is reported (catch_up): the tier's
promise is that a node loss replays at most memoryEverySteps steps, so a copy slower than that many steps slows the
loop to its pace rather than letting the replicas fall behind (skipping did: with a copy every step, losses replayed
2 steps). A copy under way STUCK_SECONDS is waited for no longer, and later copies are skipped on every rank until
it ends (begin).

Restore (restore_into, tiers/peer_restore.py) puts the bytes straight into the live state's tensors, each
checked against its digest.

Every collective here is made on every rank in the same order (saves on the tier's thread and group, the restore
on the training thread and the control group); a rank whose local part failed still takes part, with nothing to
send, so no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from flywheel.contracts.memory_root import adopt, dir_identity, forget_identity
from flywheel.trainer.checkpoint.failure import FailureReason, RankCause, in_words, primary, rank_cause, state_bytes
from flywheel.trainer.checkpoint.staging import StagingBuffers
from flywheel.trainer.checkpoint.tiers import memory as mem
from flywheel.trainer.checkpoint.tiers.peer_restore import Damage, MemoryRestore, started

log = logging.getLogger("flywheel.checkpoint")
CHUNK = 64 << 20  # bytes per message of a replica sent after a save (two such buffers per rank receive them)
# A copy under way this long is stuck (a step's copy takes well under a second): said once, with where its thread is.
STUCK_SECONDS = 30.0
THREAD_PREFIX = "flywheel-memory"


class MemoryTier(MemoryRestore):
    """Construct on every rank (it creates a gloo group, a collective)."""

    def __init__(self, root: Path, every_steps: int, *, rank: int, world_size: int, ranks_per_worker: int,
                 pin_memory: bool = False, metrics: Any = None, events: Any = None,
                 run_dir: Path | None = None) -> None:
        """run_dir: the checkpoint dir whose copies the root may hold (its identity, contracts/memory_root.py);
        None: whatever the root holds is taken as this run's."""
        self.root = root
        self.every_steps = every_steps
        self.rank, self.world_size = rank, world_size
        self.per_worker = per_worker = max(1, min(ranks_per_worker, world_size))
        self.peer = (rank + per_worker) % world_size
        self.source = (rank - per_worker) % world_size
        self.metrics, self.events = metrics, events
        self.newest_step: int | None = None
        # A replica whose file is visible here is read directly; False forces gloo (the cross-host path, measured
        # by bench/checkpoint_restore.py).
        self.same_host_reads = True
        distributed = dist.is_available() and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed else None
        self._buffers = StagingBuffers(pin_memory=pin_memory)
        self._stream = torch.cuda.Stream() if pin_memory else None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_PREFIX)
        self._future: Future[None] | None = None
        self._future_step = -1
        self._future_began = 0.0
        self._stuck_said = False
        self._staged = threading.Event()
        self._staged.set()
        self._chunks: tuple[torch.Tensor, torch.Tensor] | None = None  # receive buffers, reused between saves
        self.damage: list[Damage] = []  # the damaged copies the last restore_into found
        # The cause of the failing saves, reported once (None: saves work); this rank's own, said once.
        self._failing: FailureReason | None = None
        self._failing_here: FailureReason | None = None
        self._tidy_root(run_dir)

    @property
    def replicated(self) -> bool:
        return self.peer != self.rank

    @property
    def busy(self) -> bool:
        """Whether a memory save is still under way on this rank."""
        return self._future is not None and not self._future.done()

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    # ---- save (training thread: catch_up, begin, start, wait_staged; the tier's thread: the rest) ----------------

    def catch_up(self, step: int) -> float:
        """Before `step` is reported, when it is due for a copy: wait for the previous copy still under way (its end
        is agreed by every rank, so it is then complete everywhere), at most until it has been under way
        STUCK_SECONDS. So whenever a step is reported, the copy due before it can be restored, and a node loss
        replays at most memoryEverySteps steps. Returns the seconds waited."""
        future = self._future
        if not self.due(step) or future is None or future.done():
            return 0.0
        began = time.monotonic()
        wait_for_futures([future], timeout=max(0.0, self._future_began + STUCK_SECONDS - began))
        return time.monotonic() - began

    def begin(self, step: int, control_group: Any) -> bool:
        """Whether to take the memory save of the state after `step` (then call start with it): false on every
        rank when the previous one is still under way on some rank. Call on every rank (a collective)."""
        if _agree(self.busy, control_group, any_rank=True):
            log.warning("memory copy at step %d skipped: the copy of step %d is still under way (raise "
                        "memoryEverySteps)", step, self._future_step)
            self._say_if_stuck()
            return False
        self.wait()
        return True

    def reserve(self, tensors: list[torch.Tensor]) -> None:
        """Allocate the staging buffers for a state of these tensors, and the replica's receive buffers, before
        the first save (StagingBuffers.reserve)."""
        self._buffers.reserve(tensors)
        if self.replicated and self._chunks is None:
            size = min(CHUNK, sum(t.numel() * t.element_size() for t in tensors))
            self._chunks = (torch.zeros(size, dtype=torch.uint8), torch.zeros(size, dtype=torch.uint8))

    def start(self, step: int, state: dict[str, Any],
              borrow: Callable[[], dict[str, Any] | None] | None = None) -> Future[None]:
        """Stage and save `state` (the state dict after `step`, non-parameter tensors already snapshotted; it is
        only read, so the disk save may share it) on the tier's thread; the save's future. `borrow`: returns the
        disk save's staged copy of the same state (None if it failed), which is then saved instead of a copy of
        our own; the disk tier's next staging waits for the returned future."""
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream())
        self._staged = staged = threading.Event()
        self._future_step, self._future_began, self._stuck_said = step, time.monotonic(), False
        self._future = future = self._executor.submit(self._stage_and_save, step, state, staged, borrow)
        return future

    def _say_if_stuck(self) -> None:
        """Once per copy: this rank's copy has been under way for STUCK_SECONDS, and where its thread waits (every
        later copy is skipped until it ends, so the memory tier falls behind the disk checkpoints)."""
        seconds = time.monotonic() - self._future_began
        if not self.busy or self._stuck_said or seconds < STUCK_SECONDS:
            return
        self._stuck_said = True
        log.error("memory copy of step %d on rank %d has been under way for %.0f s: every copy is skipped until "
                  "it ends (a peer that never answers?); its thread is at:\n%s", self._future_step, self.rank,
                  seconds, thread_stack(THREAD_PREFIX))

    def wait_staged(self) -> None:
        """Return once the in-flight memory save no longer reads live tensors."""
        self._staged.wait()

    def wait(self) -> None:
        """Wait for the in-flight memory save (its failures are logged; a collective's raises here)."""
        if self._future is not None:
            future, self._future = self._future, None
            future.result()

    def close(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)

    def _stage_and_save(self, step: int, state: dict[str, Any], staged_event: threading.Event,
                        borrow: Callable[[], dict[str, Any] | None] | None) -> None:
        staged: dict[str, Any] | None = None
        error: BaseException | None = None
        try:
            staged = borrow() if borrow is not None else None
            if staged is None:
                staged = self._buffers.stage(state, self._stream)
        except (OSError, RuntimeError) as err:
            error = err
        finally:
            staged_event.set()
        self.save(step, staged, self.group, staging_error=error)

    def save(self, step: int, staged: dict[str, Any] | None, group: Any,
             staging_error: BaseException | None = None) -> bool:
        """Keep this rank's staged state and the source rank's replica; whether every rank has both."""
        for folder in self._folders():
            mem.drop_temporary(folder)  # a save killed mid-write left its space taken
        data: torch.Tensor | None = None
        error = staging_error
        try:
            if staged is None:
                raise error or RuntimeError("staging failed")
            path = mem.save_file(mem.own_dir(self.root, self.rank), step, self.world_size, self.rank, staged)
            data = torch.from_file(str(path), size=path.stat().st_size, dtype=torch.uint8)  # mapped, not copied
        except (OSError, RuntimeError, ValueError, TypeError) as err:  # e.g. /dev/shm full: disk still saves
            data, error = None, err
        complete = data is not None
        if self.replicated:
            received, replica_error = self._exchange(data, step, group)
            complete, error = complete and received, error or replica_error
        reports = _gather((complete, rank_cause(self.rank, error) if error is not None else None,
                           _copy_bytes(data, staged)), group)
        ok = all(done for done, _, _ in reports)
        # Complete everywhere: only this step is kept. Otherwise the newest complete one stays besides it, and
        # nothing else (a host that keeps failing must not make the others' copies pile up).
        keep = {step} if ok else {step} | ({self.newest_step} if self.newest_step is not None else set())
        for folder in self._folders():
            mem.keep_only(folder, keep)
        if ok:
            self.newest_step, self._failing, self._failing_here = step, None, None
        else:
            self._failed(step, [c for _, c, _ in reports if c is not None], max(n for _, _, n in reports))
        self._report_bytes()
        return ok

    def _folders(self) -> list[Path]:
        """The folders this rank writes: its own copies, and the replicas of its source."""
        own = mem.own_dir(self.root, self.rank)
        return [own, mem.replica_dir(self.root, self.source)] if self.replicated else [own]

    def _failed(self, step: int, causes: list[RankCause], copy_bytes: int) -> None:
        """A save not complete on every rank: the previous complete step stays. Said by each failing rank and
        reported by rank 0 (a `checkpoint_failed` record with source memory, and the failures metric) once per
        cause, as a failing disk save is; again when the cause changes or after a save that worked."""
        mine = next((c for c in causes if c.rank == self.rank), None)
        cause = primary(causes) if causes else RankCause(self.rank, FailureReason.OTHER, "a rank's copy is missing")
        if mine is not None and mine.reason != self._failing_here:
            log.warning("memory copy of step %d on rank %d failed: %s", step, self.rank, mine.text)
        self._failing_here = mine.reason if mine is not None else None
        if self.metrics is not None and self.rank == 0:
            self.metrics.checkpoint_failures_total.labels(reason=cause.reason.value).inc()
        said, self._failing = self._failing, cause.reason
        if said == cause.reason or self.rank != 0:
            return
        # At the peak a worker holds two steps of its ranks' copies and of their peers' replicas.
        needs = copy_bytes * self.per_worker * (4 if self.replicated else 2)
        newest = f"step {self.newest_step}" if self.newest_step is not None else "none yet"
        message = (f"memory copy of step {step} failed: {in_words(cause, str(self.root.parent), needs)}; training "
                   f"continues and disk checkpoints are not affected; newest complete memory copy: {newest}")
        log.error("%s", message)
        if self.events is not None:
            self.events.emit("checkpoint_failed", step=step, reason=cause.reason.value, message=message,
                             error="; ".join(f"rank {c.rank}: {c.text}" for c in causes),
                             newest_step=self.newest_step, source="memory")

    def _exchange(self, data: torch.Tensor | None, step: int, group: Any) -> tuple[bool, OSError | None]:
        """Send ours to the peer and receive the source's into its replica file: sizes first (all-reduce), then
        the bytes point to point in CHUNK-sized messages. Whether the replica is complete here, and why not when
        this rank could not keep it (None when the source had nothing to send: its own failure says why)."""
        sizes = torch.zeros(self.world_size, dtype=torch.int64)
        sizes[self.rank] = -1 if data is None else data.numel()
        dist.all_reduce(sizes, group=group)  # each rank filled in its own slot only
        work = [] if data is None else [started(dist.isend(data[i:i + CHUNK], dst=self.peer, group=group))
                                        for i in range(0, data.numel(), CHUNK)]
        incoming = int(sizes[self.source])
        error = self._receive_replica(incoming, step, group) if incoming >= 0 else None
        for w in work:
            w.wait()
        return incoming >= 0 and error is None, error

    def _receive_replica(self, nbytes: int, step: int, group: Any) -> OSError | None:
        """Receive the source rank's copy through two reusable CHUNK buffers, each written to the replica's file
        while the next one arrives (receiving into a mapped file took ~1.5 s for 0.55 GB, a page fault per 4 KB;
        this ~0.2 s). Every chunk is received even when the file cannot be written, so the sender is answered;
        the replica is then lost, and why is returned."""
        target = mem.step_file(mem.replica_dir(self.root, self.source), step, self.world_size)
        tmp = mem.temp_file(target)
        out, error = None, None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = open(tmp, "wb")  # closed below, after the last chunk
        except OSError as err:
            error = err
        size = min(CHUNK, nbytes)
        if self._chunks is None or self._chunks[0].numel() < size:
            self._chunks = (torch.empty(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8))
        pending: torch.Tensor | None = None
        for k, start in enumerate(range(0, nbytes, CHUNK)):
            buf = self._chunks[k % 2][:min(CHUNK, nbytes - start)]
            work = started(dist.irecv(buf, src=self.source, group=group))
            error = _write_chunk(out, pending, error)
            work.wait()
            pending = buf
        error = _write_chunk(out, pending, error)
        try:
            if out is not None:
                out.close()
            if error is None:
                os.replace(tmp, target)
        except OSError as err:  # e.g. the file taken away meanwhile: an error here, never an exchange left hanging
            error = error or err
        if error is not None:
            if out is not None:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
            return error
        return None

    def _tidy_root(self, run_dir: Path | None) -> None:
        """Before the first plan or save: copies of another checkpoint dir (an earlier run under the same name whose
        dir was deleted) and folders of another layout are deleted. Every rank waits for every other's tidying,
        so that none deletes what another has already saved."""
        try:
            if run_dir is not None and adopt(self.root, dir_identity(run_dir)):
                log.warning("deleted the memory copies in %s: they belong to an earlier run whose checkpoint dir "
                            "%s was deleted or replaced", self.root, run_dir)
            foreign = mem.drop_foreign(self.root, mem.layout_folders(self.rank, self.world_size, self.per_worker))
            if foreign:
                log.info("deleted the memory copies of another layout in %s: %s", self.root, ", ".join(foreign))
        except OSError as err:  # e.g. the checkpoint dir unreadable: the copies stay, as before identities
            log.warning("could not check whose memory copies %s holds: %s", self.root, err)
        if self.group is not None:
            dist.barrier(group=self.group)

    def release(self) -> None:
        """Drop this rank's copies (the run finished: its final checkpoint is on disk), and those of any other
        layout; the last rank out removes the emptied folders."""
        for folder in self._folders():
            mem.wipe(folder)
        mem.drop_foreign(self.root, mem.layout_folders(self.rank, self.world_size, self.per_worker))
        if not mem.copy_folders(self.root):
            forget_identity(self.root)
        for folder in (self.root, self.root.parent):
            try:
                folder.rmdir()
            except OSError:
                pass
        self._report_bytes()

    def total_bytes(self, group: Any) -> int:
        """Every rank's held_bytes, summed (a collective)."""
        total = torch.tensor([self.held_bytes()], dtype=torch.int64)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(total, group=group)
        return int(total.item())

def thread_stack(prefix: str) -> str:
    """The Python stack of the live thread whose name starts with `prefix`."""
    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread.name.startswith(prefix) and thread.ident in frames:
            return "".join(traceback.format_stack(frames[thread.ident]))
    return f"(no thread named {prefix}*)"


def _gather(mine: Any, group: Any) -> list[Any]:
    """Every rank's `mine` (a collective on `group`)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    found: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(found, mine, group=group)
    return found


def _copy_bytes(data: torch.Tensor | None, staged: dict[str, Any] | None) -> int:
    """The size of this rank's copy: its file, else (it could not be written) its tensors' bytes."""
    if data is not None:
        return data.numel()
    return state_bytes(mem.local_view(staged)) if staged is not None else 0


def _agree(flag: bool, group: Any, *, any_rank: bool) -> bool:
    """any_rank: true if true on some rank; otherwise true only if true on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if any_rank else dist.ReduceOp.MIN, group=group)
    return bool(t.item())


def _write_chunk(out: BinaryIO | None, chunk: torch.Tensor | None, error: OSError | None) -> OSError | None:
    """Write a received chunk unless an earlier write failed; the first failure."""
    if out is None or chunk is None or error is not None:
        return error
    try:
        out.write(chunk.numpy().data)
    except OSError as err:
        return err
    return None
