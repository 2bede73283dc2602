"""Hang detection from the etcd progress on the operator's clock (policy/progress_hang.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, cast

import pytest
from prometheus_client import PROCESS_COLLECTOR

from flywheel.etcd.progress import PHASE_EVALUATING, PHASE_SAVING, ProgressRecord
from flywheel.etcd.progress_watch import ProgressWatch
from flywheel.monitor.prometheus import Sample
from flywheel.monitor.queries import parse_progress, process_start_query, progress_query
from flywheel.operator import progress_follower as follower
from flywheel.policy.health_checks import find_hangs
from flywheel.policy.observed import ProgressClock
from flywheel.policy.progress_hang import progress_hang, progress_hang_due
from flywheel.trainer.metrics import TrainerMetrics
from tests.builders import pod, spec, watched_job


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
    assert _hang(job, s, [pod(0), pod(1)], 0, t0) is None
    for i in range(1, 101):  # the first group trains steps 1..100 until t0+100
        now[0] = t0 + i
        job._apply({"0": ProgressRecord(time=now[0], attempt=t0, step=i)})
    # A rank crashes at t0+100; its agent restarts the ranks in place (reported at t0+101): the restore ...
    restarted = [pod(0), pod(1, rank_restarts=1, rank_restart_at=t0 + 101)]
    assert _hang(job, s, restarted, 0, t0 + 170) is None
    # ... then the new group's start at t0+110: compile and the first step take minutes.
    now[0] = t0 + 110
    job._apply({"0": ProgressRecord(time=now[0], attempt=t0 + 110, step=100, resumed_from=100)})
    assert _hang(job, s, restarted, 0, t0 + 250) is None and _hang_due(job, s, restarted, 0, t0 + 250) == t0 + 710
    hang = _hang(job, s, restarted, 0, t0 + 710)
    assert hang is not None and "firstStepTimeoutSeconds" in hang.message


def _hang(job: follower.JobProgress, s: Any, views: list[Any], generation: int, now: float) -> Any:
    """The follower's clock judged as the reconcile pass judges it (policy/progress_hang.py)."""
    clock = job.clock(s, views, generation, now)
    ft = s.fault_tolerance
    return None if clock is None else progress_hang(clock, now, ft.progress_timeout_seconds,
                                                    ft.first_step_timeout_seconds)


def _hang_due(job: follower.JobProgress, s: Any, views: list[Any], generation: int, now: float) -> float | None:
    """When the clock comes due with no progress seen before."""
    clock = job.clock(s, views, generation, now)
    ft = s.fault_tolerance
    return None if clock is None else progress_hang_due(clock, ft.progress_timeout_seconds,
                                                        ft.first_step_timeout_seconds)


def _stepped_follower(monkeypatch: pytest.MonkeyPatch, now: list[float]) -> follower.JobProgress:
    """A follower whose job trained steps 1..100 until now[0] + 100 (one a second), its pods all Running."""
    monkeypatch.setattr(follower.time, "time", lambda: now[0])
    job = follower.JobProgress(lambda: None)
    job.watch = cast(ProgressWatch, object())  # as if started
    t0 = now[0]
    for i in range(1, 101):
        now[0] = t0 + i
        job._apply({"0": ProgressRecord(time=now[0], attempt=t0, step=i)})
    return job


def test_evaluation_batches_are_progress_for_the_operator_as_for_the_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    s = spec(**{"faultTolerance.progressTimeoutSeconds": 60, "faultTolerance.firstStepTimeoutSeconds": 600})
    t0, now = 1_000_000.0, [1_000_000.0]
    views = [pod(0), pod(1)]
    job = _stepped_follower(monkeypatch, now)
    assert _hang(job, s, views, 0, t0) is None  # the pods run since t0
    # A 200 s evaluation after step 100: rank 0's record carries a heartbeat, published at most once a second.
    for k in range(1, 201):
        now[0] = t0 + 100 + k
        job._apply({"0": ProgressRecord(time=now[0], attempt=t0, step=100, phase=PHASE_EVALUATING,
                                        heartbeat=now[0])})
    assert _hang(job, s, views, 0, t0 + 300) is None and _hang_due(job, s, views, 0, t0 + 300) == t0 + 360
    # The same record again (no new batch) is no progress: the evaluation stalled at t0+300.
    now[0] = t0 + 330
    job._apply({"0": ProgressRecord(time=now[0], attempt=t0, step=100, phase=PHASE_EVALUATING, heartbeat=t0 + 300)})
    hang = _hang(job, s, views, 0, t0 + 360)
    assert hang is not None and "evaluation batch" in hang.message and hang.stepped


