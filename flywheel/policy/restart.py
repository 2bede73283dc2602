"""Restart decisions: a failure plus the restart budget -> what to do (pure; local executor and operator alike).

`recovery(action)` is the one decision table both executors carry out (flywheel/local/supervisor.py and, through
policy/failure_decision.py, the operator): which workers an action replaces. SHRINK means the same in both: the
job goes on at once with the survivors, and the lost worker's replacement is started too, joining (the elastic
agents re-rendezvous) when it is up -- on a cluster once a node has room for it. A shrink never retires a replica
for good: an elastic job grows back to its desired size when capacity returns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from typing import assert_never

from flywheel.policy import reasons as R
from flywheel.policy.failures import EXTERNAL, PERMANENT, FailureKind
from flywheel.spec import TrainingJobSpec


class Action(str, Enum):
    RESTART_WORKER = "RestartWorker"  # recreate only the failed worker; the others re-rendezvous
    RESTART_JOB = "RestartJob"  # recreate every worker
    SHRINK = "Shrink"  # go on with fewer workers (elastic jobs, while >= min are alive)
    FAIL = "Fail"  # give up with a clear reason


class Recovery(StrEnum):
    """What an executor does about a decided failure."""

    REPLACE_FAILED = "ReplaceFailed"  # start the failed workers again; the survivors keep running and re-rendezvous
    REPLACE_ALL = "ReplaceAll"  # stop every worker, then start all of them (a new generation, a fresh rendezvous)
    END_JOB = "EndJob"  # stop every worker; the job failed


def recovery(action: Action) -> Recovery:
    match action:
        case Action.RESTART_WORKER | Action.SHRINK:
            return Recovery.REPLACE_FAILED
        case Action.RESTART_JOB:
            return Recovery.REPLACE_ALL
        case Action.FAIL:
            return Recovery.END_JOB
        case _:
            assert_never(action)


@dataclass(frozen=True)
class RestartBudget:
    """Restarts spent since the budget window opened at `window_start_step` (a committed step)."""

    used: int = 0
    window_start_step: int = 0

    def refreshed(self, spec: TrainingJobSpec, committed_step: int) -> RestartBudget:
        """Reset the budget once `budgetResetAfterSteps` steps were committed since the window opened."""
        reset_after = spec.fault_tolerance.budget_reset_after_steps
        if reset_after and committed_step - self.window_start_step >= reset_after:
            return RestartBudget(used=0, window_start_step=committed_step)
        return self

    def charged(self) -> RestartBudget:
        return replace(self, used=self.used + 1)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str  # a FailureKind value or a fixed reason string; becomes status.lastRestartReason
    message: str
    budget: RestartBudget


def decide_restart(spec: TrainingJobSpec, failure: FailureKind, budget: RestartBudget, committed_step: int,
                   live_replicas: int, ready_spares: int = 0, charge: bool = True) -> Decision:
    """Decide what to do after a worker failed.

    `live_replicas` counts healthy workers besides the failed one, `ready_spares` the warm spares waiting to be
    promoted. External failures (preemption, eviction, a lost node) never spend the budget; permanent ones fail at
    once; the rest spend one restart each. A lost or evicted worker with a warm spare ready is replaced by it alone:
    the survivors restart their ranks in place when it joins (recreating them too would make every one of them a
    cold pod, and the spare pointless). `charge` False: the failure is not the job's either (a rendezvous that gave
    up on a peer the scheduler cannot place, policy/pending_timeout.py) and spends nothing.
    """
    budget = budget.refreshed(spec, committed_step)
    reason = failure.value
    if failure in PERMANENT:
        return Decision(Action.FAIL, reason, R.MSG_PERMANENT.get(reason, R.MSG_PERMANENT_DEFAULT).format(reason=reason),
                        budget)
    if failure not in EXTERNAL and charge:
        limit = spec.fault_tolerance.max_restarts
        if budget.used >= limit:
            return Decision(Action.FAIL, "RestartBudgetExhausted",
                            f"{reason} after {budget.used} restarts (maxRestarts={limit}) without "
                            f"{spec.fault_tolerance.budget_reset_after_steps} committed steps in between", budget)
        budget = budget.charged()
    if failure is FailureKind.POD_DELETED:  # the survivors are fine: only the deleted pod is replaced
        return Decision(Action.RESTART_WORKER, reason, f"{reason}: recreating the deleted worker", budget)
    if failure in (FailureKind.NODE_LOST, FailureKind.EVICTED) and ready_spares > 0:
        return Decision(Action.RESTART_WORKER, reason, f"{reason}: a warm spare takes the lost worker's place", budget)
    elastic = spec.replicas.min < spec.replicas.max
    if failure in (FailureKind.NODE_LOST, FailureKind.EVICTED) and elastic and live_replicas >= spec.replicas.min:
        return Decision(Action.SHRINK, reason,
                        f"{reason}: continuing with {live_replicas} workers while a replacement is scheduled", budget)
    if spec.fault_tolerance.restart_scope == "worker":
        return Decision(Action.RESTART_WORKER, reason, f"{reason}: recreating the failed worker", budget)
    return Decision(Action.RESTART_JOB, reason, f"{reason}: restarting the job from the last checkpoint", budget)
