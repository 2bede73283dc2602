"""The memory tier's restore side (MemoryTier, tiers/peer.py, inherits it): what this rank holds, the plan every
rank agrees on, and the bytes put straight into the live state's tensors.

A rank's own copy is read from its step file, one pread per tensor (in 1 MB pieces, each hashed as it lands:
tiers/memory_file.py); a replica is sent by its holder as the header then the tensors' bytes in STRIPE pieces
(views of the file, mapped), received straight into the tensors and hashed as each tensor completes. The pieces go
round every gloo group the checkpointer owns (none is busy during a restore): each group is a socket of its own, and
one TCP stream does not fill a link (on this 2-core host's loopback, plain gloo moved 0.55 GB in ~0.20 s over one
group, ~0.14 s over two). Measured on 0.55 GB per rank, receiving into a new /dev/shm file (to keep it as the rank's
own copy) took ~1.5 s of page faults against ~0.13 s into the live tensors, so the received copy is not written
back: the holder keeps the replica until the next memory save is complete on every rank, and that save writes this
rank's own copy again.

A copy whose digests do not match is noted (Damage) by the rank that finds it, the reader or a holder about to send
it; checkpoint_restore.py gathers them, has their holders delete them (discard) and plans again.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from flywheel.trainer.checkpoint.tiers import memory as mem
from flywheel.trainer.checkpoint.tiers import memory_file as step_format

log = logging.getLogger("flywheel.checkpoint")
STRIPE = 16 << 20  # bytes per message of a replica sent for a restore


class Damage(NamedTuple):
    """A memory copy found damaged: rank `src`'s state, held on rank `holder`'s host in `path` (as the holder sees
    it), and why."""

    src: int
    holder: int
    path: str
    why: str


class MemoryRestore:
    """What MemoryTier sets up: where the copies are, this rank, the ring's source, the metrics."""

    root: Path
    rank: int
    world_size: int
    source: int
    metrics: Any
    same_host_reads: bool
    damage: list[Damage]
    newest_step: int | None  # the newest step complete in memory on every rank, as far as this run knows

    def _report_bytes(self) -> None:
        if self.metrics is not None and hasattr(self.metrics, "checkpoint_memory_bytes"):
            self.metrics.checkpoint_memory_bytes.set(self.held_bytes())

    def held_bytes(self) -> int:
        """This rank's own copies and the replicas it holds, with any write under way or left by a failure."""
        folders = {mem.own_dir(self.root, self.rank), mem.replica_dir(self.root, self.source)}
        return sum(mem.folder_bytes(f) for f in folders)

    def inventory(self) -> mem.Inventory:
        replicas, files = {}, {}
        for folder in self.root.glob("replica-rank-*") if self.root.is_dir() else []:
            src = int(folder.name.rsplit("-", 1)[1])
            replicas[src] = mem.steps_in(folder)
            for step, (_, world_size) in replicas[src].items():
                try:
                    files[(src, step)] = mem.FileId.of(mem.step_file(folder, step, world_size))
                except OSError:
                    pass  # deleted since listed: the plan then finds it sent over gloo, or not at all
        return mem.Inventory(self.rank, mem.steps_in(mem.own_dir(self.root, self.rank)), replicas, files)

    def plan(self, group: Any, newest_disk_step: int | None) -> mem.MemoryPlan | str:
        """The same plan on every rank, from every rank's inventory."""
        mine = self.inventory()
        inventories: list[Any] = [mine]
        if self.world_size > 1:
            inventories = [None] * self.world_size
            dist.all_gather_object(inventories, mine, group=group)
        plan = mem.plan_restore(inventories, self.world_size, newest_disk_step)
        if isinstance(plan, mem.MemoryPlan):  # complete for every rank: kept should a later save fail
            self.newest_step = plan.step
        return plan

    def restore_into(self, plan: mem.MemoryPlan, template: dict[str, Any], groups: Sequence[Any]) -> dict[str, Any]:
        """`template` (this rank's live state dict) filled in place with this rank's saved state for plan.step,
        straight into the live tensors: read from its own copy, or from its replica's file when that very file is
        visible here (the holder on the same host, sharing /dev/shm), else sent by the rank holding it over `groups`
        (the first carries the agreement and the header; every rank takes part: holders send, receivers receive).
        A copy found damaged, here or by a holder sending it, is noted in `damage` (src rank, holder rank, why) for
        discard."""
        self.damage = []
        mine = plan.sources[self.rank]
        here = mine.holder != self.rank and self.same_host_reads and mine.file is not None and mine.file.visible()
        reads_here = _gather_flags(here, self.world_size, self.rank, groups[0]) if plan.kind == "memory-peer" else []
        sending = [self._send_replica(rank, plan.step, groups) for rank, source in sorted(plan.sources.items())
                   if source.holder == self.rank and rank != self.rank and not reads_here[rank]]
        try:
            if mine.holder == self.rank:
                state = self._read_file(self.copy_path(self.rank, self.rank, plan.step), plan.step, template)
            elif here and mine.file is not None:
                log.info("rank %d reads its replica from %s (same host as rank %d)", self.rank, mine.file.path,
                         mine.holder)
                state = self._read_file(Path(mine.file.path), plan.step, template)
            else:
                state = self._receive(plan.step, template, mine.holder, groups)
        except step_format.DamagedCopy as err:
            path = self.copy_path(self.rank, self.rank, plan.step) if mine.holder == self.rank else (
                mine.file.path if mine.file is not None else "")
            self.damage.append(Damage(self.rank, mine.holder, str(path), str(err)))
            raise
        finally:
            for works, _ in sending:
                for w in works:
                    w.wait()
        return state

    def copy_path(self, src: int, holder: int, step: int) -> Path:
        """The file of rank `src`'s copy of `step` on rank `holder`'s host: its own copy, or the replica."""
        folder = mem.own_dir(self.root, src) if src == holder else mem.replica_dir(self.root, src)
        return mem.step_file(folder, step, self.world_size)

    def discard(self, damage: list[Damage], step: int) -> None:
        """Delete the damaged copies of `step` this rank holds (every rank's `damage`, gathered), so that the next
        plan takes the other copy of that rank's state, or disk. They are deleted, not kept: host memory is scarce
        and a memory copy is only ever a duplicate of a state also saved elsewhere."""
        for found in damage:
            if found.holder == self.rank:
                path = self.copy_path(found.src, found.holder, step)
                log.error("deleting %s: %s", path, found.why)
                with contextlib.suppress(OSError):
                    path.unlink()
        self._report_bytes()

    def _read_file(self, path: Path, step: int, template: dict[str, Any]) -> dict[str, Any]:
        fd = os.open(path, os.O_RDONLY)
        try:
            header, _ = step_format.read_header(fd)
            self._check(header, step)
            state, targets = step_format.resolve(template, header.state)
            step_format.read_into(fd, header, targets, f"the memory copy {path}")
        finally:
            os.close(fd)
        return state

    def _send_replica(self, src: int, step: int, groups: Sequence[Any]) -> tuple[list[dist.Work], mmap.mmap | None]:
        """Send the replica of rank `src` to it: the header (length, then bytes) over the first group, then the
        tensors' bytes in pieces (_pieces), each a view of the file mapped from /dev/shm. A replica that cannot be
        read (damaged, or gone) is answered with a zero length, so its rank is never left waiting."""
        group = groups[0]
        path = self.copy_path(src, self.rank, step)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                header, raw = step_format.read_header(fd)
                # Not pre-faulted (MAP_POPULATE held the header back ~0.04 s per 0.55 GB): the pages fault in as
                # gloo sends them, a piece at a time, while the receiver takes the ones before.
                mapped = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        except (OSError, ValueError) as err:
            if isinstance(err, step_format.DamagedCopy):
                self.damage.append(Damage(src, self.rank, str(path), str(err)))
            log.warning("rank %d cannot send rank %d's replica of step %d: %s", self.rank, src, step, err)
            return [started(dist.isend(torch.zeros(1, dtype=torch.int64), dst=src, group=group))], None
        with warnings.catch_warnings():  # read-only: the bytes are only sent
            warnings.simplefilter("ignore", UserWarning)
            data = torch.frombuffer(mapped, dtype=torch.uint8)
        raw_tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        works = [started(dist.isend(torch.tensor([len(raw)], dtype=torch.int64), dst=src, group=group)),
                 started(dist.isend(raw_tensor, dst=src, group=group))]
        refs = step_format.refs_of(header.state)
        for i, offset, size, piece_group in _pieces([ref.nbytes for ref in refs], groups):
            start = header.data_start + refs[i].offset + offset
            works.append(started(dist.isend(data[start:start + size], dst=src, group=piece_group)))
        return works, mapped

    def _receive(self, step: int, template: dict[str, Any], holder: int, groups: Sequence[Any]) -> dict[str, Any]:
        """This rank's state from its replica on `holder`, received straight into the live tensors. Every message
        the holder sends is received even when the header does not fit the state (then raises after)."""
        group = groups[0]
        length = torch.zeros(1, dtype=torch.int64)
        dist.recv(length, src=holder, group=group)
        if not length.item():
            raise ValueError(f"rank {holder} could not send rank {self.rank}'s replica of step {step} (its log "
                             "says why)")
        raw = torch.empty(int(length.item()), dtype=torch.uint8)
        dist.recv(raw, src=holder, group=group)
        header = step_format.parse_header(raw.numpy().tobytes())
        error: Exception | None = None
        try:
            self._check(header, step)
            state, targets = step_format.resolve(template, header.state)
        except ValueError as err:
            error, state = err, {}
            targets = [step_format.Target(ref, torch.empty(ref.shape, dtype=ref.dtype), "")
                       for ref in step_format.refs_of(header.state)]
        bufs = [t.dst if step_format.direct(t.dst) else torch.empty(t.ref.shape, dtype=t.ref.dtype) for t in targets]
        works: list[list[dist.Work]] = [[] for _ in targets]
        for i, offset, size, piece_group in _pieces([t.ref.nbytes for t in targets], groups):
            piece = step_format.raw_bytes(bufs[i])[offset:offset + size]
            works[i].append(started(dist.irecv(piece, src=holder, group=piece_group)))
        bad: list[str] = []
        for target, buf, pieces in zip(targets, bufs, works):  # each checked as it lands, while the next ones arrive
            for work in pieces:
                work.wait()
            bad += step_format.damaged([(target, buf)])
            if buf is not target.dst:
                target.dst.copy_(buf)
        if error is None and bad:
            error = step_format.DamagedCopy(f"rank {self.rank}'s replica sent by rank {holder}", bad)
        if error is not None:
            raise error
        return state

    def _check(self, header: step_format.Header, step: int) -> None:
        if header.step != step or header.rank != self.rank or header.world_size != self.world_size:
            raise ValueError(f"memory copy holds step {header.step} of rank {header.rank} at world size "
                             f"{header.world_size}, expected step {step} of rank {self.rank}")



def _pieces(sizes: list[int], groups: Sequence[Any]) -> Iterator[tuple[int, int, int, Any]]:
    """The messages of a replica's bytes, the same on the sending and the receiving rank: (tensor index, offset,
    size, group) for each tensor's bytes in STRIPE pieces, the pieces taken round `groups` in turn. A tensor with no
    bytes has no message."""
    turn = 0
    for i, nbytes in enumerate(sizes):
        for offset in range(0, nbytes, STRIPE):
            yield i, offset, min(STRIPE, nbytes - offset), groups[turn % len(groups)]
            turn += 1


def _gather_flags(flag: bool, world_size: int, rank: int, group: Any) -> list[bool]:
    """Every rank's flag (a collective)."""
    flags = torch.zeros(world_size, dtype=torch.int32)
    flags[rank] = int(flag)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(flags, group=group)  # each rank filled in its own slot only
    return [bool(f) for f in flags.tolist()]


def started(work: dist.Work | None) -> dist.Work:
    # isend/irecv return None only for a rank outside the group; every rank here is in it.
    assert work is not None
    return work