def test_the_final_save_pauses_the_operators_check_for_the_first_step_allowance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = spec(**{"faultTolerance.progressTimeoutSeconds": 60, "faultTolerance.firstStepTimeoutSeconds": 600})
    t0, now = 1_000_000.0, [1_000_000.0]
    views = [pod(0), pod(1)]
    job = _stepped_follower(monkeypatch, now)
    assert _hang(job, s, views, 0, t0) is None
    now[0] = t0 + 101  # the last step's record, then the final save begins (published at once)
    job._apply({"0": ProgressRecord(time=now[0], attempt=t0, step=100, phase=PHASE_SAVING, heartbeat=now[0])})
    assert _hang(job, s, views, 0, t0 + 400) is None  # a slow disk is no hang ...
    assert _hang_due(job, s, views, 0, t0 + 400) == t0 + 701
    hang = _hang(job, s, views, 0, t0 + 701)  # ... but a save that never ends is one
    assert hang is not None and "final checkpoint save" in hang.message and "firstStepTimeoutSeconds" in hang.message
    # A new attempt (the ranks restarted) is training again: the pause is over.
    now[0] = t0 + 702
    job._apply({"0": ProgressRecord(time=now[0], attempt=now[0], step=100, resumed_from=100)})
    assert job.saving is None


def test_the_final_save_allowance_is_never_shorter_than_the_progress_timeout() -> None:
    clock = ProgressClock(running_since=100.0, last_step_seen=150.0, saving_since=151.0)
    assert progress_hang_due(clock, 60, 600) == 751.0
    assert progress_hang_due(clock, 900, 600) == 1051.0
    hang = progress_hang(clock, 1051.0, 900, 600)
    assert hang is not None and "progressTimeoutSeconds is 900" in hang.message
    # A save of an earlier group (before the ranks restarted in place) pauses nothing.
    assert progress_hang_due(ProgressClock(100.0, 150.0, 160.0, saving_since=151.0), 60, 600) == 760.0


WATCHED = watched_job(timeout=60, first=600)  # progressTimeoutSeconds 60, firstStepTimeoutSeconds 600


def test_the_prometheus_check_counts_evaluation_batches_and_pauses_for_the_final_save() -> None:
    def sample(metric_value: float, replica: int) -> Sample:
        return Sample({"namespace": "ml", "job": "train", "replica": str(replica), "rank": str(replica)},
                      metric_value, 0.0)

    # Steps until 100, then evaluation batches until 290 (the progress gauge) : no hang at 360.
    progress = parse_progress([sample(290.0, 0), sample(290.0, 1)])
    assert find_hangs([WATCHED], progress, now=360, allowance=15) == []
    assert len(find_hangs([WATCHED], progress, now=366, allowance=15)) == 1
    # The final save began at 101, just after the last step: paused until 101 + firstStepTimeoutSeconds.
    saving = parse_progress([sample(100.0, 0), sample(100.0, 1)], [sample(101.0, 0), sample(101.0, 1)])
    assert find_hangs([WATCHED], saving, now=700, allowance=15) == []
    found = find_hangs([WATCHED], saving, now=717, allowance=15)
    assert len(found) == 1
    # A save of an earlier incarnation (older than the last progress) pauses nothing.
    old = parse_progress([sample(300.0, 0), sample(300.0, 1)], [sample(101.0, 0), sample(101.0, 1)])
    assert len(find_hangs([WATCHED], old, now=376, allowance=15)) == 1
    assert "flywheel_train_last_progress_timestamp_seconds" in progress_query(3600)
    assert "flywheel_train_last_step_timestamp_seconds" in progress_query(3600)  # a user script's steps


