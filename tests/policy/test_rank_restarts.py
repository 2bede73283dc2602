"""Rank restarts in place (reported by the agents through their etcd liveness keys) count in status.restarts once
each, without changing the worker generation (policy/rank_restarts.py)."""

from __future__ import annotations

from typing import Any

import pytest

from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreatePod, DeletePod, Relabel
from flywheel.policy.failure_decision import decide_failure
from flywheel.policy.failures import FailureKind
from flywheel.policy.observed import ObservedProgress
from flywheel.policy.rank_restarts import (
    CAUSE_WAIT_SECONDS,
    SAME_RECOVERY_SECONDS,
    begin_generation,
    consequence_window,
    count_rank_restarts,
)
from flywheel.spec.status import Phase, TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spec, view

REASON = "rank 1: exit code 1 (Crash)"


def _running(**fields: Any) -> TrainingJobStatus:
    return TrainingJobStatus(phase=Phase.RUNNING, **fields)


def test_a_reported_rank_restart_counts_once_with_its_reason_and_an_event() -> None:
    status = _running()
    events = count_rank_restarts(status, [pod(0), pod(1, rank_restarts=1, rank_restart_reason=REASON)], 0)
    assert status.restarts == 1 and status.last_restart_reason == R.RESTART_RANK
    assert status.rank_restarts == {"u1-0": 1} and status.generation == 0
    assert len(events) == 1 and REASON in events[0].message and events[0].reason == R.RESTART_RANK
    again = count_rank_restarts(status, [pod(0), pod(1, rank_restarts=1, rank_restart_reason=REASON)], 0)
    assert status.restarts == 1 and not again  # the same report on a later pass adds nothing


CAUSE = "rank 1: killed by SIGKILL"
CONSEQUENCE = "rank 0: exit code 5 (collective-timeout)"
SCRIPT_CRASH = "rank 0: exit code 1 (crash)"  # a user script's collective raised on its lost peer


def test_a_peers_consequence_reported_first_waits_so_the_recovery_is_named_by_its_cause() -> None:
    status = _running()
    peer = pod(0, rank_restarts=1, rank_restart_reason=CONSEQUENCE, rank_restart_at=NOW)
    assert not count_rank_restarts(status, [peer, pod(1)], 0, NOW + 1)  # the cause's report may still come
    assert status.restarts == 0 and not status.rank_restarts
    cause = pod(1, rank_restarts=1, rank_restart_reason=CAUSE, rank_restart_at=NOW + 0.5)
    events = count_rank_restarts(status, [peer, cause], 0, NOW + 2)
    assert status.restarts == 1 and status.rank_restarts == {"u0-0": 1, "u1-0": 1}
    assert len(events) == 1 and CAUSE in events[0].message


def test_a_consequence_whose_cause_never_reports_counts_after_the_wait() -> None:
    status = _running()
    peer = pod(0, rank_restarts=1, rank_restart_reason=CONSEQUENCE, rank_restart_at=NOW)
    assert not count_rank_restarts(status, [peer], 0, NOW + CAUSE_WAIT_SECONDS - 0.1)
    events = count_rank_restarts(status, [peer], 0, NOW + CAUSE_WAIT_SECONDS)
    assert status.restarts == 1 and len(events) == 1 and CONSEQUENCE in events[0].message


@pytest.mark.parametrize("earlier", [CONSEQUENCE, SCRIPT_CRASH])
def test_in_one_pass_the_cause_is_taken_before_an_earlier_consequence_or_plain_crash(earlier: str) -> None:
    status = _running()
    events = count_rank_restarts(status, [
        pod(0, rank_restarts=1, rank_restart_reason=earlier, rank_restart_at=NOW),
        pod(1, rank_restarts=1, rank_restart_reason=CAUSE, rank_restart_at=NOW + 0.2)], 0, NOW + 10)
    assert status.restarts == 1 and len(events) == 1 and CAUSE in events[0].message


