"""Restore: the newest state any tier holds, the same on every rank.

Memory first (tiers/memory.py, tiers/peer.py): when every rank's copy of one step is in memory (its own,
or a peer's replica of it) and that step is at least as new as the newest committed disk checkpoint, the ranks load
it; a copy whose bytes do not match their digests is deleted, reported, and the other copy of that rank's state is
taken when there is one. Otherwise, or when it fails to load on any rank, the newest committed disk checkpoint
(with an object-store dir, tiers/remote.py, the local directory's and the bucket's; a step a rank's local
directory lacks, or holds only in part, downloaded first): each one's files are verified against the checksums of
its commit first (integrity.py); a damaged one is marked bad and reported; a damaged local copy is
replaced by the bucket's copy of the same step when there is one (the bucket's copy is marked bad only for damage
in files downloaded from it), else the previous step is tried. An unreadable bucket, or a download that keeps
failing, fails the start: taken for empty, it would start training from scratch. A disk checkpoint that fails to
load on any rank is skipped, with a warning, for the previous committed one. If committed checkpoints exist but
none loads, or a failed memory restore wrote into the state and no disk checkpoint loads over it, raises: parts
of the state may already be overwritten. Every source fills the same state dict that app.load_state_dict takes,
so the restored state is bitwise the same whichever tier it came from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from flywheel.agent.worker_env import UserError
from flywheel.trainer.checkpoint import integrity, model_check, store
from flywheel.trainer.checkpoint.failure import describe_failure
from flywheel.trainer.checkpoint.state import AppState, drop_not_saved
from flywheel.trainer.checkpoint.tiers.peer_restore import Damage
from flywheel.trainer.checkpoint.tiers.remote import RemoteUnreadable

if TYPE_CHECKING:
    from flywheel.trainer.checkpoint.tiers.peer import MemoryTier
    from flywheel.trainer.checkpoint.tiers.remote import RemoteTier

log = logging.getLogger("flywheel.checkpoint")

_FAILURES = (Exception, CheckpointException)  # DCP's CheckpointException derives from BaseException
DISK = "disk"
Candidate = tuple[int, str, int, dict[str, str], bool]  # step, path, world size, checksums, in the bucket


@dataclass(frozen=True)
class RestoreContext:
    """What a restore reads of the Checkpointer; what it changes there comes back as `Restored`."""

    rank: int
    world_size: int
    distributed: bool
    directory: Path  # the local checkpoint directory (an object-store dir's staging directory)
    memory: MemoryTier | None
    remote: RemoteTier | None
    control_group: Any  # the gloo group of the small agreements (listing, verdicts, gathers)
    write_group: Any  # the gloo group DCP loads over
    transfer_groups: list[Any]  # the groups a memory restore sends replicas over
    all_agree: Callable[[bool], bool]  # true only if true on every rank (a collective on write_group)
    events: Any = None
    metrics: Any = None


@dataclass(frozen=True)
class Restored:
    """What was loaded: the Checkpointer's bookkeeping follows from it."""

    step: int
    path: str
    source: str  # DISK, or the memory plan's kind


def restore(ctx: RestoreContext, app: AppState) -> Restored | None:
    """What was restored into app (None: nothing to restore); see the module's docstring."""
    listing: list[Any] = [None]
    if ctx.rank == 0:
        try:
            listing[0] = _candidates(ctx)
        except RemoteUnreadable as err:
            listing[0] = str(err)  # every rank raises it: the others wait on this broadcast
    if ctx.distributed:
        dist.broadcast_object_list(listing, src=0, group=ctx.control_group)
    if isinstance(listing[0], str):
        raise RemoteUnreadable(listing[0])
    candidates: list[Candidate] = listing[0]
    touched = False
    if ctx.memory is not None:
        restored, touched = _from_memory(ctx, app, candidates[0][0] if candidates else None)
        if restored is not None:
            return restored
    restored = _from_disk(ctx, app, candidates)
    if restored is None and touched:
        raise RuntimeError(
            f"restoring from the memory copies under {ctx.memory.root if ctx.memory else ''} failed after it had "
            f"written into the model and optimizer state, and there is no committed checkpoint under {ctx.directory} "
            "(spec.checkpoint.dir) to load over it; training does not start from scratch with that state. Damaged "
            "memory copies are deleted, so restarting the job starts cleanly; if this start fails the same way "
            "again, delete that memory folder to start from scratch")
    return restored


