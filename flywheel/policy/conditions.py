"""Status conditions (pure): reading and setting them on the typed status, and `set_phase`, the one place where the
phase is written together with every condition that describes the job's current state, so that the two never
disagree.

Conditions of two sorts live in `status.conditions`:

- history: `Created` and `Invalid` say what happened once; the phase never changes them;
- state: `Running`, `Restarting`, `Suspended`, `Succeeded`, `Failed` (one per phase but Pending, True exactly while
  the job is in that phase), and `Degraded`, `Hung`, `Unschedulable`, `ReplicaFailure`, `SpecChanged`,
  `CheckpointDirInUse` (waiting for another job's checkpoint location: Pending or Restarting only), which may
  only be True in some phases (`MAY_HOLD`): a job that is not running cannot be degraded or hung, and a suspended or
  finished job has no pod waiting for a node, creates none and runs none on an older spec.
"""

from __future__ import annotations

from typing import Literal

from flywheel.contracts.timefmt import parse_rfc3339, rfc3339
from flywheel.spec.status import Condition, ConditionType, Phase, TrainingJobStatus

C = ConditionType
PHASE_CONDITIONS = (C.RUNNING, C.RESTARTING, C.SUSPENDED, C.SUCCEEDED, C.FAILED)
# Besides its own, the state conditions that may be True in each phase; set_phase turns the others False.
MAY_HOLD: dict[Phase, frozenset[ConditionType]] = {
    Phase.PENDING: frozenset({C.UNSCHEDULABLE, C.REPLICA_FAILURE, C.SPEC_CHANGED, C.CHECKPOINT_DIR_IN_USE}),
    Phase.RESTARTING: frozenset({C.UNSCHEDULABLE, C.REPLICA_FAILURE, C.SPEC_CHANGED, C.CHECKPOINT_DIR_IN_USE}),
    Phase.RUNNING: frozenset({C.DEGRADED, C.HUNG, C.UNSCHEDULABLE, C.REPLICA_FAILURE, C.SPEC_CHANGED}),
    Phase.SUSPENDED: frozenset(),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
}
STATE_CONDITIONS = PHASE_CONDITIONS + (C.DEGRADED, C.HUNG, C.UNSCHEDULABLE, C.REPLICA_FAILURE, C.SPEC_CHANGED,
                                       C.CHECKPOINT_DIR_IN_USE)
TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})


def iso(t: float) -> str:
    return rfc3339(t)


def parse_iso(text: str | None) -> float | None:
    return parse_rfc3339(text)


def condition(status: TrainingJobStatus, ctype: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == ctype), None)


def holds(status: TrainingJobStatus, ctype: ConditionType) -> bool:
    cond = condition(status, ctype)
    return cond is not None and cond.status == "True"


def since(status: TrainingJobStatus, ctype: ConditionType) -> float | None:
    """When `ctype` last changed (its lastTransitionTime), or None."""
    cond = condition(status, ctype)
    return parse_iso(cond.last_transition_time) if cond is not None else None


def set_condition(status: TrainingJobStatus, ctype: ConditionType, truth: bool, reason: str, message: str,
                  now: float) -> None:
    """Set a condition; lastTransitionTime changes only when its status flips."""
    value: Literal["True", "False"] = "True" if truth else "False"
    old = condition(status, ctype)
    if old is None:
        if not truth:
            return  # a condition that never held is simply absent
        status.conditions = [*status.conditions, Condition(type=ctype.value, status=value, reason=reason,
                                                           message=message, last_transition_time=iso(now))]
        return
    if old.status != value:
        old.last_transition_time = iso(now)
    old.status, old.reason, old.message = value, reason, message


def set_phase(status: TrainingJobStatus, phase: Phase, reason: str, message: str, now: float, *,
              refresh: bool = True) -> None:
    """Write `phase` and make the state conditions agree with it: the condition named after the phase is True
    (Pending has none), and every other state condition that `MAY_HOLD` does not allow in this phase is False.

    A condition this turns False takes `reason` and `message` (why it ended); one already False keeps its own. With
    `refresh=False` a phase condition that is already True keeps its reason and message (a Restarting condition goes
    on naming the failure that started it)."""
    status.phase = phase
    allowed = MAY_HOLD[phase]
    for ctype in STATE_CONDITIONS:
        if ctype.value == phase.value:
            if refresh or not holds(status, ctype):
                set_condition(status, ctype, True, reason, message, now)
        elif ctype not in allowed and holds(status, ctype):
            set_condition(status, ctype, False, reason, message, now)