def test_a_scripts_plain_crash_counts_at_once_and_the_killed_ranks_later_echo_names_the_cause() -> None:
    status = _running()
    crash = pod(0, rank_restarts=1, rank_restart_reason=SCRIPT_CRASH, rank_restart_at=NOW)
    first = count_rank_restarts(status, [crash, pod(1)], 0, NOW + 0.1)
    assert status.restarts == 1 and len(first) == 1 and SCRIPT_CRASH in first[0].message
    cause = pod(1, rank_restarts=1, rank_restart_reason=CAUSE, rank_restart_at=NOW + 0.5)
    events = count_rank_restarts(status, [crash, cause], 0, NOW + 2)
    assert status.restarts == 1 and status.rank_restarts == {"u0-0": 1, "u1-0": 1}  # one recovery
    assert len(events) == 1 and CAUSE in events[0].message and events[0].reason == R.RESTART_RANK
    assert not count_rank_restarts(status, [crash, cause], 0, NOW + 3)


def test_an_echo_that_says_no_more_than_the_counted_report_gets_no_event() -> None:
    status = _running()
    count_rank_restarts(status, [pod(0, rank_restarts=1, rank_restart_reason=CAUSE, rank_restart_at=NOW), pod(1)],
                        0, NOW + 0.1)
    later = [pod(0, rank_restarts=1, rank_restart_reason=CAUSE, rank_restart_at=NOW),
             pod(1, rank_restarts=1, rank_restart_reason=SCRIPT_CRASH, rank_restart_at=NOW + 0.3)]
    assert not count_rank_restarts(status, later, 0, NOW + 1) and status.restarts == 1


def test_only_the_growth_since_the_recorded_count_is_added_and_a_lower_report_adds_nothing() -> None:
    status = _running(restarts=2, worker_generation=1, rank_restarts={"u1-1": 1})
    count_rank_restarts(status, [pod(0, generation=1), pod(1, generation=1, rank_restarts=3)], 1)
    assert status.restarts == 4 and status.rank_restarts == {"u1-1": 3}
    count_rank_restarts(status, [pod(0, generation=1), pod(1, generation=1, rank_restarts=0)], 1)
    assert status.restarts == 4 and status.rank_restarts == {"u1-1": 3}  # monotonic


def test_the_record_survives_in_the_status_so_a_restarted_operator_does_not_count_again() -> None:
    status = _running()
    count_rank_restarts(status, [pod(0, rank_restarts=2)], 0)
    reread = TrainingJobStatus.model_validate(status.to_json())  # what a new operator process reads
    count_rank_restarts(reread, [pod(0, rank_restarts=2)], 0)
    assert reread.restarts == 2 and reread.generation == 0 and reread.to_json()["rankRestarts"] == {"u0-0": 2}


def test_the_record_is_pruned_to_the_pods_observed() -> None:
    status = _running(rank_restarts={"gone": 4, "u0-0": 1})
    count_rank_restarts(status, [pod(0, rank_restarts=1)], 0)
    assert status.rank_restarts == {"u0-0": 1} and status.restarts == 0


def test_an_older_generation_or_deleting_pod_is_recorded_but_not_counted() -> None:
    status = _running(restarts=1, worker_generation=1, last_restart_reason=R.RESTART_HUNG)
    count_rank_restarts(status, [pod(0, generation=0, rank_restarts=1), pod(1, generation=1, rank_restarts=1,
                                                                          deleting_since=NOW)], 1)
    assert status.restarts == 1 and status.last_restart_reason == R.RESTART_HUNG
    assert status.rank_restarts == {"u0-0": 1, "u1-1": 1}


def test_no_report_leaves_the_status_untouched_so_nothing_is_written() -> None:
    status = TrainingJobStatus.model_validate({"phase": "Running", "restarts": 3})
    count_rank_restarts(status, [pod(0, generation=3), pod(1, generation=3)], 3)
    assert status.to_json() == {"phase": "Running", "restarts": 3}


