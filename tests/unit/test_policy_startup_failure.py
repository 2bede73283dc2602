"""A deterministic start-up failure (the same crash before the first step on 2 attempts in a row) fails the job
with that reason after 2 attempts, not after maxRestarts."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.failure_decision import decide_failure
from flywheel.policy.failures import FailureKind
from flywheel.policy.job_view import JobView
from flywheel.policy.startup_failure import StartupFailures, after_failure
from flywheel.spec_status import ConditionType, Phase
from tests.unit.policy_helpers import fresh, pod, spec, view

IMPORT = "ModuleNotFoundError: No module named 'nope'"


def test_the_same_crash_before_any_step_counts_attempts_in_a_row() -> None:
    first = after_failure(StartupFailures(), FailureKind.CRASH, IMPORT, 0)
    assert (first.attempts, first.deterministic) == (1, False)
    second = after_failure(first, FailureKind.CRASH, IMPORT, 0)
    assert second.deterministic and IMPORT in second.message
    assert after_failure(first, FailureKind.CRASH, "ValueError: other", 0).attempts == 1  # another reason
    assert after_failure(first, FailureKind.CRASH, IMPORT, 7).attempts == 0  # it trained in between
    assert after_failure(first, FailureKind.KILLED, IMPORT, 0).attempts == 0  # a signal says nothing to compare
    assert after_failure(first, FailureKind.CRASH, "", 0).attempts == 0
    timeout = "rendezvous failed: RendezvousTimeoutError: "
    once = after_failure(first, FailureKind.CRASH, timeout, 0)
    assert after_failure(once, FailureKind.CRASH, timeout, 0).attempts == 0


def _crash() -> JobView:
    return view(spec(**{"faultTolerance.maxRestarts": 10}),
                [pod(0), pod(1, "Failed", exit_code=1, message=IMPORT)])


def test_a_script_failing_on_an_import_fails_the_job_on_the_second_attempt() -> None:
    out = decide_failure(fresh(), _crash())
    assert out is not None and out.status.phase is Phase.RESTARTING
    assert (out.status.startup_failure.reason, out.status.startup_failure.attempts) == (IMPORT, 1)
    job = view(spec(**{"faultTolerance.maxRestarts": 10}),
               [pod(0, generation=1), pod(1, "Failed", generation=1, exit_code=1, message=IMPORT)], generation=1)
    again = decide_failure(fresh(restarts=1, startup_failure=out.status.startup_failure), job)
    assert again is not None and again.status.phase is Phase.FAILED
    failed = next(c for c in again.status.conditions if c.type == ConditionType.FAILED)
    assert failed.reason == R.STARTUP_FAILURE and IMPORT in failed.message and "2 attempts" in failed.message


def test_a_crash_after_training_moved_on_is_retried_as_before() -> None:
    out = decide_failure(fresh(), _crash())
    assert out is not None
    moved = fresh(restarts=1, step=12, startup_failure=out.status.startup_failure)
    job = view(spec(**{"faultTolerance.maxRestarts": 10}),
               [pod(0, generation=1), pod(1, "Failed", generation=1, exit_code=1, message=IMPORT)], generation=1)
    again = decide_failure(moved, job)
    assert again is not None and again.status.phase is Phase.RESTARTING
    assert again.status.startup_failure.attempts == 0 and again.status.startup_failure.step == 12
