"""Stack dumps on request, for a rank that looks hung: what every thread of every rank is doing, on gloo and NCCL
alike (the NCCL flight recorder's pipe covers only NCCL's collectives).

Two triggers, both set up by the progress watchdog when it starts (`install()`):

- a request file, `<checkpointDir>/.debug/dump-request` (the checkpoint volume is shared by all workers and outlives
  restarts): whoever writes a new token into it -- the operator's health monitor when it marks a job Hung
  (flywheel/operator/health_executor.py), or a person with the volume mounted -- makes every rank dump all its threads'
  stacks into its log (stderr) and appended to `<checkpointDir>/.debug/stacks_rank_<rank>.txt`. A daemon thread
  polls the file every `POLL_SECONDS`; the token present when a rank starts is not acted on (an old request).
- `SIGUSR1` (e.g. `kill -USR1 <pid>` in the worker's container): faulthandler writes the same dump to stderr from
  the signal handler, even while the interpreter is stuck.

Dumping costs a rank nothing but the write; it goes on training.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

DEBUG_SUBDIR = ".debug"  # the same directory as the NCCL dump pipes (collective_env.py)
# flywheel/operator/health_executor.py writes it (by name: the operator does not import torch).
REQUEST_FILE = "dump-request"
POLL_SECONDS = 0.25  # a hung job's pods are deleted with a 1 s grace right after the request


def stacks_path(debug_dir: Path, rank: str | int) -> Path:
    return debug_dir / f"stacks_rank_{rank}.txt"


def _token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class StackDumper:
    """Dumps this process's stacks when `<debug_dir>/dump-request` changes (no directory: SIGUSR1 only)."""

    def __init__(self, debug_dir: Path | None, rank: str, poll_seconds: float = POLL_SECONDS) -> None:
        self.debug_dir, self.rank, self.poll_seconds = debug_dir, rank, poll_seconds
        self.dumps = 0
        self._seen = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flywheel-stackdump", daemon=True)

    @property
    def request_file(self) -> Path | None:
        return self.debug_dir / REQUEST_FILE if self.debug_dir is not None else None

    def start(self) -> StackDumper:
        if hasattr(signal, "SIGUSR1"):  # faulthandler installs its own C handler: any thread may do this
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
        if self.request_file is not None:
            self._seen = _token(self.request_file)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        assert self.request_file is not None
        while not self._stop.wait(self.poll_seconds):
            token = _token(self.request_file)
            if token and token != self._seen:
                self._seen = token
                self.dump(f"requested ({token})")

    def dump(self, why: str) -> None:
        """All threads' stacks to stderr and appended to the rank's stacks file."""
        header = (f"flywheel stack dump {why}: rank {self.rank} pid {os.getpid()} at "
                  f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        sys.stderr.write(header)
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if self.debug_dir is not None:
            try:
                self.debug_dir.mkdir(parents=True, exist_ok=True)
                with open(stacks_path(self.debug_dir, self.rank), "a") as out:
                    out.write(header)
                    out.flush()
                    faulthandler.dump_traceback(file=out, all_threads=True)
                    out.write("\n")
            except OSError as err:
                log.warning("stack dump: cannot write %s: %s", stacks_path(self.debug_dir, self.rank), err)
        self.dumps += 1


_installed: StackDumper | None = None
_lock = threading.Lock()


def install(environ: Mapping[str, str] | None = None) -> StackDumper:
    """The process's dumper, started once: the request file under `$FLYWHEEL_CHECKPOINT_DIR/.debug` (the worker
    contract sets it; without it only SIGUSR1), this rank from `$RANK`."""
    global _installed
    environ = os.environ if environ is None else environ
    with _lock:
        if _installed is None:
            ckpt = environ.get("FLYWHEEL_CHECKPOINT_DIR")
            _installed = StackDumper(Path(ckpt) / DEBUG_SUBDIR if ckpt else None, environ.get("RANK", "0")).start()
        return _installed