def test_rank_restarts_do_not_change_the_generation_so_the_running_pods_are_kept() -> None:
    s = spec()
    first = reconcile(s, None, _running(), [pod(0), pod(1)], ObservedProgress(), NOW)
    out = reconcile(s, None, first.status, [pod(0), pod(1, rank_restarts=1)], ObservedProgress(), NOW + 1)
    assert out.status.restarts == 1 and out.status.generation == 0 and out.status.phase is Phase.RUNNING
    assert not [a for a in out.actions if isinstance(a, (DeletePod, CreatePod, Relabel))]
    later = reconcile(s, None, out.status, [pod(0), pod(1, rank_restarts=1)], ObservedProgress(), NOW + 2)
    assert later.status.restarts == 1 and not later.actions


def test_a_decided_restart_after_rank_restarts_bumps_the_generation_not_to_restarts_plus_one() -> None:
    status = _running(restarts=3, worker_generation=1)
    out = decide_failure(fresh(**status.model_dump()), view(spec(), [pod(0, generation=1),
                                                                     pod(1, "Failed", generation=1, exit_code=1)],
                                                            generation=1))
    assert out is not None and out.status.restarts == 4 and out.status.generation == 2
    assert DeletePod("j-worker-1", "u1-1") in out.actions  # the current generation's pods: decided, not older


def test_a_status_written_before_worker_generation_reads_restarts_as_the_generation() -> None:
    old = TrainingJobStatus.model_validate({"phase": "Running", "restarts": 2})
    assert old.generation == 2
    count_rank_restarts(old, [pod(0, generation=2, rank_restarts=1)], 2)
    assert old.restarts == 3 and old.generation == 2  # pinned before restarts moved away from it


def test_the_peers_rank_restarts_of_one_recovery_count_once() -> None:
    """Rank 1 is killed; rank 0's collective fails with it a moment later and its agent restarts it too."""
    status = _running()
    killed = pod(1, rank_restarts=1, rank_restart_at=NOW, rank_restart_reason="rank 1: killed by SIGKILL")
    count_rank_restarts(status, [pod(0), killed], 0)
    peer = pod(0, rank_restarts=1, rank_restart_at=NOW + 0.1, rank_restart_reason="rank 0: exit code 5")
    events = count_rank_restarts(status, [peer, killed], 0)
    assert status.restarts == 1 and not events and status.rank_restarts == {"u0-0": 1, "u1-0": 1}
    both_at_once = _running()  # the same, seen in one pass
    assert len(count_rank_restarts(both_at_once, [peer, killed], 0)) == 1 and both_at_once.restarts == 1


def test_a_rank_restart_after_the_window_is_a_new_recovery() -> None:
    status = _running()
    count_rank_restarts(status, [pod(0), pod(1, rank_restarts=1, rank_restart_at=NOW)], 0)
    later = NOW + SAME_RECOVERY_SECONDS + 1
    count_rank_restarts(status, [pod(0, rank_restarts=1, rank_restart_at=later), pod(1, rank_restarts=1)], 0)
    assert status.restarts == 2


def test_a_survivor_s_rank_restart_after_a_decided_pod_replacement_is_the_same_recovery() -> None:
    s = spec()
    first = reconcile(s, None, _running(), [pod(0), pod(1)], ObservedProgress(), NOW)
    deleted = reconcile(s, None, first.status, [pod(0), pod(1, deleting_since=NOW)], ObservedProgress(), NOW + 1)
    assert deleted.status.restarts == 1 and deleted.status.last_restart_reason == R.RESTART_POD_DELETED
    survivor = pod(0, generation=1, rank_restarts=1, rank_restart_at=NOW + 3)
    out = reconcile(s, None, deleted.status, [survivor, pod(1, deleting_since=NOW)], ObservedProgress(), NOW + 4)
    assert out.status.restarts == 1 and out.status.last_restart_reason == R.RESTART_POD_DELETED


