"""Restore: the newest state any tier holds, the same on every rank.

Memory first (checkpoint_memory.py, checkpoint_peer.py): when every rank's copy of one step is in memory (its own,
or a peer's replica of it) and that step is at least as new as the newest committed disk checkpoint, the ranks load
it; a copy whose bytes do not match their digests is deleted, reported, and the other copy of that rank's state is
taken when there is one. Otherwise, or when it fails to load on any rank, the newest committed disk checkpoint
(with an object-store dir, checkpoint_remote.py, the local directory's and the bucket's, a step missing locally
downloaded first): each one's files are verified against the checksums of its commit first
(checkpoint_integrity.py); a damaged one is marked bad, reported and skipped for the previous one. A disk
checkpoint that fails to load on any rank is skipped, with a warning, for the previous committed one. If
committed checkpoints exist but none loads, raises: parts of the state may already be overwritten. Every source
fills the same state dict that app.load_state_dict takes, so the restored state is bitwise the same whichever tier
it came from.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from flywheel.trainer import checkpoint_integrity as integrity
from flywheel.trainer import checkpoint_store as store
from flywheel.trainer.checkpoint_failure import describe_failure
from flywheel.trainer.checkpoint_peer_restore import Damage
from flywheel.trainer.checkpoint_state import AppState, drop_rng_not_saved

if TYPE_CHECKING:
    from flywheel.trainer.checkpoint import Checkpointer

log = logging.getLogger("flywheel.checkpoint")

_FAILURES = (Exception, CheckpointException)  # DCP's CheckpointException derives from BaseException
DISK = "disk"


def restore(ck: Checkpointer, app: AppState) -> int | None:
    """The step restored into app (None: nothing to restore); see the module's docstring."""
    listing: list[Any] = [None]
    if ck.rank == 0:
        _tidy(ck)
        listing[0] = _candidates(ck)
    if ck.distributed:
        dist.broadcast_object_list(listing, src=0, group=ck._control_group)
    candidates: list[Candidate] = listing[0]
    if ck.memory is not None:
        step = _from_memory(ck, app, candidates[0][0] if candidates else None)
        if step is not None:
            return step
    return _from_disk(ck, app, candidates)


def _tidy(ck: Checkpointer) -> None:
    """Rank 0, before listing: checkpoints whose commit marker is damaged are set aside (kept, reported), then torn
    folders (no marker) removed."""
    damaged: list[tuple[int, Path | str, str]] = [*store.set_aside_damaged(ck.directory)]
    if ck.remote is not None:
        damaged += ck.remote.set_aside_damaged()
    for step, kept, why in damaged:
        _report_bad(ck, step, kept, why)
    for torn in store.remove_uncommitted(ck.directory):
        log.info("removed torn checkpoint %s (no commit marker)", torn)


Candidate = tuple[int, str, int, dict[str, str], bool]  # step, path, world size, checksums, in the bucket


def _candidates(ck: Checkpointer) -> list[Candidate]:
    """Rank 0: the committed checkpoints, newest first: the local directory's and, with an object-store dir, the
    bucket's (checkpoint_remote.py)."""
    local = store.committed(ck.directory)
    if ck.remote is None:
        return [(r.step, r.path, r.world_size, r.checksums, False) for r in reversed(local)]
    return [(r.step, r.path, r.world_size, r.checksums, in_bucket) for r, in_bucket in ck.remote.candidates(local)]


def _from_memory(ck: Checkpointer, app: AppState, newest_disk_step: int | None) -> int | None:
    """A damaged copy (its digests, checkpoint_memory_file.py) is deleted by its holder and reported, and the plan
    made again: the same step from that rank's other copy when there is one, else disk. Any other failure: disk."""
    assert ck.memory is not None
    for _ in range(MEMORY_PLANS):
        plan = ck.memory.plan(ck._control_group, newest_disk_step)
        if isinstance(plan, str):
            log.info("not restoring from memory (%s); restoring from disk", plan)
            return None
        error: BaseException | None = None
        try:
            state = app.state_dict(include_rng=True)
            state["step"] = -1
            app.load_state_dict(ck.memory.restore_into(plan, state, ck._control_group))
        except _FAILURES as err:
            error = err
        reports = _gather(ck, (error is None, ck.memory.damage))
        if all(ok for ok, _ in reports):
            after_restore(ck, plan.step, str(ck.memory.root), ck.world_size, plan.kind,
                          detail=f"this rank's copy: {plan.source_of(ck.rank)}")
            return plan.step
        damage = [d for _, part in reports for d in part]
        if not damage:
            cause = describe_failure(error) if error is not None else "it failed to load on another rank"
            log.warning("could not restore step %d from memory: %s; restoring from disk", plan.step, cause)
            return None
        _drop_damaged(ck, damage, plan.step)
    return None


MEMORY_PLANS = 3  # each damaged copy found is deleted before the next plan: one rank's two copies, then disk