def _candidates(ctx: RestoreContext) -> list[Candidate]:
    """Rank 0: checkpoints whose commit marker is damaged are set aside (kept, reported), torn folders (no marker)
    removed; then the committed checkpoints, newest first: the local directory's and, with an object-store dir,
    the bucket's (tiers/remote.py; an unreadable bucket raises RemoteUnreadable)."""
    damaged: list[tuple[int, Path | str, str]] = [*store.set_aside_damaged(ctx.directory)]
    for torn in store.remove_uncommitted(ctx.directory):
        log.info("removed torn checkpoint %s (no commit marker)", torn)
    local = store.committed(ctx.directory)
    if ctx.remote is None:
        found = [(r.step, r.path, r.world_size, r.checksums, False) for r in reversed(local)]
    else:
        in_bucket_damaged, both = ctx.remote.survey(local)
        damaged += in_bucket_damaged
        found = [(r.step, r.path, r.world_size, r.checksums, in_bucket) for r, in_bucket in both]
    for step, kept, why in damaged:
        _report_bad(ctx, step, kept, why)
    return found


def _from_memory(ctx: RestoreContext, app: AppState, newest_disk_step: int | None) -> tuple[Restored | None, bool]:
    """A damaged copy (its digests, tiers/memory_file.py) is deleted by its holder and reported, and the plan
    made again: the same step from that rank's other copy when there is one, else disk. Any other failure: disk.
    (what was restored, whether a failed attempt may have written into app's live tensors)."""
    assert ctx.memory is not None
    touched = False
    for _ in range(MEMORY_PLANS):
        plan = ctx.memory.plan(ctx.control_group, newest_disk_step)
        if isinstance(plan, str):
            log.info("not restoring from memory (%s); restoring from disk", plan)
            return None, touched
        touched = True  # restore_into writes each tensor's bytes before its digest is checked
        error: BaseException | None = None
        try:
            state = app.state_dict(include_rng=True)
            state["step"] = -1
            app.load_state_dict(ctx.memory.restore_into(plan, state, ctx.transfer_groups))
        except _FAILURES as err:
            error = err
        reports = _gather(ctx, (error is None, ctx.memory.damage))
        if all(ok for ok, _ in reports):
            return _announce(ctx, plan.step, str(ctx.memory.root), ctx.world_size, plan.kind,
                             detail=f"this rank's copy: {plan.source_of(ctx.rank)}"), False
        damage = [d for _, part in reports for d in part]
        if not damage:
            cause = describe_failure(error) if error is not None else "it failed to load on another rank"
            log.warning("could not restore step %d from memory: %s; restoring from disk", plan.step, cause)
            return None, touched
        _drop_damaged(ctx, damage, plan.step)
    return None, touched


MEMORY_PLANS = 3  # each damaged copy found is deleted before the next plan: one rank's two copies, then disk


def _drop_damaged(ctx: RestoreContext, damage: list[Damage], step: int) -> None:
    assert ctx.memory is not None
    ctx.memory.discard(damage, step)  # each holder says what it deleted; rank 0 says why, once
    for found in damage if ctx.rank == 0 else []:
        log.error("the memory copy of step %d for rank %d (on rank %d's host) is damaged (%s): deleted; taking "
                  "another copy, else the disk checkpoint", step, found.src, found.holder, found.why)
        if ctx.events is not None:
            ctx.events.emit("checkpoint_bad", step=step, path=found.path, reason=found.why, source="memory")


