"""Where a worker's memory-tier copies live (torch-free: the local supervisor uses it too).

/dev/shm/flywheel-<job>-<hash of the checkpoint dir>/replica-<worker>: one folder per job (the checkpoint dir tells
runs of the same name apart) and worker (workers sharing a host, as in `flywheel run`, keep theirs apart).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
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