def test_the_prometheus_check_gives_a_rank_restarted_in_place_the_first_step_allowance() -> None:
    """The agent restarts a rank in place: same pod, same series, a new process. Its last progress is the old
    process's; from its start it gets firstStepTimeoutSeconds (600 here) to restore and step, not
    progressTimeoutSeconds (60) from the last step."""
    def sample(value: float, replica: int) -> Sample:
        return Sample({"namespace": "ml", "job": "train", "replica": str(replica), "rank": str(replica)}, value, 0.0)

    restarted = parse_progress([sample(1000.0, 0), sample(1000.0, 1)], [], [sample(1020.0, 0), sample(1010.0, 1)])
    assert find_hangs([WATCHED], restarted, now=1500, allowance=15) == []
    [found] = find_hangs([WATCHED], restarted, now=1626, allowance=15)
    assert [r.replica for r in found.ranks] == ["1"]
    # Its first step ends the allowance: the usual progressTimeoutSeconds from then on.
    stepped = parse_progress([sample(1400.0, 0), sample(1400.0, 1)], [], [sample(1020.0, 0), sample(1010.0, 1)])
    assert len(find_hangs([WATCHED], stepped, now=1476, allowance=15)) == 1
    assert "flywheel_train_started_timestamp_seconds" in process_start_query(3600)


def test_a_user_script_rank_restarted_in_place_gets_the_allowance_from_its_agents_report() -> None:
    """A user script's rank exports nothing until its first step, so no start gauge tells of its new process: the
    agent's report of the restart (the pod's etcd liveness key, `ranks_restarted_at`) gives it the allowance."""
    def sample(value: float, replica: int) -> Sample:
        return Sample({"namespace": "ml", "job": "train", "replica": str(replica), "rank": str(replica)}, value, 0.0)

    old_steps = parse_progress([sample(1000.0, 0), sample(1000.0, 1)])  # the previous processes' last steps
    job = WATCHED
    job = replace(job, pods=tuple(replace(p, ranks_restarted_at=1020.0 - 10 * i) for i, p in enumerate(job.pods)))
    assert len(find_hangs([WATCHED], old_steps, now=1500, allowance=15)) == 1  # without the report: hung
    assert find_hangs([job], old_steps, now=1500, allowance=15) == []
    [found] = find_hangs([job], old_steps, now=1626, allowance=15)
    assert [r.replica for r in found.ranks] == ["1"]


def test_a_restart_the_operator_decided_gives_the_allowance_before_any_agent_reports_it() -> None:
    """A hang answered in place keeps the pods: until the agents' reports of restarting their ranks (and the new
    processes' gauges) reach the monitor, Prometheus still shows the hung processes' last steps. The restart's own
    time (status.lastRestartTime) starts the first-step allowance: seen Running again before those reports, the job
    was found hung a second time (a second restart, once, under load in tests/monitoring/test_hang_end_to_end)."""
    def sample(value: float, replica: int) -> Sample:
        return Sample({"namespace": "ml", "job": "train", "replica": str(replica), "rank": str(replica)}, value, 0.0)

    old_steps = parse_progress([sample(1000.0, 0), sample(1000.0, 1)])
    assert len(find_hangs([WATCHED], old_steps, now=1100, allowance=15)) == 1  # without the restart's time
    job = replace(WATCHED, restarted_at=1080.0)
    assert find_hangs([job], old_steps, now=1100, allowance=15) == []
    assert find_hangs([job], old_steps, now=1080 + 600 + 14, allowance=15) == []
    assert len(find_hangs([job], old_steps, now=1080 + 600 + 16, allowance=15)) == 1  # no step by then: hung


def test_the_trainer_gauges_say_what_the_prometheus_check_reads() -> None:
    m = TrainerMetrics(0, {"job": "train", "namespace": "ml", "replica": "0", "rank": "0"})
    labels = {"job": "train", "namespace": "ml", "replica": "0", "rank": "0"}

    def value(name: str) -> float | None:
        return m.registry.get_sample_value(name, labels)

    m.record_step(loss=1.0, step_seconds=0.5, tokens_per_second=10.0, timestamp=100.0)
    m.record_eval_batch(timestamp=150.0)
    assert value("flywheel_train_last_step_timestamp_seconds") == 100.0
    assert value("flywheel_train_last_progress_timestamp_seconds") == 150.0
    assert value("flywheel_train_final_save_started_timestamp_seconds") == 0.0
    m.record_final_save(timestamp=160.0)
    assert value("flywheel_train_final_save_started_timestamp_seconds") == 160.0
    # The process's start, not the metrics' (a user script builds them at its first step).
    started = value("flywheel_train_started_timestamp_seconds")
    [process_start] = [s.value for family in PROCESS_COLLECTOR.collect() for s in family.samples
                       if s.name == "process_start_time_seconds"]  # prometheus_client's own reading
    assert started is not None and abs(started - process_start) < 1 and started < time.time() - 0.5
