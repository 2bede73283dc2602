"""Rank restarts in place, from the agent to whoever reports them.

torch's elastic agent restarts crashed ranks inside a worker without the worker (its pod) failing, so neither the
pod's status nor the operator would see the interruption. `flywheel launch`'s agent tells every reporter here each
time it restarts its ranks after a failure (not for a membership change); the etcd-v3 rendezvous handler registers
the worker's liveness key as one (agent/rendezvous/handler.py), from which the operator counts them into
`status.restarts`. Without etcd (`flywheel run`'s c10d rendezvous) nobody listens: the local runner counts rank
restarts from the event log's `start` records instead (eventlog/fold.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from flywheel.agent.hooks import AgentHooks
from flywheel.contracts import exitcodes, termination_log

# (restarts so far, the last one's reason, its unix time)
Reporter = Callable[[int, str, float], None]
reporters: AgentHooks[Reporter] = AgentHooks("rank restart reporter")


def report(count: int, reason: str) -> None:
    """Tell every reporter the agent restarts its ranks in place now (`count` times so far, this one for
    `reason`)."""
    at = time.time()
    for _ in reporters.each(lambda reporter: reporter(count, reason, at)):
        pass


def restart_reason(failures: Mapping[int, tuple[int, float]], first_failure_code: int) -> str:
    """The reason of a rank restart from {global_rank: (exit_code, timestamp)} of the failed ranks and the code
    `flywheel launch` would exit with for them: the rank that failed first and its exit code or signal."""
    first = first_failed_rank(failures, first_failure_code)
    reason = termination_log.exit_reason(first_failure_code)
    return f"rank {first}: {reason}" if first is not None else reason


def first_failed_rank(failures: Mapping[int, tuple[int, float]], first_failure_code: int) -> int | None:
    """The lowest rank that exited with `first_failure_code` (the code the agent's worker exits with for them)."""
    return next((r for r, (c, _) in sorted(failures.items()) if exitcodes.shell_code(c) == first_failure_code), None)
