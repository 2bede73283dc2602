"""The run's event log (docs/contracts.md, "Event log"): tailing the JSON-lines file and folding it into a RunRecord.

RunRecord is plain data plus deterministic folding, so summaries can be tested from synthetic event lists. The
supervisor adds what only it sees (worker exits, worker recreations) through the same object.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


class EventTail:
    """Reads complete new lines appended to a JSON-lines file; a partial last line waits for its newline."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a writer killed mid-line cannot corrupt what follows; skip the fragment
            if isinstance(event, dict) and "event" in event:
                out.append(event)
        return out


@dataclass(frozen=True)
class StepRecord:
    step: int
    time: float
    loss: float
    step_seconds: float
    tokens_per_second: float
    world_size: int


@dataclass
class Failure:
    time: float
    kind: str
    rank: int | None = None
    replica: int | None = None
    exit_code: int | None = None
    detail: str = ""
    recovered_seconds: float | None = None  # until the next step event after the failure


@dataclass(frozen=True)
class Recreation:
    time: float
    replicas: tuple[int, ...]
    action: str
    reason: str


@dataclass
class RunRecord:
    """Everything known about one run, folded from events in arrival order."""

    steps: dict[int, StepRecord] = field(default_factory=dict)  # the last attempt of each step
    step_attempts: list[StepRecord] = field(default_factory=list)  # every attempt, for the timeline
    starts: list[dict[str, Any]] = field(default_factory=list)
    restores: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_failures: list[dict[str, Any]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    recreations: list[Recreation] = field(default_factory=list)
    done: dict[str, Any] | None = None
    _epoch_has_rank_failure: bool = False

    # --- folding -------------------------------------------------------------------------------------------------
    def add_event(self, ev: dict[str, Any]) -> None:
        kind, t = ev.get("event"), float(ev.get("time", 0.0))
        if kind == "step":
            rec = StepRecord(step=int(ev["step"]), time=t, loss=float(ev["loss"]),
                             step_seconds=float(ev.get("step_seconds", 0.0)),
                             tokens_per_second=float(ev.get("tokens_per_second", 0.0)),
                             world_size=int(ev.get("world_size", 0)))
            self.steps[rec.step] = rec  # a replayed step overwrites the lost attempt
            self.step_attempts.append(rec)
            for failure in self.failures:
                if failure.recovered_seconds is None and failure.time <= t:
                    failure.recovered_seconds = t - failure.time
        elif kind == "start":
            self.starts.append(ev)
            self._epoch_has_rank_failure = False
        elif kind == "restore":
            self.restores.append(ev)
        elif kind == "checkpoint":
            self.checkpoints.append(ev)
        elif kind == "checkpoint_failed":
            self.checkpoint_failures.append(ev)
        elif kind in ("fault", "hang"):
            # One rank failure per training epoch: after an injected hang every blocked rank's watchdog may fire too.
            if not self._epoch_has_rank_failure:
                self._epoch_has_rank_failure = True
                label = str(ev.get("kind", "hang")) if kind == "fault" else "hang"
                detail = f"injected at step {ev.get('step')}" if kind == "fault" else \
                    f"watchdog: {ev.get('seconds_since_step', '?')} s without a step"
                self.failures.append(Failure(time=t, kind=label, rank=_opt_int(ev.get("rank")), detail=detail))
        elif kind == "done":
            self.done = ev

    def add_worker_exit(self, time: float, replica: int, exit_code: int, kind: str, detail: str = "") -> None:
        self.failures.append(Failure(time=time, kind=kind, replica=replica, exit_code=exit_code, detail=detail))

    def add_recreation(self, time: float, replicas: tuple[int, ...], action: str, reason: str) -> None:
        self.recreations.append(Recreation(time=time, replicas=replicas, action=action, reason=reason))

    # --- views ---------------------------------------------------------------------------------------------------
    @property
    def last_step(self) -> int:
        return max(self.steps, default=0)

    @property
    def steps_completed(self) -> int:
        return int(self.done["step"]) if self.done else self.last_step

    @property
    def last_loss(self) -> float | None:
        return self.steps[self.last_step].loss if self.steps else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.step_attempts[-1].tokens_per_second if self.step_attempts else None

    @property
    def last_checkpoint_step(self) -> int | None:
        return int(self.checkpoints[-1]["step"]) if self.checkpoints else None

    @property
    def committed_step(self) -> int:
        return max((int(c["step"]) for c in self.checkpoints), default=0)

    @property
    def restarts(self) -> int:
        """Times training started again: each rank-level restart or worker recreation shows up as a new `start`."""
        return max(len(self.starts) - 1, 0)

    @property
    def agent_restarts(self) -> int:
        """Starts whose restart_count grew: rank-level restarts done by the elastic agent."""
        count, previous = 0, 0
        for ev in self.starts:
            current = int(ev.get("restart_count") or 0)
            count += current > previous
            previous = current
        return count

    def productive_seconds(self) -> float:
        return sum(s.step_seconds for s in self.steps.values())

    def losses(self) -> list[float | None]:
        """One value per step 1..N (N = steps completed); None for a step this run never saw (resumed past it)."""
        last = max(self.steps_completed, self.last_step)
        return [self.steps[s].loss if s in self.steps else None for s in range(1, last + 1)]

    def summary(self, *, job: str, status: str, exit_code: int, world_size: int, start_time: float,
                wall_seconds: float) -> dict[str, Any]:
        productive = self.productive_seconds()
        recoveries = [f.recovered_seconds for f in self.failures if f.recovered_seconds is not None]
        return {
            "job": job,
            "status": status,
            "exit_code": exit_code,
            "world_size": world_size,
            "steps_completed": self.steps_completed,
            "losses": self.losses(),
            "final_loss": self.last_loss,
            "final_params_sha256": self.done.get("params_sha256") if self.done else None,
            "restarts": self.restarts,
            "agent_restarts": self.agent_restarts,
            "worker_recreations": [{"time": r.time - start_time, "replicas": list(r.replicas), "action": r.action,
                                    "reason": r.reason} for r in self.recreations],
            "failures": [{"time": f.time - start_time, "rank": f.rank, "replica": f.replica, "kind": f.kind,
                          "exit_code": f.exit_code, "detail": f.detail, "recovered_seconds": f.recovered_seconds}
                         for f in self.failures],
            "mean_time_to_recover_seconds": sum(recoveries) / len(recoveries) if recoveries else None,
            "checkpoints": [{"step": int(c["step"]), "blocking_seconds": float(c.get("blocking_seconds", 0.0)),
                             "total_seconds": float(c.get("total_seconds", 0.0)), "path": c.get("path")}
                            for c in self.checkpoints],
            "checkpoint_failures": len(self.checkpoint_failures),
            "resumed_from": [s.get("resumed_from") for s in self.starts],
            "lost_steps": len(self.step_attempts) - len(self.steps),
            "productive_seconds": productive,
            "goodput": productive / wall_seconds if wall_seconds > 0 else 0.0,
            "wall_seconds": wall_seconds,
        }


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def fold(events: list[dict[str, Any]]) -> RunRecord:
    """A RunRecord from a list of events (pure; what the tests and offline reports use)."""
    record = RunRecord()
    for ev in events:
        record.add_event(ev)
    return record
