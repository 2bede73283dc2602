"""Hung jobs, stragglers and the combined evaluation (pure)."""

from __future__ import annotations

from dataclasses import replace

from flywheel.policy.health_checks import (
    HealthSettings,
    HealthState,
    Observations,
    RankProgress,
    RankStepTime,
    evaluate,
    find_hangs,
    update_stragglers,
)
from flywheel.policy.xid import XidSample
from tests.builders import watched_job

NS = "ml"
SETTINGS = HealthSettings(staleness_allowance_seconds=1.0, straggler_factor=1.5, straggler_evaluations=3)


def prog(replica: int, ts: float, name: str = "train", rank: int | None = None) -> RankProgress:
    return RankProgress(NS, name, str(replica), str(replica if rank is None else rank), ts)


def test_progressing_job_is_not_hung() -> None:
    assert find_hangs([watched_job()], [prog(0, 995), prog(1, 996)], now=1000, allowance=1) == []


def test_rank_without_progress_past_timeout_plus_allowance_is_hung() -> None:
    j = watched_job()
    assert find_hangs([j], [prog(0, 989.5), prog(1, 999)], now=1000, allowance=1) == []  # 10.5 s: within allowance
    found = find_hangs([j], [prog(0, 988), prog(1, 999)], now=1000, allowance=1)
    assert len(found) == 1
    h = found[0]
    assert (h.namespace, h.job) == (NS, "train")
    assert [(r.replica, r.rank, r.idle_seconds) for r in h.ranks] == [("0", "0", 12)]
    assert h.idle_seconds == 12 and "replica 0 rank 0" in h.message and "progressTimeoutSeconds=10" in h.message


def test_every_stalled_rank_is_named() -> None:
    found = find_hangs([watched_job()], [prog(0, 900), prog(1, 950)], now=1000, allowance=1)
    assert [r.replica for r in found[0].ranks] == ["0", "1"]
    assert found[0].idle_seconds == 100


def test_not_stepped_since_pod_start_gets_the_first_step_allowance() -> None:
    j = watched_job(started=950, first=100)  # restarted at 950; last step from the previous incarnation
    assert find_hangs([j], [prog(0, 900), prog(1, 900)], now=1000, allowance=1) == []
    assert len(find_hangs([j], [prog(0, 900), prog(1, 900)], now=1052, allowance=1)) == 1


def test_stepped_since_start_uses_the_progress_timeout() -> None:
    j = watched_job(started=950, first=100)
    assert len(find_hangs([j], [prog(0, 960), prog(1, 995)], now=1000, allowance=1)) == 1


def test_no_verdict_unless_every_pod_runs() -> None:
    j = watched_job()
    pending = replace(j, pods=(j.pods[0], replace(j.pods[1], phase="Pending")))
    assert find_hangs([pending], [prog(0, 0), prog(1, 0)], now=1000, allowance=1) == []
    assert find_hangs([replace(j, pods=())], [prog(0, 0)], now=1000, allowance=1) == []


def test_zero_timeout_disables() -> None:
    assert find_hangs([watched_job(timeout=0)], [prog(0, 0), prog(1, 0)], now=1000, allowance=1) == []


def test_other_jobs_and_scaled_away_replicas_do_not_count() -> None:
    stale = [prog(5, 0), prog(0, 0, name="other"), RankProgress("elsewhere", "train", "0", "0", 0)]
    assert find_hangs([watched_job()], stale + [prog(0, 999), prog(1, 999)], now=1000, allowance=1) == []


def test_silent_replica_among_exporting_peers_is_stalled_after_first_step_allowance() -> None:
    j = watched_job(started=0, first=100)
    assert find_hangs([j], [prog(0, 999)], now=100, allowance=1) == []
    found = find_hangs([j], [prog(0, 999)], now=1000, allowance=1)
    assert [(r.replica, r.rank, r.last_step_timestamp) for r in found[0].ranks] == [("1", "", None)]
    assert "(no metrics)" in found[0].message


def test_job_without_any_series_is_not_judged() -> None:
    assert find_hangs([watched_job()], [], now=10_000, allowance=1) == []


def st(replica: int, seconds: float, name: str = "train") -> RankStepTime:
    return RankStepTime(NS, name, str(replica), str(replica), seconds)


def test_straggler_needs_consecutive_evaluations() -> None:
    times = [st(0, 1.0), st(1, 1.1), st(2, 0.9), st(3, 2.0)]
    streaks: dict = {}
    for i in range(3):
        slow, streaks = update_stragglers(times, streaks, factor=1.5, evaluations=3)
        assert bool(slow[(NS, "train")]) == (i == 2)
    assert [(s.replica, round(s.ratio, 2)) for s in slow[(NS, "train")]] == [("3", 2.0)]
    slow, streaks = update_stragglers([st(0, 1), st(1, 1), st(2, 1), st(3, 1.2)], streaks, factor=1.5, evaluations=3)
    assert slow[(NS, "train")] == () and streaks[(NS, "train", "3", "3")] == 0  # one fast evaluation resets it


