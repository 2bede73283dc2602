"""A deterministic start-up failure (the same crash before the first step on 2 attempts in a row) fails the job
with that reason after 2 attempts, not after maxRestarts."""

from __future__ import annotations

from flywheel.contracts.timefmt import rfc3339
from flywheel.policy import reasons as R
from flywheel.policy.failure_decision import decide_failure
from flywheel.policy.failures import FailureKind
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import ObservedProgress
from flywheel.policy.startup_failure import StartupFailures, after_failure, before_first_step
from flywheel.spec.status import ConditionType, Phase
from tests.builders import NOW, fresh, pod, spec, view

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


CUDA = "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_the_same_crash_at_the_same_step_after_training_each_time_is_retried_to_max_restarts() -> None:
    # Each generation restores checkpoint 400, trains to 500 and crashes there: the job's step is 500 at every
    # decision, yet each attempt trained 100 steps, so it is no start-up failure.
    s = spec(**{"faultTolerance.maxRestarts": 10})
    out = fresh(step=500)
    for gen in range(4):
        started = NOW + 100 * gen  # this generation's group reported its start, then stepped
        progress = ObservedProgress(step=500, checkpoint_step=400, attempt=started, attempt_stepped=True)
        job = view(s, [pod(0, generation=gen), pod(1, "Failed", generation=gen, exit_code=1, message=CUDA)],
                   generation=gen, now=started + 50, progress=progress)
        decided = decide_failure(fresh(**out.status.model_dump()), job)
        assert decided is not None and decided.status.phase is Phase.RESTARTING, gen
        assert decided.status.startup_failure.attempts == 0
        out = decided
    assert out.status.restarts == 4


def test_a_group_that_never_reported_its_start_crashed_before_its_first_step() -> None:
    # Generation 0 trained (its attempt stepped); generations 1 and 2 crash on import before their `start`: the
    # newest attempt in the record is generation 0's, older than their restarts.
    s = spec(**{"faultTolerance.maxRestarts": 10})
    trained = ObservedProgress(step=500, attempt=NOW - 1000, attempt_stepped=True)
    out = decide_failure(fresh(step=500), view(s, [pod(0), pod(1, "Failed", exit_code=1, message=IMPORT)],
                                               progress=trained))
    assert out is not None and out.status.startup_failure.attempts == 0
    for gen, expected in ((1, Phase.RESTARTING), (2, Phase.FAILED)):
        job = view(s, [pod(0, generation=gen), pod(1, "Failed", generation=gen, exit_code=1, message=IMPORT)],
                   generation=gen, now=NOW + 100 * gen, progress=trained)
        out = decide_failure(fresh(**out.status.model_dump()), job)
        assert out is not None and out.status.phase is expected, gen


def test_before_first_step_reads_the_newest_attempt_of_this_generation() -> None:
    restarted = fresh(last_restart_time=rfc3339(NOW)).status
    assert before_first_step(restarted, ObservedProgress()) is None  # no attempt known: the step decides
    assert before_first_step(restarted, ObservedProgress(attempt=NOW - 5, attempt_stepped=True)) is True
    assert before_first_step(restarted, ObservedProgress(attempt=NOW + 5, attempt_stepped=True)) is False
    assert before_first_step(restarted, ObservedProgress(attempt=NOW + 5)) is True
    assert before_first_step(fresh().status, ObservedProgress(attempt=NOW - 5, attempt_stepped=True)) is False


def test_group_before_first_step_reads_the_newest_attempt_against_the_last_restart() -> None:
    from flywheel.policy.startup_failure import group_before_first_step

    assert group_before_first_step(0.0, False, None) is None  # nothing known: the step decides
    assert group_before_first_step(100.0, True, None) is False  # the first group trained
    assert group_before_first_step(100.0, False, None) is True
    assert group_before_first_step(100.0, True, 150.0) is True  # an attempt from before the restart: none since
    assert group_before_first_step(200.0, True, 150.0) is False
    assert group_before_first_step(200.0, False, 150.0) is True


def test_a_final_save_failing_on_every_retry_fails_as_final_save_failed() -> None:
    """A run whose final state cannot be saved is retried (restore, save, no step): the same failure twice in a
    row fails it under its own reason and advice, not as a start-up failure."""
    from flywheel.contracts.termination_log import exception_reason
    from flywheel.trainer.checkpoint.failure import FinalSaveFailed

    reason = exception_reason(FinalSaveFailed("the final checkpoint (step 30) was not saved: no space left on /c"))
    assert FinalSaveFailed.__name__ == R.FINAL_SAVE_FAILED and reason.startswith(R.FINAL_SAVE_FAILED + ":")
    spec_ = spec(**{"faultTolerance.maxRestarts": 10})
    record = fresh(step=30).status.startup_failure  # the run trained to step 30, then its final save failed
    for attempt in range(3):  # the first failure ended training; each retry only restores and saves
        job = view(spec_, [pod(0, generation=attempt), pod(1, "Failed", generation=attempt, exit_code=1,
                                                             message=reason)],
                   generation=attempt, progress=ObservedProgress(step=30))
        out = decide_failure(fresh(step=30, restarts=attempt, startup_failure=record), job)
        assert out is not None
        record = out.status.startup_failure
    assert out.status.phase is Phase.FAILED and record.attempts == 2
    failed = next(c for c in out.status.conditions if c.type == ConditionType.FAILED)
    assert failed.reason == R.FINAL_SAVE_FAILED and "make room where the checkpoints are kept" in failed.message
    assert R.STARTUP_FAILURE not in failed.message and "no space left on /c" in failed.message
