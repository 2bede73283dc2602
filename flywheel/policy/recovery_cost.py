"""Where a recovery's time went (pure): the times the operator saw (the fault, its decision, its actions, the
replacement ready) and the trainer's progress records (the new group's start, how long its restore took and from
where, its first step, the step it resumed from) -> the parts of the fault -> first step interval.

    detect      fault -> the operator's restart decision (its status write)
    decide      decision -> its actions carried out (pods deleted, a spare promoted, a pod created)
    podReady    actions -> the replacement worker ready (0 for a promoted spare: it waited ready)
    rendezvous  replacement ready -> the new group formed and its restore begun (start - restore time)
    restore     the checkpoint load (restoreSource: memory-own / memory-peer / disk)
    firstStep   the group's start -> its first step
    replayedSteps  the steps reached before the fault and trained again after it

The parts add up to the total; a part whose ends came out of order (clocks, publish intervals) counts 0 and the
next one takes the rest, so the sum stays the total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OperatorTimes:
    """What the operator saw of one recovery it decided (unix times, its clock)."""

    cause: str  # status.lastRestartReason
    fault_at: float  # the failed pods' end / deletion, else the last step seen before the decision
    decided_at: float
    acted_at: float
    ready_at: float | None = None  # the replacement ready (a promoted spare: acted_at); None: not seen yet


@dataclass(frozen=True)
class GroupStart:
    """The new group's first records (the trainer's progress)."""

    started_at: float  # its `start` (after the restore)
    first_step_at: float
    restore_seconds: float = 0.0
    restore_source: str = ""  # "" without a checkpoint
    restore_step: int = 0
    resumed_from: int = 0
    step_before: int = 0  # the highest step the group before reached


@dataclass(frozen=True)
class RecoveryCost:
    cause: str
    detect_seconds: float
    decide_seconds: float
    pod_ready_seconds: float
    rendezvous_seconds: float
    restore_seconds: float
    first_step_seconds: float
    restore_source: str
    replayed_steps: int
    restore_step: int = 0

    @property
    def total_seconds(self) -> float:
        return (self.detect_seconds + self.decide_seconds + self.pod_ready_seconds + self.rendezvous_seconds
                + self.restore_seconds + self.first_step_seconds)

    def parts(self) -> dict[str, float]:
        """The parts by name (metric label values)."""
        return {"detect": self.detect_seconds, "decide": self.decide_seconds, "pod_ready": self.pod_ready_seconds,
                "rendezvous": self.rendezvous_seconds, "restore": self.restore_seconds,
                "first_step": self.first_step_seconds}

    def to_status(self) -> dict[str, Any]:
        """status.goodput.lastRecovery."""
        names = {"detect": "detectSeconds", "decide": "decideSeconds", "pod_ready": "podReadySeconds",
                 "rendezvous": "rendezvousSeconds", "restore": "restoreSeconds", "first_step": "firstStepSeconds"}
        return {"cause": self.cause, "totalSeconds": round(self.total_seconds, 3),
                **{names[k]: round(v, 3) for k, v in self.parts().items()}, "restoreSource": self.restore_source,
                "replayedSteps": self.replayed_steps}


def recovery_cost(op: OperatorTimes, group: GroupStart) -> RecoveryCost:
    """The parts of one recovery; the marks are taken in order, each no earlier than the one before."""
    ready = op.ready_at if op.ready_at is not None else op.acted_at
    restore_began = group.started_at - group.restore_seconds
    marks = [op.fault_at]
    for t in (op.decided_at, op.acted_at, ready, restore_began, group.started_at, group.first_step_at):
        marks.append(max(t, marks[-1]))
    detect, decide, pod_ready, rendezvous, restore, first_step = (b - a for a, b in zip(marks, marks[1:]))
    return RecoveryCost(op.cause, detect, decide, pod_ready, rendezvous, restore, first_step,
                        restore_source=group.restore_source,
                        replayed_steps=max(group.step_before - group.resumed_from, 0), restore_step=group.restore_step)


def add_badput(badput: Mapping[str, float], cost: RecoveryCost) -> dict[str, float]:
    """status.goodput.badputSeconds with one more recovery added to its cause."""
    out = dict(badput)
    out[cost.cause] = round(out.get(cost.cause, 0.0) + cost.total_seconds, 3)
    return out
