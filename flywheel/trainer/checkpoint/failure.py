"""Why a checkpoint save failed, in words, and its report (rank 0: make room, log, event, metric).

A failed save may raise on several ranks with different exceptions: the rank whose disk filled up raises ENOSPC,
while another sees only a follow-on error (a file its peer never finished, "staging failed on another rank"). The
committing rank (global rank 0) gathers every rank's cause and reports the most telling one: a named OS cause (no
space, permission, I/O error) before anything else, the lowest rank first among equals.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from flywheel.trainer.checkpoint import store

log = logging.getLogger("flywheel.checkpoint")


class FailureReason(StrEnum):
    """The `reason` label of flywheel_checkpoint_failures_total and of the `checkpoint_failed` record."""

    NO_SPACE = "no_space"
    PERMISSION = "permission"
    IO_ERROR = "io_error"
    OTHER = "other"


_PRIORITY = (FailureReason.NO_SPACE, FailureReason.PERMISSION, FailureReason.IO_ERROR, FailureReason.OTHER)
_ERRNO_REASONS = {errno.ENOSPC: FailureReason.NO_SPACE, errno.EDQUOT: FailureReason.NO_SPACE,
                  errno.EACCES: FailureReason.PERMISSION, errno.EPERM: FailureReason.PERMISSION,
                  errno.EROFS: FailureReason.PERMISSION}


@dataclass(frozen=True)
class RankCause:
    rank: int
    reason: FailureReason
    text: str  # "OSError: [Errno 28] No space left on device"


class SaveFailed(RuntimeError):
    """A save that failed on some rank, with every rank's cause known here (gathered before raising)."""

    def __init__(self, causes: list[RankCause]) -> None:
        self.causes = causes
        super().__init__("; ".join(f"rank {c.rank}: {c.text}" for c in causes))


class FinalSaveFailed(RuntimeError):
    """The run's final state could not be saved where the job keeps its checkpoints. The run does not end as a
    success without it: the worker fails (retried; a restart restores the newest copy and saves it again)."""


def classify(err: BaseException) -> FailureReason:
    """The reason of one exception, following its causes (DCP and torch wrap OS errors)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return _ERRNO_REASONS.get(current.errno or 0, FailureReason.IO_ERROR)
        current = current.__cause__ or current.__context__
    return FailureReason.OTHER


def rank_cause(rank: int, err: BaseException) -> RankCause:
    return RankCause(rank, classify(err), f"{type(err).__name__}: {err}")


def causes_of(err: BaseException, rank: int) -> list[RankCause]:
    """Every rank's cause that this rank knows of: DCP's exception and SaveFailed carry all of them."""
    # Imported here: trainer_metrics reads FailureReason, and flywheel.progress imports it without torch.
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, SaveFailed):
        return list(err.causes)
    if isinstance(err, CheckpointException):
        return [rank_cause(r, exc) for r, (exc, _) in sorted(err.failures.items())]
    return [rank_cause(rank, err)]


def primary(causes: Iterable[RankCause]) -> RankCause:
    """The cause to report: the most specific reason, then the lowest rank (follow-on errors rank last)."""
    return min(causes, key=lambda c: (_PRIORITY.index(c.reason), c.rank))


def human_bytes(n: int) -> str:
    units, size, i = ("B", "KB", "MB", "GB", "TB"), float(n), 0
    while size >= 1000 and i < len(units) - 1:
        size, i = size / 1000, i + 1
    return f"{n} B" if i == 0 else f"{size:.1f} {units[i]}"


def in_words(cause: RankCause, directory: str, needs_bytes: int | None) -> str:
    """What went wrong, e.g. 'no space left on /ckpt (needs ~1.8 MB)'."""
    if cause.reason is FailureReason.NO_SPACE:
        needs = f" (needs ~{human_bytes(needs_bytes)})" if needs_bytes else ""
        return f"no space left on {directory}{needs}"
    if cause.reason is FailureReason.PERMISSION:
        return f"no permission to write {directory} ({cause.text})"
    if cause.reason is FailureReason.IO_ERROR:
        return f"I/O error writing {directory} ({cause.text})"
    return f"rank {cause.rank}: {cause.text}"


def failure_message(step: int, words: str, newest_good: int | None) -> str:
    """The one line a failed save is reported with, in the run's output, the job's events and the log."""
    newest = f"step {newest_good}" if newest_good is not None else "none yet"
    return f"checkpoint at step {step} failed: {words}; training continues; newest good checkpoint: {newest}"


def describe_failure(err: BaseException) -> str:
    """One line naming the cause; for DCP's CheckpointException, each failing rank's own exception."""
    from torch.distributed.checkpoint.api import CheckpointException

    if isinstance(err, CheckpointException):
        return "; ".join(f"rank {rank}: {type(exc).__name__}: {exc}" for rank, (exc, _) in err.failures.items())
    return f"{type(err).__name__}: {err}"


def state_bytes(state: dict[str, Any]) -> int:
    """This rank's tensor bytes in a state dict: the size a first save needs, roughly (its shard or a replica)."""
    import torch

    total = 0
    stack: list[Any] = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


class FailedSave(Protocol):
    step: int
    path: Path


def report_failure(directory: Path, record: FailedSave, err: BaseException, state: dict[str, Any],
                   known_step: int | None, *, events: Any, metrics: Any) -> str:
    """Global rank 0, after a failed save: with no space left, make room first; then the most telling cause, once,
    in words with the newest good checkpoint (store.newest_good: `known_step`, the step this run restored from disk
    or committed last, when it is there), in the log, a `checkpoint_failed` record and
    flywheel_checkpoint_failures_total{reason}. The cause in words."""
    cause = primary(causes_of(err, 0))
    good = store.newest_good(directory, known_step)
    needs = store.folder_bytes(good.path) if good else state_bytes(state)
    if cause.reason is FailureReason.OTHER and short_of_space(directory, needs):
        # A full disk without ENOSPC in sight: torch's zip writer reports a short write as "unexpected pos".
        cause = RankCause(cause.rank, FailureReason.NO_SPACE, cause.text)
    if cause.reason is FailureReason.NO_SPACE:
        _make_room(directory, known_step)  # deletes only older checkpoints than `good`
    newest_step = good.step if good else None
    words = in_words(cause, str(directory), needs)
    message = failure_message(record.step, words, newest_step)
    log.error("%s", message)
    if metrics is not None:
        metrics.checkpoint_failures_total.labels(reason=cause.reason.value).inc()
    if events is not None:
        events.emit("checkpoint_failed", step=record.step, reason=cause.reason.value, message=message,
                    error=f"{record.path}: {describe_failure(err)}", newest_step=newest_step)
    return words


def short_of_space(directory: Path, needs_bytes: int) -> bool:
    """Whether the filesystem of `directory` has less room than a save needs (the failed one's partial folder is
    gone by now); False when that cannot be read."""
    try:
        return shutil.disk_usage(directory).free < needs_bytes
    except OSError:
        return False


def _make_room(directory: Path, known_step: int | None) -> None:
    """Disk full: committed checkpoints older than the newest good one go so that the next save fits. That one
    stays, and so does a newer one that failed to load at restore (kept for inspection: not proven damaged)."""
    good = store.newest_good(directory, known_step)
    if good is None:
        return
    try:
        for path in store.delete_older(directory, good.step):
            log.warning("deleted checkpoint %s to make room (no space left on %s; newest good: step %d)", path,
                        directory, good.step)
    except OSError as err:
        log.warning("could not make room under %s: %s", directory, err)
