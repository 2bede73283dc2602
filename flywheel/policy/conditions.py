"""Status conditions (pure): reading and setting them, and `set_phase`, the one place where the phase is written
together with every condition that describes the job's current state, so that the two never disagree.

Conditions of two sorts live in `status.conditions`:

- history: `Created` and `Invalid` say what happened once; the phase never changes them;
- state: `Running`, `Restarting`, `Suspended`, `Succeeded`, `Failed` (one per phase but Pending, True exactly while
  the job is in that phase), and `Degraded`, `Hung`, `Unschedulable`, which may only be True in some phases
  (`MAY_HOLD`): a job that is not running cannot be degraded or hung, and a suspended or finished job has no pod
  waiting for a node.
"""

from __future__ import annotations

from typing import Any

from flywheel.timefmt import parse_rfc3339, rfc3339

PHASE_CONDITIONS = ("Running", "Restarting", "Suspended", "Succeeded", "Failed")
# Besides its own, the state conditions that may be True in each phase; set_phase turns the others False.
MAY_HOLD: dict[str, frozenset[str]] = {
    "Pending": frozenset({"Unschedulable"}),
    "Restarting": frozenset({"Unschedulable"}),
    "Running": frozenset({"Degraded", "Hung", "Unschedulable"}),
    "Suspended": frozenset(),
    "Succeeded": frozenset(),
    "Failed": frozenset(),
}
STATE_CONDITIONS = PHASE_CONDITIONS + ("Degraded", "Hung", "Unschedulable")


def iso(t: float) -> str:
    return rfc3339(t)


def parse_iso(text: str | None) -> float | None:
    return parse_rfc3339(text)


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == ctype), None)


def holds(status: dict[str, Any], ctype: str) -> bool:
    return (condition(status, ctype) or {}).get("status") == "True"


def set_condition(status: dict[str, Any], ctype: str, truth: bool, reason: str, message: str, now: float) -> None:
    """Set a condition; lastTransitionTime changes only when its status flips."""
    value = "True" if truth else "False"
    conds = status.setdefault("conditions", [])
    old = condition(status, ctype)
    if old is None:
        if not truth:
            return  # a condition that never held is simply absent
        conds.append({"type": ctype, "status": value, "reason": reason, "message": message,
                      "lastTransitionTime": iso(now)})
        return
    if old["status"] != value:
        old["lastTransitionTime"] = iso(now)
    old.update(status=value, reason=reason, message=message)


def set_phase(status: dict[str, Any], phase: str, reason: str, message: str, now: float, *,
              refresh: bool = True) -> None:
    """Write `phase` and make the state conditions agree with it: the condition named after the phase is True
    (Pending has none), and every other state condition that `MAY_HOLD` does not allow in this phase is False.

    A condition this turns False takes `reason` and `message` (why it ended); one already False keeps its own. With
    `refresh=False` a phase condition that is already True keeps its reason and message (a Restarting condition goes
    on naming the failure that started it)."""
    status["phase"] = phase
    allowed = MAY_HOLD[phase]
    for ctype in STATE_CONDITIONS:
        if ctype == phase:
            if refresh or not holds(status, ctype):
                set_condition(status, ctype, True, reason, message, now)
        elif ctype not in allowed and holds(status, ctype):
            set_condition(status, ctype, False, reason, message, now)
