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
