"""flywheel/trainer/startup.py: the phases of a rank's start-up, in order, parts reported apart from their phase."""

from __future__ import annotations

import time

import pytest

from flywheel.trainer import startup
from flywheel.trainer.startup import StartupClock, freeze_startup_objects


def test_the_first_phase_counts_from_the_process_start_and_each_mark_from_the_previous_one(monkeypatch):
    monkeypatch.setattr(startup, "process_age", lambda: 2.0)
    clock = StartupClock()  # made long before the first mark, as in a warm zygote: the fork's age counts, not this
    time.sleep(0.05)
    assert clock.mark("imports") == pytest.approx(2.0, abs=0.02)
    time.sleep(0.05)
    assert clock.mark("rendezvous") == pytest.approx(0.05, abs=0.03)
    assert list(clock.phases) == ["imports", "rendezvous"]
    assert clock.total() == pytest.approx(sum(clock.phases.values()))


def test_a_part_is_reported_on_its_own_and_left_out_of_its_phase(monkeypatch):
    monkeypatch.setattr(startup, "process_age", lambda: 0.0)
    clock = StartupClock()
    clock.mark("imports")
    with clock.part("materialize"):
        time.sleep(0.1)
    time.sleep(0.02)
    parallelize = clock.mark("parallelize")
    assert clock.phases["materialize"] == pytest.approx(0.1, abs=0.03)
    assert parallelize == pytest.approx(0.02, abs=0.03) and parallelize < clock.phases["materialize"]
    assert "materialize 0.1" in clock.summary()


def test_process_age_is_this_process_s_age():
    assert 0.0 < startup.process_age() < time.monotonic() + 1


def test_objects_alive_after_start_up_leave_the_cyclic_collector():
    import gc

    survivor = [object() for _ in range(10)]  # tracked containers alive at the first step
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > len(survivor)
        assert gc.get_count()[2] == 0  # a full collection ran first, so no garbage cycle was frozen with them
    finally:
        gc.unfreeze()
