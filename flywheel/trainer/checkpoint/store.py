"""The on-disk layout of checkpoints: one folder per step, visible only once committed.

    <root>/step-00000050/          DCP files (one .distcp per rank, .metadata)
    <root>/step-00000050/flywheel-commit.json   written by rank 0 after every rank's write finished

A folder without the commit marker is torn (a crash or failure mid-save), never restored and deleted; one whose
marker is there but unreadable is damaged after its commit (the marker is written atomically): marked bad and kept.
Only global rank 0 calls the functions here that change the directory; every function is plain file-system work
(no collectives).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.trainer.checkpoint import integrity

log = logging.getLogger("flywheel.checkpoint")

COMMIT_MARKER = "flywheel-commit.json"
STEP_DIR = re.compile(r"^step-(\d{8,})$")


@dataclass(frozen=True)
class Committed:
    """A checkpoint whose commit marker exists: every rank's write finished."""

    step: int
    path: str
    world_size: int
    time: float
    checksums: dict[str, str] = field(default_factory=dict)  # file name -> crc32 (empty: an older checkpoint)


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def step_dirs(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Every step folder under root (committed or not), oldest step first. A missing root has none."""
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


def read_commit(path: str | os.PathLike[str]) -> Committed | None:
    """The commit record of one step folder, or None when it has no (readable) marker."""
    try:
        record = _commit_or_damage(path)
    except OSError as err:  # cannot be read now (e.g. an I/O error): skipped, neither deleted nor marked bad
        log.warning("ignoring checkpoint %s: its commit marker cannot be read (%s)", path, err)
        return None
    if isinstance(record, str):
        log.warning("ignoring checkpoint %s: %s", path, record)
        return None
    return record


def _commit_or_damage(path: str | os.PathLike[str]) -> Committed | str | None:
    """The commit record; None when the marker is missing (a torn save); why, when its content is damaged. Raises
    OSError when it cannot be read at all (not damage: it may read again)."""
    try:
        return parse_commit(str(path), (Path(path) / COMMIT_MARKER).read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as err:
        return str(err)


def parse_commit(path: str, raw: bytes) -> Committed:
    """A commit marker's record (`path`: where its step is); ValueError, naming the marker, when it is damaged."""
    try:
        doc = json.loads(raw)
        return Committed(step=int(doc["step"]), path=path, world_size=int(doc["world_size"]), time=float(doc["time"]),
                         checksums={str(k): str(v) for k, v in (doc.get("checksums") or {}).items()})
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"its commit marker is unreadable ({type(err).__name__}: {err})") from err


def set_aside_damaged(root: str | os.PathLike[str]) -> list[tuple[int, Path, str]]:
    """Mark bad every step folder whose commit marker is there but unreadable: (step, where it is kept, why). A
    marker is written atomically, so such a folder is damage after the commit, kept for inspection (a torn save,
    with no marker at all, is what remove_uncommitted deletes)."""
    damaged = []
    for step, path in step_dirs(root):
        try:
            why = _commit_or_damage(path)
        except OSError:
            continue  # unreadable now, not damaged: read_commit says so when it is listed
        if isinstance(why, Committed) and why.step != step:
            why = f"its commit marker is for step {why.step}"
        if isinstance(why, str):
            damaged.append((step, integrity.mark_bad(path, why), why))
    return damaged


def committed(root: str | os.PathLike[str]) -> list[Committed]:
    """Committed checkpoints under root that are not marked bad (damaged after their commit), oldest step first."""
    found = []
    for step, path in step_dirs(root):
        if integrity.is_bad(path):
            continue
        record = read_commit(path)
        if record is not None and record.step == step:
            found.append(record)
    return found


def newest_good(root: str | os.PathLike[str], known_step: int | None) -> Committed | None:
    """The checkpoint a failed save names and make-room keeps: `known_step` (restored from disk or committed last
    by this run; a newer leftover failed to load) when it is committed, else the newest committed one."""
    records = committed(root)
    known = [r for r in records if r.step == known_step]
    return known[0] if known else (records[-1] if records else None)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_commit(path: str | os.PathLike[str], step: int, world_size: int,
                 checksums: dict[str, str] | None = None) -> None:
    """Make a finished DCP save visible: temp file, fsync, atomic rename, fsync the folder. `checksums`: every
    file's, verified by restore."""
    folder = Path(path)
    tmp = folder / f".{COMMIT_MARKER}.tmp"
    record = {"step": step, "world_size": world_size, "time": time.time(), "algorithm": integrity.ALGORITHM,
              "checksums": checksums or {}}
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / COMMIT_MARKER)
    _fsync_dir(folder)


def retract_commit(path: str | os.PathLike[str]) -> None:
    """Remove a marker (before overwriting or deleting a folder) so a half-changed folder is never restored."""
    marker = Path(path) / COMMIT_MARKER
    try:
        marker.unlink()
    except FileNotFoundError:
        return
    _fsync_dir(Path(path))


def delete_checkpoint(path: str | os.PathLike[str]) -> None:
    """Retract first, then delete: a deletion interrupted halfway leaves a torn folder, not a broken commit."""
    retract_commit(path)
    shutil.rmtree(path, ignore_errors=True)


def apply_retention(root: str | os.PathLike[str], keep: int, newest_step: int) -> list[Path]:
    """Delete the oldest committed checkpoints beyond `keep`; the one at `newest_step` is always kept."""
    records = committed(root)
    survivors = [r for r in records if r.step == newest_step]
    others = sorted((r for r in records if r.step != newest_step), key=lambda r: r.step, reverse=True)
    survivors += others[: max(keep - len(survivors), 0)]
    kept = {r.step for r in survivors}
    deleted = []
    for record in records:
        if record.step not in kept:
            delete_checkpoint(record.path)
            deleted.append(Path(record.path))
    return deleted


def delete_older(root: str | os.PathLike[str], step: int) -> list[Path]:
    """Delete the committed checkpoints of steps before `step` (making room): never `step`, never a newer one."""
    deleted = []
    for record in committed(root):
        if record.step < step:
            delete_checkpoint(record.path)
            deleted.append(Path(record.path))
    return deleted


def remove_uncommitted(root: str | os.PathLike[str], below_step: int | None = None) -> list[Path]:
    """Delete torn folders (no marker; one whose marker is damaged is set_aside_damaged's, never deleted); with
    below_step, only those of older steps (a newer one may be in flight)."""
    removed = []
    for step, path in step_dirs(root):
        if below_step is not None and step >= below_step:
            continue
        if not (path / COMMIT_MARKER).exists() and not integrity.is_bad(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_partial(path: str | os.PathLike[str]) -> bool:
    """Delete a failed save's folder unless it was committed after all (its marker there, even damaged);
    whether something was deleted."""
    if not Path(path).exists() or (Path(path) / COMMIT_MARKER).exists() or integrity.is_bad(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def folder_bytes(path: str | os.PathLike[str]) -> int:
    """The bytes of the files in one step folder (0 when it is gone)."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file(follow_symlinks=False))
    except OSError:
        return 0


def tidy_after_commit(root: Path, keep: int, step: int) -> None:
    """Rank 0, after committing `step`: retention (`keep`), then the torn folders below it; a failure is logged,
    never raised (the checkpoint is committed)."""
    try:
        for path in apply_retention(root, keep, step):
            log.info("deleted checkpoint %s (keep: %d)", path, keep)
        for path in remove_uncommitted(root, below_step=step):
            log.info("removed torn checkpoint %s (no commit marker)", path)
    except OSError as err:
        log.warning("checkpoint clean-up under %s failed: %s", root, err)