def test_a_decided_restart_right_after_a_counted_rank_restart_renames_it_instead_of_counting_again() -> None:
    status = _running()
    count_rank_restarts(status, [pod(0, rank_restarts=1, rank_restart_at=NOW), pod(1)], 0)
    out = decide_failure(fresh(**status.model_dump()), view(spec(), [pod(0), pod(1, "Failed", exit_code=1)],
                                                            now=NOW + 2))
    assert out is not None and out.status.restarts == 1 and out.status.generation == 1
    assert out.status.last_restart_reason == "Crash"


def test_a_killed_pod_reported_long_after_its_peers_consequence_is_that_one_recovery() -> None:
    """Worker 1 is killed at NOW; worker 0's collective times out on it 20 s later and its report, waiting in vain
    for a cause's, is counted. The kill reaches the operator 40 s after that (a loaded node's kubelet): its pod
    ended before the consequence, within the collective's window, so it renames that recovery rather than counting
    a second. A pod that ended long before the consequence is a recovery of its own."""
    s = spec(**{"faultTolerance.progressTimeoutSeconds": 30})
    status = _running()
    survivor = pod(0, rank_restarts=1, rank_restart_reason=CONSEQUENCE, rank_restart_at=NOW + 20)
    count_rank_restarts(status, [survivor, pod(1)], 0, NOW + 26)
    assert status.restarts == 1 and status.last_restart_reason == R.RESTART_RANK
    killed = pod(1, "Failed", exit_code=137, finished_at=NOW)
    out = decide_failure(fresh(**status.model_dump()), view(s, [survivor, killed], now=NOW + 60))
    assert out is not None and out.status.restarts == 1 and out.status.last_restart_reason == "Killed"
    earlier = pod(1, "Failed", exit_code=137, finished_at=NOW - 100)
    out = decide_failure(fresh(**status.model_dump()), view(s, [survivor, earlier], now=NOW + 60))
    assert out is not None and out.status.restarts == 2


def test_the_same_pods_rapid_rank_restarts_each_count() -> None:
    """One agent restarts its crashed rank five times (a flaky GPU), each report seen by its own pass: every one is a
    new recovery, however soon after the last; only a peer's first report is an echo."""
    status = _running()
    for k, dt in enumerate((0, 10, 20, 45, 50), start=1):
        flaky = pod(0, rank_restarts=k, rank_restart_reason=REASON, rank_restart_at=NOW + dt)
        assert len(count_rank_restarts(status, [flaky, pod(1)], 0, NOW + dt + 1)) == 1
    assert status.restarts == 5 and status.rank_restart_reporters == ["u0-0"]
    # Its peer's collective failed with the last one: that peer's first report is the same recovery.
    peer = pod(1, rank_restarts=1, rank_restart_reason=CONSEQUENCE, rank_restart_at=NOW + 50.1)
    assert not count_rank_restarts(status, [flaky, peer], 0, NOW + 52) and status.restarts == 5
    assert status.rank_restart_reporters == ["u0-0", "u1-0"]
    # The peer's next restart is its own.
    again = pod(1, rank_restarts=2, rank_restart_reason=REASON, rank_restart_at=NOW + 55)
    assert len(count_rank_restarts(status, [flaky, again], 0, NOW + 56)) == 1 and status.restarts == 6


def test_the_reporters_are_kept_in_the_status_and_a_decided_restart_clears_them() -> None:
    status = _running()
    count_rank_restarts(status, [pod(0, rank_restarts=1, rank_restart_at=NOW), pod(1)], 0)
    assert status.to_json()["rankRestartReporters"] == ["u0-0"]
    restored = TrainingJobStatus.model_validate(status.to_json())  # a restarted operator reads it back
    count_rank_restarts(restored, [pod(0, rank_restarts=2, rank_restart_at=NOW + 5), pod(1)], 0)
    assert restored.restarts == 2
    out = decide_failure(fresh(**restored.model_dump()), view(spec(), [pod(0), pod(1, "Failed", exit_code=1)],
                                                              now=NOW + 100))
    assert out is not None and out.status.rank_restart_reporters == []