def _drop_damaged(ck: Checkpointer, damage: list[Damage], step: int) -> None:
    assert ck.memory is not None
    ck.memory.discard(damage, step)  # each holder says what it deleted; rank 0 says why, once
    for found in damage if ck.rank == 0 else []:
        log.error("the memory copy of step %d for rank %d (on rank %d's host) is damaged (%s): deleted; taking "
                  "another copy, else the disk checkpoint", step, found.src, found.holder, found.why)
        if ck.events is not None:
            ck.events.emit("checkpoint_bad", step=step, path=found.path, reason=found.why, source="memory")


def _gather(ck: Checkpointer, mine: Any) -> list[Any]:
    """Every rank's `mine` (a collective on the control group)."""
    if not ck.distributed:
        return [mine]
    found: list[Any] = [None] * ck.world_size
    dist.all_gather_object(found, mine, group=ck._control_group)
    return found


def _from_disk(ck: Checkpointer, app: AppState, candidates: list[Candidate]) -> int | None:
    failed: list[str] = []
    for step, path, saved_world, sums, in_bucket in candidates:
        fetched = False
        if ck.remote is not None:  # every rank: a local copy, downloaded from the bucket when missing
            path, fetched = ck.remote.ensure_local(step, in_bucket)
            if not path:
                continue
        if not verified(ck, step, path, sums, from_bucket=fetched):
            continue
        error: BaseException | None = None
        try:
            state = app.state_dict(include_rng=saved_world == ck.world_size)
            state["step"] = -1
            reader = FileSystemReader(path)
            drop_rng_not_saved(state, ck.rank, reader.read_metadata().state_dict_metadata)
            dcp_load(state, storage_reader=reader, process_group=ck._write_group)
            if state["step"] != step:
                raise ValueError(f"holds step {state['step']} but its commit marker says {step}")
            app.load_state_dict(state)
        except _FAILURES as err:
            error = err
        if ck._agree(error is None, ck._write_group, any_rank=False):
            after_restore(ck, step, path, saved_world, DISK)
            return step
        cause = describe_failure(error) if error is not None else "it failed to load on another rank"
        log.warning("could not restore checkpoint %s: %s; falling back to the previous committed checkpoint",
                    path, cause)
        failed.append(f"{path} ({cause})")
    if failed:
        raise RuntimeError(f"none of the committed checkpoints under {ck.directory} could be loaded: "
                           f"{'; '.join(failed)}. Parts of the state may already be overwritten, so training "
                           "does not start from scratch; repair or remove these checkpoints")
    log.info("no committed checkpoint under %s; starting from scratch", ck.directory)
    return None


def verified(ck: Checkpointer, step: int, path: str, sums: dict[str, str], *, from_bucket: bool = False) -> bool:
    """Whether the checkpoint's files match their committed checksums, each rank checking its share; a
    damaged one is marked bad (kept, renamed) and reported by rank 0. The same answer on every rank."""
    mine = {n: sums[n] for n in integrity.share(list(sums), ck.rank, ck.world_size)}
    found: list[Any] = [integrity.damaged(path, mine)]
    if ck.distributed:
        found = [None] * ck.world_size
        dist.all_gather_object(found, integrity.damaged(path, mine), group=ck._control_group)
    damage = [d for part in found for d in part]
    if not damage:
        return True
    reason = "; ".join(damage[:5]) + (f" (and {len(damage) - 5} more)" if len(damage) > 5 else "")
    if ck.rank == 0:
        _report_bad(ck, step, integrity.mark_bad(path, reason), reason)
        if from_bucket and ck.remote is not None:
            ck.remote.mark_bad(step, reason)
    return False


def _report_bad(ck: Checkpointer, step: int, kept: Path | str, reason: str) -> None:
    """Rank 0: a damaged checkpoint, already marked bad (kept as `kept`), said in the log and as an event."""
    log.error("checkpoint at step %d is damaged (%s): kept as %s for inspection, never restored; falling back to "
              "the previous good checkpoint", step, reason, kept)
    if ck.events is not None:
        ck.events.emit("checkpoint_bad", step=step, path=str(kept), reason=reason)


def after_restore(ck: Checkpointer, step: int, path: str, saved_world: int, source: str, detail: str = "") -> None:
    ck.restored_path = path
    if source == DISK:  # a restored memory step may still be saved to disk
        ck._last_requested_step = step
    ck._last_save_time = time.monotonic()
    rng = "restored" if saved_world == ck.world_size else "not restored (world size changed)"
    log.info("restored step %d from %s (%s%s; saved at world size %d, now %d; RNG %s)", step, path, source,
             f", {detail}" if detail else "", saved_world, ck.world_size, rng)
    if ck.metrics is not None and source == DISK:
        ck.metrics.checkpoint_last_step.set(step)
    if ck.events is not None and ck.rank == 0:
        ck.events.emit("restore", step=step, path=path, from_world_size=saved_world, world_size=ck.world_size,
                       source=source)
