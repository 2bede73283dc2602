"""The event log's names and typed records (docs/contracts.md, "Event log").

A line is one JSON object with `event` (an `EventName`) and `time` (unix seconds). `parse_record` turns a line's
object into its typed record, or None for a name this version does not know or a line whose required fields are
missing (a newer writer, a hand-edited file): readers skip what they cannot use rather than fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from flywheel.contracts import exitcodes
from flywheel.contracts.text import one_line


class EventName(StrEnum):
    # A (re)started group: written by rank 0 after restore and by the agent that starts rank 0 (any command); the
    # two of one group (the same `group`) are one start (fold.py)
    START = "start"
    STEP = "step"  # rank 0 (the trainer or flywheel.progress), after each optimizer step
    CHECKPOINT = "checkpoint"  # rank 0, when a checkpoint is committed
    CHECKPOINT_FAILED = "checkpoint_failed"  # rank 0 (the committing rank), once per failed save
    CHECKPOINT_BAD = "checkpoint_bad"  # rank 0, restore found a committed checkpoint damaged and skipped it
    RESTORE = "restore"  # rank 0, a checkpoint was loaded
    FAULT = "fault"  # any rank, just before an injected fault fires
    HANG = "hang"  # any rank, the progress watchdog fired (exit HANG)
    COLLECTIVE_TIMEOUT = "collective_timeout"  # any rank, a collective timed out or was aborted
    USER_ERROR = "user_error"  # any rank, a bad configuration or data (exit USER_ERROR); `reason` says which
    WORKER_EXIT = "worker_exit"  # the local supervisor, a worker process exited unasked with a non-zero code
    RANK_EXIT = "rank_exit"  # an agent, one of its ranks failed (whatever the rank runs): its code and reason
    DONE = "done"  # rank 0, training finished
    EVAL = "eval"  # rank 0, an evaluation on the validation data finished (after the step it names)
    RECOVERY = "recovery"  # the operator, once a recovery it decided trained its first step: where the time went


# Reported by the ranks of one group (or their agents): after one outage every blocked rank may report too; one per
# start counts (the likeliest cause: fold.py).
RANK_FAILURES = frozenset({EventName.FAULT, EventName.HANG, EventName.COLLECTIVE_TIMEOUT, EventName.USER_ERROR,
                           EventName.RANK_EXIT})


@dataclass(frozen=True, slots=True)
class Start:
    time: float
    world_size: int = 0
    restart_count: int = 0
    resumed_from: int | None = None
    group: str = ""  # the trainer group that started (writer.group_of); empty in older logs


@dataclass(frozen=True, slots=True)
class Step:
    time: float
    step: int
    loss: float | None = None  # optional: a user script may report a step alone
    step_seconds: float = 0.0
    tokens_per_second: float | None = None
    world_size: int = 0


@dataclass(frozen=True, slots=True)
class Eval:
    time: float
    step: int
    loss: float | None = None  # null in the log for a non-finite loss
    perplexity: float | None = None
    eval_seconds: float = 0.0
    samples: int = 0


@dataclass(frozen=True, slots=True)
class Checkpoint:
    time: float
    step: int
    path: str = ""
    blocking_seconds: float = 0.0
    total_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class CheckpointFailed:
    time: float
    step: int | None
    error: str = ""  # every failing rank's exception
    reason: str = ""  # no_space / permission / io_error / other ("" from an older trainer)
    message: str = ""  # the cause in words, with the newest good checkpoint
    # Which tier failed: "disk" (the save, into the checkpoint dir or the staging dir), "bucket" (the upload of a
    # committed local save to the object store), "memory" (the memory tier's copy; its own notice rule, fold.py).
    source: str = "disk"
    notice: ClassVar[str] = "failed"  # the kind of checkpoint notice it makes (RunFold.checkpoint_notices)

    @property
    def words(self) -> str:
        return self.message or f"checkpoint at step {self.step} failed: {one_line(self.error)}"


@dataclass(frozen=True, slots=True)
class CheckpointBad:
    time: float
    step: int
    path: str = ""  # where the damaged checkpoint is kept (bad-step-N-<time>); a memory copy's deleted file
    reason: str = ""  # which files (a memory copy: which tensors) do not match their checksums
    source: str = "disk"  # or "memory": a memory copy, deleted (another copy, else disk, was used)
    notice: ClassVar[str] = "damaged"

    @property
    def words(self) -> str:
        if self.source == "memory":
            return (f"memory copy of step {self.step} is damaged ({self.reason}); deleted ({self.path}); another "
                    "copy of that state, else the disk checkpoint, was used")
        return (f"checkpoint at step {self.step} is damaged ({self.reason}); kept as {self.path}; the previous good "
                "checkpoint was used")


@dataclass(frozen=True, slots=True)
class Restore:
    time: float
    step: int
    path: str = ""
    source: str = "disk"  # memory-own / memory-peer / disk; a record without it (older writers) read disk


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure record: a rank's (`fault`, `hang`, `collective_timeout`, `user_error`, its agent's `rank_exit`) or a
    worker's exit."""

    time: float
    event: EventName
    kind: str  # kill / hang / collective-timeout / user-error, or the worker exit's failure kind
    detail: str = ""
    reason: str = ""  # why, in one line (a user error's exception, a collective's error)
    rank: int | None = None
    replica: int | None = None
    exit_code: int | None = None
    group: str = ""  # a rank failure's trainer group (writer.group_of); empty for worker exits and older logs


