"""The progress record a job's global rank 0 keeps in etcd, and its codec (pure: no I/O, shared by the trainer's
publisher and the operator's watch).

Key: `/flywheel/progress/<run_id>/<rank>` (keys.py), under the writer's own lease, so it disappears within the
lease's TTL when the process dies or stops (SIGSTOP). Value: one JSON object, `"v": 1`. An *attempt* is one
trainer process group (a new one after every restart), named by the time its `start` was reported; the goodput
parts are the attempt's own, and the reader adds attempts up (flywheel/monitor/etcd_progress.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

VERSION = 1
# What the trainer does besides stepping (`phase`; "" while it trains steps). The operator's hang checks follow
# its own watchdog (trainer/ft/watchdog.py): an evaluation batch is progress; the final blocking save pauses the step
# check, for at most `final_save_allowance`.
PHASE_EVALUATING = "evaluating"
PHASE_SAVING = "saving"
RECENT_NOTICES = 8  # checkpoint notices a record carries (a writer publishes each at once: a reader misses none)


def final_save_allowance(progress_timeout: float, first_step_timeout: float) -> float:
    """How long the final blocking save may take before it is a hang: the first-step allowance, which the user sized
    for start-up and a restore of the same checkpoint (a save writes what a restore reads), and never less than the
    progress timeout."""
    return max(progress_timeout, first_step_timeout)


@dataclass(frozen=True)
class CheckpointRecord:
    step: int
    path: str
    time: float  # unix time it was committed


@dataclass(frozen=True)
class ProgressRecord:
    time: float  # the writer's clock when written
    attempt: float  # when this attempt's group started training (its `start`), unix time
    step: int = 0  # the last step trained (the resumed-from step before the first one)
    resumed_from: int = 0
    world_size: int = 0
    loss: float | None = None
    tokens_per_second: float | None = None
    checkpoint: CheckpointRecord | None = None  # the last checkpoint committed (or restored) in this attempt
    productive_seconds: float = 0.0  # the sum of this attempt's step times
    done: bool = False  # training finished (the final checkpoint is committed)
    # Why this attempt's process exited non-zero (contracts/termination_log.py), set just before it exits; "" while
    # it runs. Written only when set ("exitReason"), so a reader without the field reads the record as before.
    exit_reason: str = ""
    eval_step: int = 0  # the step of this process's latest evaluation (0: none); written only when set
    eval_loss: float | None = None
    # What this attempt restored before its start (the trainer's `restore` report): where from (memory-own /
    # memory-peer / disk; "" when it restored nothing), the step, and how long the load took. Written only when set.
    restore_source: str = ""
    restore_step: int = 0
    restore_seconds: float = 0.0
    # Checkpoints going wrong in this process, in words (eventlog's checkpoint notices): the newest RECENT_NOTICES
    # as (kind, words), of notices_total so far, so a reader counts what it has not seen. Written only when set.
    notices: tuple[tuple[str, str], ...] = ()
    notices_total: int = 0
    # With done: the checkpoint it restored when it resumed at or past its last step and trained nothing (the
    # `done` report's already_complete_checkpoint). Written only when set.
    already_complete: str = ""
    # PHASE_EVALUATING or PHASE_SAVING ("": training steps), and the writer's clock at the phase's latest sign of
    # life (an evaluation batch; the save's start). Written only when set.
    phase: str = ""
    heartbeat: float = 0.0

    @property
    def stepped(self) -> bool:
        """This attempt has trained at least one step."""
        return self.step > self.resumed_from


def encode(record: ProgressRecord) -> bytes:
    value: dict[str, Any] = {
        "v": VERSION, "time": record.time, "attempt": record.attempt, "step": record.step,
        "resumedFrom": record.resumed_from, "worldSize": record.world_size, "loss": _finite(record.loss),
        "tokensPerSecond": _finite(record.tokens_per_second), "productiveSeconds": record.productive_seconds,
        "done": record.done}
    if record.exit_reason:
        value["exitReason"] = record.exit_reason
    if record.eval_step:  # optional keys: a reader without them ignores them, and one with them defaults them
        value["evalStep"], value["evalLoss"] = record.eval_step, _finite(record.eval_loss)
    if record.restore_source:
        value["restore"] = {"source": record.restore_source, "step": record.restore_step,
                            "seconds": record.restore_seconds}
    if record.checkpoint is not None:
        c = record.checkpoint
        value["checkpoint"] = {"step": c.step, "path": c.path, "time": c.time}
    if record.already_complete:
        value["alreadyComplete"] = record.already_complete
    if record.phase:
        value["phase"], value["heartbeat"] = record.phase, record.heartbeat
    if record.notices_total:
        value["checkpointNotices"] = {"total": record.notices_total, "recent": [list(n) for n in record.notices]}
    return json.dumps(value, separators=(",", ":")).encode()


def decode(data: bytes) -> ProgressRecord | None:
    """The record, or None for a value this reader cannot use (garbled, or another version): the reader then
    keeps what it had rather than failing."""
    try:
        value = json.loads(data)
        if not isinstance(value, dict) or value.get("v") != VERSION:
            return None
        ckpt, restore = value.get("checkpoint"), value.get("restore")
        restore = restore if isinstance(restore, dict) else {}
        notices = value.get("checkpointNotices")
        notices = notices if isinstance(notices, dict) else {}
        checkpoint = (CheckpointRecord(int(ckpt["step"]), str(ckpt["path"]), float(ckpt["time"]))
                      if isinstance(ckpt, dict) else None)
        return ProgressRecord(
            time=float(value["time"]), attempt=float(value["attempt"]), step=int(value.get("step", 0)),
            resumed_from=int(value.get("resumedFrom", 0)), world_size=int(value.get("worldSize", 0)),
            loss=_optional_float(value.get("loss")), tokens_per_second=_optional_float(value.get("tokensPerSecond")),
            checkpoint=checkpoint, productive_seconds=float(value.get("productiveSeconds", 0.0)),
            done=bool(value.get("done", False)), exit_reason=str(value.get("exitReason") or ""),
            eval_step=int(value.get("evalStep", 0)), eval_loss=_optional_float(value.get("evalLoss")),
            restore_source=str(restore.get("source") or ""), restore_step=int(restore.get("step") or 0),
            restore_seconds=float(restore.get("seconds") or 0.0),
            notices=tuple((str(kind), str(words)) for kind, words in notices.get("recent") or ()),
            notices_total=int(notices.get("total") or 0), already_complete=str(value.get("alreadyComplete") or ""),
            phase=str(value.get("phase") or ""), heartbeat=float(value.get("heartbeat") or 0.0))
    except (ValueError, TypeError, KeyError):
        return None


def _finite(value: float | None) -> float | None:
    """JSON has no NaN/inf: a diverged loss is written as null."""
    return value if value is not None and math.isfinite(value) else None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
