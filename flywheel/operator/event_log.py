"""Where the operator's step, checkpoint and goodput numbers come from: the job's event log.

The operator gives every worker `FLYWHEEL_EVENTS_FILE=<events-dir>/<namespace>_<name>_<uid>.jsonl` on a path that
it shares with the workers (the test cluster: one host; a real cluster: a ReadWriteMany volume mounted by the
operator and the workers). Global rank 0 appends one JSON line per event (docs/contracts.md); `EventLogTail` reads
what was appended since the last pass and folds it into a `Progress` (pure fold: `ProgressFold`). Without an
events dir the status shows no step/checkpoint/goodput (documented in docs/operator.md).
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from flywheel.policy.checkpoint_events import RECENT_CHECKPOINTS, CommittedCheckpoint
from flywheel.policy.observed import ObservedProgress as Progress


class ProgressFold:
    """Folds event-log records into progress and goodput numbers (pure; no I/O).

    goodput.ratio = productive step time / wall time since the first `start`; lostSteps counts steps trained again
    after a restart (the work after the last checkpoint that was lost); meanTimeToRecoverSeconds averages, over
    every restart, the time from the last step before it to the first step after it. `checkpoints` holds the most
    recent committed checkpoints, numbered in log order (for the CheckpointCommitted events).
    """

    def __init__(self) -> None:
        self.step = self.max_step = self.world_size = 0
        self.checkpoint: dict[str, Any] = {}
        self.checkpoints: deque[CommittedCheckpoint] = deque(maxlen=RECENT_CHECKPOINTS)
        self.checkpoint_count = 0
        self.done: dict[str, Any] | None = None
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.last_step_time: float | None = None
        self.step_seconds: dict[int, float] = {}
        self.lost_steps = 0
        self.recoveries: list[tuple[float, float]] = []  # (first step after a restart, seconds to it)
        self._restarted_after: float | None = None
        self._replayed: set[int] = set()

    def add(self, record: dict[str, Any]) -> None:
        kind, t = record.get("event"), float(record.get("time", 0.0))
        if self.first_time is None and kind == "start":
            self.first_time = t
        self.last_time = t if self.last_time is None else max(self.last_time, t)
        if kind == "start" and self.last_step_time is not None:
            self._restarted_after = self.last_step_time
        elif kind == "step":
            step = int(record["step"])
            if step <= self.max_step and step not in self._replayed:
                self.lost_steps += 1
                self._replayed.add(step)
            if self._restarted_after is not None:
                self.recoveries.append((t, t - self._restarted_after))
                self._restarted_after = None
            self.step, self.max_step = step, max(self.max_step, step)
            self.step_seconds[step] = float(record.get("step_seconds", 0.0))
            self.world_size = int(record.get("world_size", self.world_size))
            self.last_step_time = t
        elif kind == "checkpoint":
            self.checkpoint = {"step": int(record["step"]), "path": str(record.get("path", "")), "time": t}
            self.checkpoint_count += 1
            self.checkpoints.append(CommittedCheckpoint(self.checkpoint_count, self.checkpoint["step"],
                                                        self.checkpoint["path"], t))
        elif kind == "done":
            self.done = record
            self.step = max(self.step, int(record.get("step", 0)))

    def progress(self) -> Progress:
        wall = (self.last_time - self.first_time) if self.first_time is not None and self.last_time else 0.0
        productive = sum(self.step_seconds.values())
        goodput = {"ratio": round(min(1.0, productive / wall), 4) if wall > 0 else 0.0,
                   "productiveSeconds": round(productive, 3), "lostSteps": self.lost_steps,
                   "meanTimeToRecoverSeconds": round(sum(r for _, r in self.recoveries) / len(self.recoveries), 3)
                   if self.recoveries else 0.0}
        return Progress(step=self.step, world_size=self.world_size,
                        checkpoint_step=int(self.checkpoint.get("step", 0)),
                        checkpoint_time=self.checkpoint.get("time"), checkpoint_path=self.checkpoint.get("path", ""),
                        done=self.done is not None, goodput=goodput if self.first_time is not None else {},
                        recoveries=tuple(self.recoveries), checkpoints=tuple(self.checkpoints))


class EventLogTail:
    """Reads new complete lines of one event log on each call (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.fold = path, 0, ProgressFold()

    def poll(self) -> Progress:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.fold.progress()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self.fold.add(record)
        return self.fold.progress()


def events_file(events_dir: str, namespace: str, name: str, uid: str) -> Path:
    return Path(events_dir) / f"{namespace}_{name}_{uid}.jsonl"
