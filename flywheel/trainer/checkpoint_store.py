"""The on-disk layout of checkpoints: one folder per step, visible only once committed.

    <root>/step-00000050/          DCP files (one .distcp per rank, .metadata)
    <root>/step-00000050/flywheel-commit.json   written by rank 0 after every rank's write finished

A folder without the commit marker is torn (a crash or failure mid-save) and never restored. Only global rank 0
calls the functions here that change the directory; every function is plain file-system work (no collectives).
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

from flywheel.trainer import checkpoint_integrity as integrity

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
    marker = Path(path) / COMMIT_MARKER
    try:
        doc = json.loads(marker.read_text())
        return Committed(step=int(doc["step"]), path=str(path), world_size=int(doc["world_size"]),
                         time=float(doc["time"]), checksums={str(k): str(v) for k, v in
                                                             (doc.get("checksums") or {}).items()})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        # A marker is written atomically, so an unreadable one means outside damage: treat the folder as torn.
        log.warning("ignoring checkpoint %s: its commit marker is unreadable (%s)", path, err)
        return None


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


def remove_uncommitted(root: str | os.PathLike[str], below_step: int | None = None) -> list[Path]:
    """Delete torn folders (no marker); with below_step, only those of older steps (a newer one may be in flight)."""
    removed = []
    for step, path in step_dirs(root):
        if below_step is not None and step >= below_step:
            continue
        if read_commit(path) is None:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_partial(path: str | os.PathLike[str]) -> bool:
    """Delete a failed save's folder unless it was committed after all; whether something was deleted."""
    if not Path(path).exists() or read_commit(path) is not None:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def folder_bytes(path: str | os.PathLike[str]) -> int:
    """The bytes of the files in one step folder (0 when it is gone)."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file(follow_symlinks=False))
    except OSError:
        return 0
