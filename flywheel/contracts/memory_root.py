"""Where a worker's memory-tier copies live (torch-free: the local supervisor uses it too).

/dev/shm/flywheel-<job>-<hash of the checkpoint dir>/replica-<worker>: one folder per job (the checkpoint dir tells
runs of the same name apart) and worker (workers sharing a host, as in `flywheel run`, keep theirs apart).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

SHM = Path("/dev/shm")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "_"


def memory_root(job: str, replica: str, checkpoint_dir: str, base: Path = SHM) -> Path:
    digest = hashlib.sha256(os.path.abspath(checkpoint_dir).encode()).hexdigest()[:10]
    return base / f"flywheel-{_safe(job)}-{digest}" / f"replica-{_safe(replica)}"


def worker_memory_root(env: Mapping[str, str], base: Path = SHM) -> Path | None:
    """The memory root of the worker started with this environment (the worker contract's variables); None
    without a checkpoint dir."""
    checkpoint_dir = env.get("FLYWHEEL_CHECKPOINT_DIR")
    if not checkpoint_dir:
        return None
    job = env.get("FLYWHEEL_JOB", "default/flywheel").rpartition("/")[2]
    return memory_root(job, env.get("FLYWHEEL_REPLICA_INDEX", "0"), checkpoint_dir, base)


def forget(root: Path | None) -> None:
    """Drop a worker's copies: what losing its host does (`flywheel run`'s lose-worker fault)."""
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


# ---- whose copies: the checkpoint dir's identity ----------------------------------------------------------------
#
# The root's name depends only on the job and the checkpoint dir's path, so a run started again under the same name
# after its checkpoint dir was deleted (`rm -rf`, as `make demo` does) would find the earlier run's copies and
# restore them. The checkpoint dir therefore carries a random identity, written when it is first used, and the root
# records the identity its copies belong to: a root recording another one (or none) is wiped before it is used.

DIR_ID = "flywheel-run-id"  # in the checkpoint dir (the local staging dir for an object store)
ROOT_ID = "run-id"  # in the memory root


def dir_identity(checkpoint_dir: Path) -> str:
    """The checkpoint dir's identity, created when it has none. Every worker may call this at once on a shared
    dir: the file is made complete under a name of its own, then linked into place (the first link wins); a file
    system without hard links gets it created exclusively, which a racing reader may briefly see empty. Raises
    OSError when the dir cannot be read or written."""
    path = checkpoint_dir / DIR_ID
    for _ in range(50):
        found = _read_id(path)
        if found:
            return found
        if found is None:
            _create_id(path)
        else:
            time.sleep(0.02)  # being written by another worker (exclusive create)
    raise OSError(f"{path} stays empty")


def read_identity(checkpoint_dir: Path) -> str | None:
    """The dir's identity, or None when it has none (yet)."""
    return _read_id(checkpoint_dir / DIR_ID) or None


def record_identity(checkpoint_dir: Path, identity: str) -> None:
    """Make `identity` the dir's (an object store's staging dir takes its bucket prefix's). Atomic."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    tmp = checkpoint_dir / f".{DIR_ID}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(identity + "\n")
    os.replace(tmp, checkpoint_dir / DIR_ID)


def _read_id(path: Path) -> str | None:
    """The identity in `path` ('' while it is being written), or None when there is no such file."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _create_id(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{DIR_ID}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.write_text(uuid.uuid4().hex + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another worker's is in place: it is the identity
    except OSError:  # no hard links here
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as out:
                out.write(tmp.read_text())
    finally:
        tmp.unlink(missing_ok=True)


def adopt(root: Path, identity: str) -> bool:
    """Make `root` hold copies of the checkpoint dir `identity` only: a root that records another identity, or none
    (an earlier run's, or one from before identities), is wiped first. Whether it was wiped. Local ranks sharing
    the root may call this at once: each wipes what it found foreign before recording the identity, so nothing
    foreign is left, and no copy of this run exists yet to be lost (the caller waits for every rank before any
    save)."""
    recorded = _read_id(root / ROOT_ID) if root.is_dir() else None
    if recorded == identity:
        return False
    wiped = root.is_dir() and any(root.glob("*-rank-*"))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{ROOT_ID}.{os.getpid()}.tmp"
    tmp.write_text(identity + "\n")
    os.replace(tmp, root / ROOT_ID)
    return wiped


def forget_identity(root: Path) -> None:
    """The root's record of whose copies it holds goes with the last copy (release)."""
    (root / ROOT_ID).unlink(missing_ok=True)
