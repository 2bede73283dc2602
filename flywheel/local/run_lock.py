"""One `flywheel run` at a time per output directory and per checkpoint directory.

A second run of the same job (another terminal, a forgotten tmux pane) would otherwise wipe the first one's logs
and events as it starts (`_fresh_out_dir`), and both would commit, retain and delete checkpoints in one directory:
each run's resume would read the other's steps. The lock is an advisory `flock` on `.flywheel-run.lock` in the
directory, held by the `flywheel run` process for the whole run and released by the kernel when that process ends
in any way, so a killed run leaves no stale lock. The file names the holder (pid, job file, start time) for the
second run's message; it is never deleted (deleting a lock file races with a run taking it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".flywheel-run.lock"


class DirectoryInUse(Exception):
    """Another `flywheel run` holds the directory; the message names it and says what to do."""


@contextlib.contextmanager
def run_lock(directories: dict[str, Path], job_file: str) -> Iterator[None]:
    """Holds each directory's lock (created if missing) until the block ends; raises DirectoryInUse, holding
    none, when another run holds one. `directories`: what each directory is to the user (e.g. "--out") -> path."""
    taken: set[Path] = set()
    with contextlib.ExitStack() as held:
        for what, directory in directories.items():
            path = directory.resolve()
            if path not in taken:  # --out may be the checkpoint directory itself
                taken.add(path)
                held.enter_context(_locked(what, path, job_file))
        yield


@contextlib.contextmanager
def _locked(what: str, directory: Path, job_file: str) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the workers
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryInUse(f"{what} {directory} is in use by another flywheel run ({_holder(fd)}): wait for "
                                 f"it to end or stop it, or give this run another {what}") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "job": job_file, "started": time.time()}).encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def _holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["started"])))
        return f"pid {int(holder['pid'])}, {holder['job']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its details are unreadable"