def test_a_survivors_collective_timeout_after_a_shrink_is_that_recovery() -> None:
    """An elastic job loses a node: the Shrink is decided and counted; the survivors' collectives time out
    0.8 x progressTimeoutSeconds later (48 s, past SAME_RECOVERY_SECONDS) and their agents restart their ranks."""
    s = spec(**{"replicas.min": 2, "replicas.max": 4, "replicas.target": 3, "trainer.training.globalBatch": 24})
    assert consequence_window(s.fault_tolerance) == 48.0 + SAME_RECOVERY_SECONDS
    decided = reconcile(s, None, _running(), [pod(0), pod(1), pod(2, node_lost=True)], ObservedProgress(step=100),
                        NOW + 3)
    assert decided.status.restarts == 1 and decided.status.last_restart_reason == FailureKind.NODE_LOST
    survivors = [pod(i, generation=1, rank_restarts=1, rank_restart_at=NOW + 51 + i * 0.1,
                     rank_restart_reason=f"rank {i}: exit code 5 (collective-timeout)") for i in (0, 1)]
    status = decided.status
    for now in (NOW + 52, NOW + 57):
        out = reconcile(s, None, status, [*survivors, pod(2, "Pending", generation=1)], ObservedProgress(step=100),
                        now)
        status = out.status
        assert status.restarts == 1 and status.last_restart_reason == FailureKind.NODE_LOST
        assert not [e for e in out.events if e.reason == R.RESTART_RANK]
    # A survivor's second restart, or a crash of its own (not a consequence), is a new recovery.
    crash = pod(0, generation=1, rank_restarts=2, rank_restart_at=NOW + 60, rank_restart_reason=REASON)
    out = reconcile(s, None, status, [crash, survivors[1], pod(2, "Pending", generation=1)],
                    ObservedProgress(step=100), NOW + 61)
    assert out.status.restarts == 2 and out.status.last_restart_reason == R.RESTART_RANK


def test_a_consequence_long_after_a_decided_restart_is_a_new_recovery() -> None:
    status = _running()
    begin_generation(status, 1, NOW)
    status.last_restart_reason = FailureKind.NODE_LOST
    late = pod(0, generation=1, rank_restarts=1, rank_restart_at=NOW + 79, rank_restart_reason=CONSEQUENCE)
    count_rank_restarts(status, [late], 1, NOW + 90, window=78.0)
    assert status.restarts == 2 and status.last_restart_reason == R.RESTART_RANK


def test_a_crash_loop_before_training_resumes_is_one_recovery() -> None:
    """An agent restarting ranks that fail again before any step (an import error, a missing file) reports each
    restart; while no step is trained since the recovery began, they are that one interruption, even when several
    come between two passes. Once the group trains again, the pod's next restart is a new recovery."""
    status = _running()
    assert len(count_rank_restarts(status, [pod(0, rank_restarts=1, rank_restart_reason=REASON,
                                                rank_restart_at=NOW), pod(1)], 0, NOW + 1, stalled=True)) == 1
    for k, dt in ((2, 40), (3, 80), (6, 200)):  # past SAME_RECOVERY_SECONDS; 6: three restarts seen at once
        looping = pod(0, rank_restarts=k, rank_restart_reason=REASON, rank_restart_at=NOW + dt)
        assert not count_rank_restarts(status, [looping, pod(1)], 0, NOW + dt + 1, stalled=True)
    assert status.restarts == 1 and status.rank_restarts == {"u0-0": 6}
    trained = pod(0, rank_restarts=7, rank_restart_reason=REASON, rank_restart_at=NOW + 300)
    assert len(count_rank_restarts(status, [trained, pod(1)], 0, NOW + 301, stalled=False)) == 1
    assert status.restarts == 2
