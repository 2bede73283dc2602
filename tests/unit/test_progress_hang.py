"""Hang detection from the etcd progress on the operator's clock (monitor/progress_hang.py)."""

from __future__ import annotations

from typing import cast

import pytest

from flywheel.etcd.progress import ProgressRecord
from flywheel.etcd.progress_watch import ProgressWatch
from flywheel.monitor.progress_hang import ProgressClock, progress_hang, progress_hang_due
from flywheel.operator import progress_follower as follower
from tests.unit.policy_helpers import pod, spec


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


def test_a_group_restarted_in_place_gets_the_first_step_allowance_again() -> None:
    # The old group stepped last at 150; its ranks restarted in place and the new group began at 160.
    clock = ProgressClock(running_since=100.0, last_step_seen=150.0, group_began=160.0)
    assert not clock.stepped and progress_hang(clock, 250.0, 60, 600) is None
    assert progress_hang_due(clock, 60, 600) == 760.0
    hang = progress_hang(clock, 760.0, 60, 600)
    assert hang is not None and "firstStepTimeoutSeconds" in hang.message and not hang.stepped
    # Once the new group steps, the progress timeout applies again; a group older than the pods changes nothing.
    assert progress_hang_due(ProgressClock(100.0, 170.0, 160.0), 60, 600) == 230.0
    assert progress_hang_due(ProgressClock(100.0, 150.0, 50.0), 60, 600) == 210.0


def test_the_follower_restarts_the_allowance_from_a_new_attempt_or_a_rank_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = spec(**{"faultTolerance.progressTimeoutSeconds": 60, "faultTolerance.firstStepTimeoutSeconds": 600})
    t0, now = 1_000_000.0, [1_000_000.0]
    monkeypatch.setattr(follower.time, "time", lambda: now[0])
    job = follower.JobProgress(lambda: None)
    job.watch = cast(ProgressWatch, object())  # as if started
    assert job.hang(s, [pod(0), pod(1)], 0, t0) is None
    for i in range(1, 101):  # the first group trains steps 1..100 until t0+100
        now[0] = t0 + i
        job._apply({"0": ProgressRecord(time=now[0], attempt=t0, step=i)})
    # A rank crashes at t0+100; its agent restarts the ranks in place (reported at t0+101): the restore ...
    restarted = [pod(0), pod(1, rank_restarts=1, rank_restart_at=t0 + 101)]
    assert job.hang(s, restarted, 0, t0 + 170) is None
    # ... then the new group's start at t0+110: compile and the first step take minutes.
    now[0] = t0 + 110
    job._apply({"0": ProgressRecord(time=now[0], attempt=t0 + 110, step=100, resumed_from=100)})
    assert job.hang(s, restarted, 0, t0 + 250) is None and job.hang_due(s) == t0 + 710
    hang = job.hang(s, restarted, 0, t0 + 710)
    assert hang is not None and "firstStepTimeoutSeconds" in hang.message
