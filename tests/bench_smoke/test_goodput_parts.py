"""bench/goodput's pure parts: how long a faulted run trains."""

from __future__ import annotations

from bench.goodput import CKPT_EVERY, run_length


def test_a_run_twice_as_fast_as_its_clean_run_meets_its_first_fault_before_its_last_checkpoint_interval() -> None:
    """CI's quick run: clean sides slowed to 0.08 s a step by a busy machine, the faulted side then at 0.046 s;
    its first kill, half a period (3 s) after its first step, must come before the step where faults stop."""
    period, clean_pace, faulted_pace = 6.0, 0.08, 0.046
    steps = run_length(8.0, period, [{"pace_s": clean_pace}, {"pace_s": 0.09}, {"pace_s": None}])
    assert (period / 2) / faulted_pace < steps - CKPT_EVERY
    assert steps * clean_pace < 2 * 8.0  # not much longer than asked at the clean pace


def test_a_long_run_is_its_seconds_at_the_fastest_pace() -> None:
    assert run_length(240.0, 60.0, [{"pace_s": 0.05}, {"pace_s": 0.1}]) == 4800
    assert run_length(1.0, 0.5, [{"pace_s": 0.1}]) == 2 * CKPT_EVERY  # never shorter than two checkpoints


def test_a_side_that_logs_no_starts_gets_one_before_each_group_it_began() -> None:
    """torchrun writes no `start`: a group begins at the first record, at a restore, and at a step that is not above
    the previous one (started again without a checkpoint); the fold then finds the incident and its recovery."""
    from bench.goodput_user_script import with_inferred_starts
    from flywheel.eventlog import Failure, Restore, Start, Step, fold

    records = [Step(1.0, 1), Step(2.0, 2), Step(3.0, 3),  # killed after 3: no checkpoint yet
               Step(10.0, 1), Step(11.0, 2), Step(12.0, 3), Step(13.0, 4),  # killed after 4, the save of 2 kept
               Restore(20.0, 2), Step(21.0, 3), Step(22.0, 4), Step(23.0, 5)]
    inferred = with_inferred_starts(records)
    assert [r.time for r in inferred if isinstance(r, Start)] == [1.0 - 1e-3, 10.0 - 1e-3, 20.0 - 1e-3]
    faults = [Failure(3.5, "fault", "kill", ""), Failure(13.5, "fault", "kill", "")]
    log = fold(sorted([*inferred, *faults], key=lambda r: r.time))
    assert [(i.recovered_at, i.lost_steps) for i in log.incidents] == [(10.0, 3), (21.0, 2)]