def _gather(ctx: RestoreContext, mine: Any) -> list[Any]:
    """Every rank's `mine` (a collective on the control group)."""
    if not ctx.distributed:
        return [mine]
    found: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(found, mine, group=ctx.control_group)
    return found


def _from_disk(ctx: RestoreContext, app: AppState, candidates: list[Candidate]) -> Restored | None:
    failed: list[str] = []
    expected: model_check.ModelTensors | None = None
    for candidate in candidates:
        path = _usable_copy(ctx, candidate)
        if not path:
            continue
        step, _, saved_world, _, _ = candidate
        expected = expected if expected is not None else _model_tensors(ctx, app)
        _refuse_another_model(ctx, step, path, expected)
        error = _load(ctx, app, step, path, saved_world)
        if ctx.all_agree(error is None):
            return _announce(ctx, step, path, saved_world, DISK)
        cause = describe_failure(error) if error is not None else "it failed to load on another rank"
        log.warning("could not restore checkpoint %s: %s; falling back to the previous committed checkpoint",
                    path, cause)
        failed.append(f"{path} ({cause})")
    if failed:
        raise RuntimeError(f"none of the committed checkpoints under {ctx.directory} could be loaded: "
                           f"{'; '.join(failed)}. Parts of the state may already be overwritten, so training "
                           "does not start from scratch; repair or remove these checkpoints")
    log.info("no committed checkpoint under %s; starting from scratch", ctx.directory)
    return None


def _model_tensors(ctx: RestoreContext, app: AppState) -> model_check.ModelTensors:
    """The model's checkpoint keys and global shapes, every rank's together (a pipeline rank holds its stages')."""
    mine = model_check.model_tensors(app.state_dict(include_rng=False)["model"])
    return {key: shape for part in _gather(ctx, mine) for key, shape in part.items()}


def _refuse_another_model(ctx: RestoreContext, step: int, path: str, expected: model_check.ModelTensors) -> None:
    """Raises UserError on every rank when the checkpoint at `path` holds another model (model_check.py).
    Unreadable metadata is left to the load, which reports it and tries the previous checkpoint."""
    try:
        saved = model_check.saved_model_tensors(FileSystemReader(path).read_metadata().state_dict_metadata)
        what = model_check.mismatch(saved, expected)
    except _FAILURES:
        what = None
    what = next((found for found in _gather(ctx, what) if found), None)
    if what:
        raise UserError(model_check.advice(step, path, str(ctx.directory), what))


def _usable_copy(ctx: RestoreContext, candidate: Candidate) -> str:
    """Every rank: the local folder of the candidate, whole and matching its checksums, else "". With an
    object-store dir, a missing or partial local copy is downloaded first, and a damaged local copy is replaced by
    the bucket's copy of the same step (before any older step is tried)."""
    step, path, _, sums, in_bucket = candidate
    if ctx.remote is None:
        return path if _verify(ctx, step, path, sums, None) is Verdict.GOOD else ""
    for _ in range(2):  # the local copy, then (it damaged) the bucket's
        path, held = ctx.remote.ensure_local(step, in_bucket)
        if not path:
            return ""
        verdict = _verify(ctx, step, path, sums, held)
        if verdict is not Verdict.LOCAL_DAMAGED or not in_bucket:
            break
        log.warning("fetching checkpoint step %d again from %s", step, ctx.remote.url)
    return path if verdict is Verdict.GOOD else ""


def _load(ctx: RestoreContext, app: AppState, step: int, path: str, saved_world: int) -> BaseException | None:
    """This rank's part of the checkpoint at `path` into app; the error, if it failed here."""
    try:
        state = app.state_dict(include_rng=saved_world == ctx.world_size)
        state["step"] = -1
        reader = FileSystemReader(path)
        drop_not_saved(state, ctx.rank, reader.read_metadata().state_dict_metadata)
        dcp_load(state, storage_reader=reader, process_group=ctx.write_group)
        if state["step"] != step:
            raise ValueError(f"holds step {state['step']} but its commit marker says {step}")
        app.load_state_dict(state)
    except _FAILURES as err:
        return err
    return None