@dataclass(frozen=True, slots=True)
class Done:
    time: float
    step: int
    params_sha256: str | None = None
    # The checkpoint a resumed run restored at or past its last step: nothing was trained ("already complete").
    already_complete_checkpoint: str | None = None
    checkpoint_memory_bytes: int | None = None  # host shared memory the memory tier held at the end, all ranks


@dataclass(frozen=True, slots=True)
class Recovery:
    """The operator's record of one recovery (flywheel/policy/recovery_cost.py): its parts add up to total."""

    time: float
    cause: str
    total_seconds: float
    detect_seconds: float = 0.0
    decide_seconds: float = 0.0
    pod_ready_seconds: float = 0.0
    rendezvous_seconds: float = 0.0
    restore_seconds: float = 0.0
    first_step_seconds: float = 0.0
    restore_source: str = ""  # "" when nothing was restored
    restore_step: int = 0
    replayed_steps: int = 0


@dataclass(frozen=True, slots=True)
class LogReset:
    """Not a line: the tailer's marker that the file was truncated or replaced, so a fold starts over."""

    time: float = 0.0


def follows_a_peer(f: Failure) -> bool:
    """A rank failure that a peer's may have caused: a collective that timed out, or a rank that exited with an error
    (a peer's death breaks its connections: the transport raises). A signal death, a hang, a user error or an
    injected fault is a cause of its own."""
    if f.event is EventName.COLLECTIVE_TIMEOUT:
        return True
    code = f.exit_code
    return f.event is EventName.RANK_EXIT and code is not None and (
        exitcodes.is_crash(code) or code in exitcodes.FOLLOWS_A_PEER)


def cause_rank(f: Failure) -> int:
    """Of two accounts of one outage, the lower is the likelier cause: the rank's own record (fault, hang, user
    error), then its agent's (a signal death, an exit code), then what may follow a peer's failure."""
    return 2 if follows_a_peer(f) else 1 if f.event is EventName.RANK_EXIT else 0


Record = (Start | Step | Eval | Checkpoint | CheckpointFailed | CheckpointBad | Restore | Failure | Done | Recovery
          | LogReset)


def _float(raw: Mapping[str, Any], key: str) -> float | None:
    value = raw.get(key)
    return None if value is None else float(value)


def _int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else int(value)