def test_factor_is_strict_and_median_excludes_self() -> None:
    slow, streaks = update_stragglers([st(0, 1.0), st(1, 1.5)], {}, factor=1.5, evaluations=1)
    assert slow[(NS, "train")] == ()
    slow, _ = update_stragglers([st(0, 1.0), st(1, 1.51)], {}, factor=1.5, evaluations=1)
    assert [s.replica for s in slow[(NS, "train")]] == ["1"]


def test_single_rank_and_zero_step_times_are_not_judged() -> None:
    slow, streaks = update_stragglers([st(0, 5.0), st(0, 1.0, name="solo"), st(1, 0.0)], {}, factor=1.5,
                                      evaluations=1)
    assert slow.get((NS, "solo"), ()) == () and streaks == {}


def obs(now: float, jobs, progress=(), step_times=(), xids=()) -> Observations:
    return Observations(now, list(jobs), None if progress is None else list(progress),
                        None if step_times is None else list(step_times), None if xids is None else list(xids))


def test_hang_is_reported_once_per_episode() -> None:
    j = watched_job()
    d, state = evaluate(obs(1000, [j], [prog(0, 900), prog(1, 999)]), HealthState(), SETTINGS)
    assert len(d.hangs) == 1
    d, state = evaluate(obs(1001, [j], [prog(0, 900), prog(1, 999)]), state, SETTINGS)
    assert d.hangs == ()
    d, state = evaluate(obs(1002, [j], [prog(0, 1001), prog(1, 1001)]), state, SETTINGS)  # recovered
    assert d.hangs == () and state.reported_hangs == frozenset()
    d, _ = evaluate(obs(1100, [j], [prog(0, 1001), prog(1, 1001)]), state, SETTINGS)  # hung again: a new episode
    assert len(d.hangs) == 1


def test_forgotten_hang_is_reported_again() -> None:
    j = watched_job()
    d, state = evaluate(obs(1000, [j], [prog(0, 900)]), HealthState(), SETTINGS)
    d, _ = evaluate(obs(1001, [j], [prog(0, 900)]), state.forget_hang((NS, "train")), SETTINGS)
    assert len(d.hangs) == 1


def test_failed_queries_skip_their_check_and_keep_memory() -> None:
    j = watched_job()
    _, state = evaluate(obs(1000, [j], [prog(0, 900)], xids=[XidSample("node-0", "G", 13)]), HealthState(), SETTINGS)
    d, kept = evaluate(obs(1001, [j], None, None, None), state, SETTINGS)
    assert d.hangs == () and d.rank_restarts == () and d.degradations == ()
    assert kept.reported_hangs == state.reported_hangs and kept.xid_codes == state.xid_codes


def test_first_xid_answer_is_a_baseline_then_changes_act() -> None:
    j = watched_job()
    d, state = evaluate(obs(0, [j], xids=[XidSample("node-0", "G", 13)]), HealthState(), SETTINGS)
    assert d.rank_restarts == ()
    d, state = evaluate(obs(1, [j], xids=[XidSample("node-0", "G", 31)]), state, SETTINGS)
    assert [r.pods for r in d.rank_restarts] == [("train-worker-0",)]
    d, _ = evaluate(obs(2, [j], xids=[XidSample("node-1", "G", 79)]), state, SETTINGS)
    assert [(f.node, [p.name for p in f.pods]) for f in d.node_faults] == [("node-1", ["train-worker-1"])]


def test_xids_only_touch_running_jobs() -> None:
    done = watched_job(phase="Succeeded")
    d, _ = evaluate(obs(0, [done], xids=[XidSample("node-0", "G", 79)]), HealthState(), SETTINGS)
    assert d.node_faults == () and len(d.notices) == 1


def test_degraded_on_and_off_once_each() -> None:
    j = watched_job(3)
    slow = [st(0, 1), st(1, 1), st(2, 3)]
    state = HealthState()
    changes = []
    for i in range(5):
        d, state = evaluate(obs(i, [j], step_times=slow), state, SETTINGS)
        changes += d.degradations
        assert d.stragglers == {(NS, "train"): 1 if i >= 2 else 0}
    assert [(c.degraded, [s.replica for s in c.stragglers]) for c in changes] == [(True, ["2"])]
    assert "replica 2 rank 2" in changes[0].message
    d, state = evaluate(obs(9, [j], step_times=[st(0, 1), st(1, 1), st(2, 1)]), state, SETTINGS)
    assert [(c.degraded, c.stragglers) for c in d.degradations] == [(False, ())]
    d, _ = evaluate(obs(10, [j], step_times=[st(0, 1), st(1, 1), st(2, 1)]), state, SETTINGS)
    assert d.degradations == ()


def test_jobs_that_stop_being_watched_are_forgotten() -> None:
    j = watched_job(3)
    state = HealthState()
    for i in range(3):
        slow = [st(0, 1), st(1, 1), st(2, 3)]
        _, state = evaluate(obs(200 + i, [j], [prog(0, 150)], step_times=slow), state, SETTINGS)
    assert state.degraded and state.reported_hangs and state.straggler_streaks
    d, state = evaluate(obs(4, [replace(j, phase="Succeeded")], [], step_times=[]), state, SETTINGS)
    assert not state.degraded and not state.reported_hangs and not state.straggler_streaks
    assert d.degradations == ()