class Verdict(Enum):
    GOOD = "good"
    LOCAL_DAMAGED = "local"  # damage only in files the local directory already held: the bucket may be good
    BUCKET_DAMAGED = "bucket"  # damage in files just downloaded: the bucket's copy is marked bad too


def verified(ctx: RestoreContext, step: int, path: str, sums: dict[str, str]) -> bool:
    """Whether the checkpoint's files match their committed checksums (_verify, a local directory's copy)."""
    return _verify(ctx, step, path, sums, None) is Verdict.GOOD


def _verify(ctx: RestoreContext, step: int, path: str, sums: dict[str, str], held: set[str] | None) -> Verdict:
    """Each rank checks its share of the files; a damaged copy is marked bad (kept, renamed) on every rank that
    has one and reported by rank 0. `held`: the files this rank's folder held before any download (None: all).
    The bucket's copy is marked bad only for damage in a downloaded file. The same answer on every rank."""
    mine = {n: sums[n] for n in integrity.share(list(sums), ctx.rank, ctx.world_size)}
    fetched = set() if held is None else set(mine) - held
    parts = (integrity.damaged(path, {n: c for n, c in mine.items() if n not in fetched}),
             integrity.damaged(path, {n: c for n, c in mine.items() if n in fetched}))
    found = _gather(ctx, parts)
    local, downloaded = [d for part, _ in found for d in part], [d for _, part in found for d in part]
    if not local and not downloaded:
        return Verdict.GOOD
    reason = _reason(local + downloaded)
    if ctx.rank == 0:
        _report_bad(ctx, step, integrity.mark_bad(path, reason), reason)
        if downloaded and ctx.remote is not None:
            ctx.remote.mark_bad(step, _reason(downloaded))
    if ctx.distributed:
        dist.barrier(group=ctx.control_group)  # rank 0 renamed its folder: a folder still there is another copy
    if ctx.rank != 0 and Path(path).is_dir() and not integrity.is_bad(path):
        try:
            log.warning("checkpoint at step %d is damaged: this rank's copy kept as %s", step,
                        integrity.mark_bad(path, reason))
        except OSError as err:  # a directory shared with rank 0, renamed meanwhile
            log.debug("could not mark %s bad: %s", path, err)
    return Verdict.BUCKET_DAMAGED if downloaded else Verdict.LOCAL_DAMAGED


def _reason(damage: list[str]) -> str:
    return "; ".join(damage[:5]) + (f" (and {len(damage) - 5} more)" if len(damage) > 5 else "")


def _report_bad(ctx: RestoreContext, step: int, kept: Path | str, reason: str) -> None:
    """Rank 0: a damaged checkpoint, already marked bad (kept as `kept`), said in the log and as an event."""
    log.error("checkpoint at step %d is damaged (%s): kept as %s for inspection, never restored; falling back to "
              "the previous good checkpoint", step, reason, kept)
    if ctx.events is not None:
        ctx.events.emit("checkpoint_bad", step=step, path=str(kept), reason=reason)


def _announce(ctx: RestoreContext, step: int, path: str, saved_world: int, source: str,
              detail: str = "") -> Restored:
    """The restore said in the log, the metrics and (rank 0) an event."""
    rng = "restored" if saved_world == ctx.world_size else "not restored (world size changed)"
    log.info("restored step %d from %s (%s%s; saved at world size %d, now %d; RNG %s)", step, path, source,
             f", {detail}" if detail else "", saved_world, ctx.world_size, rng)
    if ctx.metrics is not None and source == DISK:
        ctx.metrics.checkpoint_last_step.set(step)
    if ctx.events is not None and ctx.rank == 0:
        ctx.events.emit("restore", step=step, path=path, from_world_size=saved_world, world_size=ctx.world_size,
                        source=source)
    return Restored(step, path, source)