def _failure(name: EventName, t: float, raw: Mapping[str, Any]) -> Failure:
    rank, reason = _int(raw, "rank"), one_line(raw.get("reason") or raw.get("error") or "")
    group = str(raw.get("group") or "")
    if name is EventName.FAULT:
        return Failure(t, name, str(raw.get("kind", "kill")), f"injected at step {raw.get('step')}", rank=rank,
                       group=group)
    if name is EventName.HANG:
        return Failure(t, name, "hang", f"watchdog: {raw.get('seconds_since_step', '?')} s without a step", rank=rank,
                       group=group)
    if name is EventName.COLLECTIVE_TIMEOUT:
        return Failure(t, name, "collective-timeout", reason, reason, rank=rank, group=group)
    if name is EventName.USER_ERROR:
        return Failure(t, name, "user-error", reason, reason, rank=rank, group=group)
    if name is EventName.RANK_EXIT:
        detail = one_line(raw.get("detail") or "")  # "rank 1: killed by SIGKILL"; the reason: its message, if any
        return Failure(t, name, str(raw.get("kind") or "rank-exit"), detail, reason or detail, rank=rank,
                       exit_code=_int(raw, "exit_code"), group=group)
    code = _int(raw, "exit_code")
    detail = str(raw.get("detail") or (f"exit {code} ({exitcodes.describe(code)})" if code is not None else ""))
    return Failure(t, name, str(raw.get("kind", "")), detail, reason, replica=_int(raw, "replica"), exit_code=code)


def _parse(name: EventName, t: float, raw: Mapping[str, Any]) -> Record:
    if name is EventName.STEP:
        return Step(t, int(raw["step"]), _float(raw, "loss"), _float(raw, "step_seconds") or 0.0,
                    _float(raw, "tokens_per_second"), _int(raw, "world_size") or 0)
    if name is EventName.EVAL:
        return Eval(t, int(raw["step"]), _float(raw, "loss"), _float(raw, "perplexity"),
                    _float(raw, "eval_seconds") or 0.0, _int(raw, "samples") or 0)
    if name is EventName.START:
        return Start(t, _int(raw, "world_size") or 0, _int(raw, "restart_count") or 0, _int(raw, "resumed_from"),
                     str(raw.get("group") or ""))
    if name is EventName.CHECKPOINT:
        return Checkpoint(t, int(raw["step"]), str(raw.get("path") or ""), _float(raw, "blocking_seconds") or 0.0,
                          _float(raw, "total_seconds") or 0.0)
    if name is EventName.CHECKPOINT_FAILED:
        return CheckpointFailed(t, _int(raw, "step"), str(raw.get("error") or ""), str(raw.get("reason") or ""),
                                str(raw.get("message") or ""), str(raw.get("source") or "disk"))
    if name is EventName.CHECKPOINT_BAD:
        return CheckpointBad(t, int(raw["step"]), str(raw.get("path") or ""), one_line(raw.get("reason") or ""),
                             str(raw.get("source") or "disk"))
    if name is EventName.RESTORE:
        return Restore(t, int(raw["step"]), str(raw.get("path") or ""), str(raw.get("source") or "disk"))
    if name is EventName.RECOVERY:
        parts = {k: _float(raw, k) or 0.0 for k in ("detect_seconds", "decide_seconds", "pod_ready_seconds",
                                                     "rendezvous_seconds", "restore_seconds", "first_step_seconds")}
        return Recovery(t, str(raw.get("cause") or ""), float(raw["total_seconds"]), **parts,
                        restore_source=str(raw.get("restore_source") or ""),
                        restore_step=_int(raw, "restore_step") or 0, replayed_steps=_int(raw, "replayed_steps") or 0)
    if name is EventName.DONE:
        return Done(t, int(raw["step"]), raw.get("params_sha256"), raw.get("already_complete_checkpoint") or None,
                    _int(raw, "checkpoint_memory_bytes"))
    return _failure(name, t, raw)


def parse_record(raw: Mapping[str, Any]) -> Record | None:
    """The typed record of one line's object; None when the name is unknown or a required field is missing."""
    try:
        name = EventName(str(raw.get("event")))
        return _parse(name, float(raw.get("time") or 0.0), raw)
    except (KeyError, TypeError, ValueError):
        return None
