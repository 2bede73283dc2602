"""When a pass is next due with nothing else changed (policy/due.py): for each time-based rule, the pass just
before `next_due` decides nothing new and the pass at `next_due` decides it."""

from __future__ import annotations

from typing import Any

from flywheel.policy import reasons as R
from flywheel.policy.conditions import iso, set_condition
from flywheel.policy.decisions import DeleteJob, DeletePod, Pass
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.rank_restarts import CAUSE_WAIT_SECONDS
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus
from tests.builders import NOW, pod, reconcile, spec

EPSILON = 0.01


def run(s: TrainingJobSpec, status: TrainingJobStatus, pods: list[PodView], now: float) -> Pass:
    return reconcile(s, None, status, pods, ObservedProgress(), now)


def settled(s: TrainingJobSpec, pods: list[PodView], status: TrainingJobStatus | None = None) -> Pass:
    """The pass at NOW after a first one at NOW wrote its status (as the executor writes it back)."""
    first = run(s, status or TrainingJobStatus(), pods, NOW)
    return run(s, first.status, pods, NOW)


def decided(p: Pass) -> tuple[Any, ...]:
    return p.status.to_json(), p.actions, p.events


def check_due(s: TrainingJobSpec, pods: list[PodView], due: float, status: TrainingJobStatus | None = None) -> Pass:
    """Asserts `due` is the next due time, nothing new is decided just before it; returns the pass at it."""
    last = settled(s, pods, status)
    assert last.next_due == due
    before = run(s, last.status, pods, due - EPSILON)
    assert decided(before) == decided(last)
    at = run(s, last.status, pods, due)
    assert decided(at) != decided(last)
    return at


def test_nothing_time_based_means_no_due_time() -> None:
    assert settled(spec(), [pod(0), pod(1)]).next_due is None


def test_the_active_deadline_is_due_from_the_created_condition() -> None:
    s = spec(**{"runPolicy.activeDeadlineSeconds": 50})
    at = check_due(s, [pod(0), pod(1)], NOW + 50)
    assert at.status.phase is Phase.FAILED and at.status.conditions[-1].reason == R.DEADLINE


def test_the_ttl_after_finish_is_due_from_the_finished_condition() -> None:
    s = spec(**{"runPolicy.ttlSecondsAfterFinished": 60})
    status = TrainingJobStatus(phase=Phase.SUCCEEDED)
    set_condition(status, ConditionType.SUCCEEDED, True, R.SUCCEEDED, "", NOW - 10)
    at = check_due(s, [], NOW + 50, status)
    assert at.actions == [DeleteJob()]


def test_a_pod_stuck_terminating_on_a_lost_node_is_due_for_a_force_delete() -> None:
    stuck = pod(1, deleting_since=NOW - 2, node_lost=True)
    at = check_due(spec(), [pod(0), stuck], NOW + 3)  # nodeFailureGraceSeconds 5
    assert DeletePod(stuck.name, stuck.uid, force=True) in at.actions


def test_an_unschedulable_pod_is_due_for_the_condition_then_for_the_pending_timeout() -> None:
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 30})
    waiting = pod(1, "Pending", unschedulable_since=NOW - 2, scheduler_message="no fit")
    shown = check_due(s, [pod(0), waiting], NOW + 5)  # nodeFailureGraceSeconds 5 after the operator first saw it
    assert any(c.type == ConditionType.UNSCHEDULABLE and c.status == "True" for c in shown.status.conditions)
    seen_before = TrainingJobStatus(unschedulable_since=iso(NOW - 10))  # status.unschedulableSince
    timed_out = check_due(s, [pod(0), waiting], NOW + 20, seen_before)
    assert timed_out.status.phase is Phase.FAILED and timed_out.status.conditions[-1].reason == R.UNSCHEDULABLE


def test_a_retryable_start_failure_is_due_after_the_start_failure_grace() -> None:
    s = spec(**{"faultTolerance.startFailureGraceSeconds": 30})
    pulling = pod(1, "Pending", reason="ImagePullBackOff", waiting_since=NOW - 10)
    at = check_due(s, [pod(0), pulling], NOW + 20)
    assert at.status.phase is Phase.FAILED and "ImagePull" in at.status.conditions[-1].message


def test_a_peer_s_consequence_waiting_for_its_cause_is_due_when_the_wait_ends() -> None:
    consequence = pod(0, rank_restarts=1, rank_restart_reason="rank 0: exit code 5 (collective-timeout)",
                      rank_restart_at=NOW - 1)
    at = check_due(spec(), [consequence, pod(1)], NOW - 1 + CAUSE_WAIT_SECONDS)
    assert at.status.restarts == 1 and at.status.last_restart_reason == R.RESTART_RANK


def test_a_rule_already_decided_is_not_due_again() -> None:
    s = spec(**{"runPolicy.activeDeadlineSeconds": 50})
    status = TrainingJobStatus(phase=Phase.RUNNING)
    set_condition(status, ConditionType.CREATED, True, R.CREATED, "", NOW - 60)
    failed = run(s, status, [pod(0), pod(1)], NOW)
    assert failed.status.phase is Phase.FAILED and failed.next_due is None
