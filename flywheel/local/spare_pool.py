"""`flywheel run --spares N`: warm spare workers beside the job's workers.

A spare is started like a worker (the same `flywheel launch` command and env) but with FLYWHEEL_SPARE=1, no replica
index, a name `spare-<n>` (n counts up, never reused) and a promotion file under <out>/spares/; its output goes to
<out>/logs/spare-<n>.log. Its agent imports the trainer in its warm zygote, marks itself ready and waits
(agent/spare_wait.py). When the supervisor replaces a lost worker it promotes the oldest ready spare instead of
starting a cold process: it writes the promotion file with the replica index and the env that differs for that
replica (flywheel/contracts/spare_promotion.py), the spare becomes that worker, and a new spare is started behind it.

Spares are never workers for the job's outcome: one that dies is replaced (with a notice), and all are stopped with
the job.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from flywheel.contracts.replica import REPLICA_INDEX_ENV, SPARE_ENV, SPARE_ID_ENV, SPARE_PROMOTION_FILE_ENV
from flywheel.contracts.spare_promotion import is_ready, write_promotion
from flywheel.local import procs

STOP_GRACE_S = 5.0  # a waiting spare exits at once on SIGTERM; one still importing dies of it
MAX_DEAD_SPARES_PER_SLOT = 3  # spares that keep dying are not restarted forever: the job goes on without them

# (the process env on top of the supervisor's own, its log file name) -> the started process and its open log
StartProcess = Callable[[Mapping[str, str], str], tuple[subprocess.Popen[bytes], IO[bytes]]]


@dataclass
class SpareProcess:
    spare_id: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]
    promotion_file: Path
    env: dict[str, str]  # what it was started with on top of the supervisor's env
    started: float  # monotonic

    @property
    def ready(self) -> bool:
        return is_ready(self.promotion_file)


def spare_env(worker_env: Mapping[str, str], spare_id: str, promotion_file: Path) -> dict[str, str]:
    """A worker's env made a spare's: no replica index, no per-worker metrics port, and the spare's own names."""
    env = {name: value for name, value in worker_env.items() if name != REPLICA_INDEX_ENV}
    env["FLYWHEEL_METRICS_PORT"] = "0"
    env.update({SPARE_ENV: "1", SPARE_ID_ENV: spare_id, SPARE_PROMOTION_FILE_ENV: str(promotion_file)})
    return env


def promotion_env(spare: Mapping[str, str], worker: Mapping[str, str]) -> dict[str, str]:
    """What the spare must set to be the worker started with `worker`: every variable that differs (the replica
    index, its metrics port, its termination log, the current rendezvous run id...)."""
    spare_only = (SPARE_ENV, SPARE_PROMOTION_FILE_ENV)
    return {name: value for name, value in worker.items() if spare.get(name) != value and name not in spare_only}


class SparePool:
    """Keeps `count` spares running; `promote` hands the oldest ready one over to a replica."""

    def __init__(self, count: int, spares_dir: Path, start_process: StartProcess,
                 notice: Callable[[str], None]) -> None:
        self.count, self.spares_dir = count, spares_dir
        self._start_process, self._notice = start_process, notice
        self.spares: list[SpareProcess] = []  # oldest first
        self._next_id = 0
        self._deaths = 0

    def fill(self, worker_env: Mapping[str, str]) -> None:
        """Start spares until `count` are running (a template worker's env: the replica's own parts are dropped)."""
        while len(self.spares) < self.count:
            spare_id = f"spare-{self._next_id}"
            self._next_id += 1
            promotion_file = self.spares_dir / f"{spare_id}.promotion.json"
            env = spare_env(worker_env, spare_id, promotion_file)
            popen, log = self._start_process(env, f"{spare_id}.log")
            self.spares.append(SpareProcess(spare_id, popen, log, promotion_file, env, time.monotonic()))

    def promote(self, index: int, worker_env: Mapping[str, str]) -> SpareProcess | None:
        """Promote the oldest ready spare to replica `index` (else the oldest still importing: it is further along
        than a cold start); None when no spare is running. The caller starts a new spare behind it (`fill`)."""
        live = [s for s in self.spares if s.popen.poll() is None]
        chosen = next((s for s in live if s.ready), live[0] if live else None)
        if chosen is None:
            return None
        self.spares.remove(chosen)
        write_promotion(chosen.promotion_file, index, promotion_env(chosen.env, worker_env))
        return chosen

    def reap(self, worker_env: Mapping[str, str]) -> None:
        """Replace spares that died (they are no workers: a notice, no failure)."""
        for spare in [s for s in self.spares if s.popen.poll() is not None]:
            self.spares.remove(spare)
            procs.kill_tree(spare.popen.pid)
            spare.log.close()
            self._deaths += 1
            self._notice(f"[yellow]{spare.spare_id} exited {spare.popen.returncode} while waiting[/]")
        if self._deaths > self.count * MAX_DEAD_SPARES_PER_SLOT:
            if self.count:
                self._notice("[yellow]spares keep dying: going on without them[/]")
            self.count = 0
        self.fill(worker_env)

    def ready_count(self) -> int:
        """Spares running and warm (their trainer imported): what a lost worker can be replaced by at once."""
        return sum(1 for s in self.spares if s.popen.poll() is None and s.ready)

    def pids(self) -> list[int]:
        return [s.popen.pid for s in self.spares]

    def stop(self) -> None:
        """Stop every spare (the job is ending): SIGTERM, then SIGKILL after a short grace."""
        self.count = 0
        for spare in self.spares:
            procs.signal_quietly(spare.popen.pid, signal.SIGTERM, group=True)
        deadline = time.monotonic() + STOP_GRACE_S
        for spare in self.spares:
            try:
                spare.popen.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
            procs.kill_tree(spare.popen.pid)
            spare.log.close()
        self.spares.clear()
