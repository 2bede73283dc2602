"""Hang detection from the etcd progress on the operator's clock (monitor/progress_hang.py)."""

from __future__ import annotations

from flywheel.monitor.progress_hang import ProgressClock, progress_hang, progress_hang_due


def test_no_hang_while_not_all_pods_run_or_disabled() -> None:
    assert progress_hang(ProgressClock(None, 0.0), 1000.0, 60, 600) is None
    assert progress_hang(ProgressClock(0.0, 1.0), 1000.0, 0, 600) is None  # progressTimeoutSeconds 0: off


def test_first_step_allowance_until_the_group_steps() -> None:
    clock = ProgressClock(running_since=100.0, last_step_seen=None)
    assert progress_hang(clock, 699.0, 60, 600) is None
    hang = progress_hang(clock, 700.0, 60, 600)
    assert hang is not None and hang.idle_seconds == 600.0 and "firstStepTimeoutSeconds" in hang.message
    assert not hang.stepped  # this generation trained no step: a restart in place of it is not repeated
    # A step of the previous generation (before its pods all ran) does not end the first-step allowance.
    assert progress_hang(ProgressClock(100.0, 90.0), 200.0, 60, 600) is None


def test_progress_timeout_after_a_step() -> None:
    clock = ProgressClock(running_since=100.0, last_step_seen=150.0)
    assert progress_hang(clock, 209.0, 60, 600) is None
    hang = progress_hang(clock, 210.0, 60, 600)
    assert hang is not None and hang.idle_seconds == 60.0
    assert "progressTimeoutSeconds is 60" in hang.message and "since the last step" in hang.message
    assert hang.stepped


def test_the_hang_is_due_when_its_allowance_ends() -> None:
    for clock, due in ((ProgressClock(100.0, None), 700.0), (ProgressClock(100.0, 90.0), 700.0),
                       (ProgressClock(100.0, 150.0), 210.0)):
        assert progress_hang_due(clock, 60, 600) == due
        assert progress_hang(clock, due - 0.01, 60, 600) is None and progress_hang(clock, due, 60, 600) is not None
    assert progress_hang_due(ProgressClock(None, 150.0), 60, 600) is None  # not all pods run: never
    assert progress_hang_due(ProgressClock(100.0, 150.0), 0, 600) is None  # off
