"""How the health monitor's findings change a TrainingJob's conditions (pure).

The operator writes the returned conditions with a resourceVersion precondition (flywheel/operator/health_executor.py). A
True `Hung` condition is also the restart request: the next reconcile pass decides the restart with
`FailureKind.HANG` and sets it False again (reconcile.py), so restarts are decided and counted in one place.
"""

from __future__ import annotations

from typing import Any

from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition, set_condition

Conditions = list[dict[str, Any]]


def _copy(status: dict[str, Any]) -> dict[str, Any]:
    return {"conditions": [dict(c) for c in status.get("conditions", [])]}


def mark_hung(status: dict[str, Any], finding: str, now: float, seen_restarts: int) -> Conditions | None:
    """The conditions with `Hung` True, or None when there is nothing to do: the job is no longer Running, was
    restarted since the monitor looked at it (`seen_restarts`), or is already marked."""
    if status.get("phase") != "Running" or int(status.get("restarts", 0)) != seen_restarts:
        return None
    old = condition(status, "Hung")
    if old is not None and old.get("status") == "True":
        return None
    out = _copy(status)
    set_condition(out, "Hung", True, R.HUNG, finding, now)
    return list(out["conditions"])


def mark_degraded(status: dict[str, Any], degraded: bool, message: str, now: float) -> Conditions | None:
    """The conditions with the straggler verdict in `Degraded`, or None when unchanged. Fewer ready workers than
    desired (the reconcile pass's own Degraded reason) takes precedence and is never cleared here."""
    old = condition(status, "Degraded")
    ours = old is None or old.get("reason") in (R.STRAGGLER, R.STRAGGLER_RECOVERED)
    if not ours and old is not None and old.get("status") == "True":
        return None
    out = _copy(status)
    if degraded:
        set_condition(out, "Degraded", True, R.STRAGGLER, message, now)
    elif old is not None and old.get("reason") == R.STRAGGLER and old.get("status") == "True":
        set_condition(out, "Degraded", False, R.STRAGGLER_RECOVERED, message, now)
    conditions = list(out["conditions"])
    return None if conditions == status.get("conditions", []) else conditions
