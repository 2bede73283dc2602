"""Pure decisions over plain data: failure taxonomy, restart budget, and what to do about a failure."""

from flywheel.policy.failures import EXTERNAL, PERMANENT, FailureKind, classify_exit, classify_pod
from flywheel.policy.restart import Action, Decision, Recovery, RestartBudget, decide_restart, recovery

__all__ = ["EXTERNAL", "PERMANENT", "Action", "Decision", "FailureKind", "Recovery", "RestartBudget", "classify_exit",
           "classify_pod", "decide_restart", "recovery"]
