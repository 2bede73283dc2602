"""One decision table for both executors: what each restart action replaces (policy.recovery)."""

from typing import Any

from flywheel.local.supervisor import Supervisor
from flywheel.policy import Action, Recovery, recovery


def test_every_action_has_a_recovery_and_shrink_replaces_the_lost_worker() -> None:
    assert {a: recovery(a) for a in Action} == {
        Action.RESTART_WORKER: Recovery.REPLACE_FAILED, Action.SHRINK: Recovery.REPLACE_FAILED,
        Action.RESTART_JOB: Recovery.REPLACE_ALL, Action.FAIL: Recovery.END_JOB}


class _Record:
    def __init__(self) -> None:
        self.recreations: list[tuple[Any, ...]] = []

    def add_recreation(self, *args: Any, **kwargs: Any) -> None:
        self.recreations.append(args[1:])


def test_the_local_supervisor_restarts_a_shrunk_worker_like_the_operator_recreates_it() -> None:
    sup = Supervisor.__new__(Supervisor)
    started: list[int] = []
    sup.plans = {0: "plan0", 1: "plan1"}  # type: ignore[dict-item]
    sup.record = _Record()  # type: ignore[assignment]
    # A cold start or a warm spare's promotion (flywheel run --spares): either way worker 1 is replaced.
    sup._replace = lambda plan: started.append(int(str(plan)[-1])) or ""  # type: ignore[method-assign, func-returns-value]
    sup._carry_out(1, Action.SHRINK, "NodeLost", "continuing with 1 workers")
    assert started == [1] and sup.record.recreations == [((1,), "Shrink", "NodeLost")]  # type: ignore[attr-defined]
