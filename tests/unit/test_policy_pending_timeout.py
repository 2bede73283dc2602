"""Unschedulable workers: the condition carries the scheduler's message; pendingTimeoutSeconds fails the job, or
an elastic job running at least min workers goes on (shrunk)."""

from __future__ import annotations

from flywheel.operator import manifests as m
from flywheel.policy import reasons as R
from flywheel.policy.conditions import MAY_HOLD, STATE_CONDITIONS
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.pending_timeout import pending_timeout
from flywheel.policy.reconcile import reconcile
from flywheel.policy.running_state import settle
from flywheel.spec_status import ConditionType, Phase, ReplicaStatus
from tests.unit.policy_helpers import NOW, fresh, pod, spec, view

FITS_NOT = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def stuck(index: int, since: float = NOW - 100) -> PodView:
    return pod(index, "Pending", unschedulable_since=since, scheduler_message=FITS_NOT)


def test_the_unschedulable_condition_names_the_pod_and_the_scheduler_s_message() -> None:
    out = settle(fresh(Phase.PENDING), view(spec(), [pod(0), stuck(1)]), Phase.PENDING)
    cond = next(c for c in out.status.conditions if c.type == ConditionType.UNSCHEDULABLE)
    assert cond.status == "True" and cond.message == f"worker j-worker-1 cannot be scheduled: {FITS_NOT}"


def test_pod_view_reads_the_scheduler_s_message() -> None:
    obj = {"metadata": {"name": "j-worker-1", "uid": "u", "labels": {m.INDEX_LABEL: "1"}},
           "status": {"phase": "Pending", "conditions": [
               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": FITS_NOT,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    view_ = m.pod_view(obj, set())
    assert view_ is not None and view_.scheduler_message == FITS_NOT and view_.unschedulable_since is not None


def test_no_timeout_waits_for_ever_and_a_timeout_fails_the_job_naming_the_field() -> None:
    pods = [pod(0), stuck(1, NOW - 10_000)]
    assert pending_timeout(fresh(Phase.PENDING), view(spec(), pods)) is None
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 120})
    assert pending_timeout(fresh(Phase.PENDING), view(s, [pod(0), stuck(1, NOW - 60)])) is None
    out = pending_timeout(fresh(Phase.PENDING), view(s, pods))
    assert out is not None and out.status.phase is Phase.FAILED
    failed = next(c for c in out.status.conditions if c.type == ConditionType.FAILED)
    assert failed.reason == R.UNSCHEDULABLE and "pendingTimeoutSeconds=120" in failed.message
    assert FITS_NOT in failed.message


def test_an_elastic_job_running_at_least_min_goes_on_shrunk() -> None:
    s = spec(**{"replicas.min": 1, "replicas.max": 2, "faultTolerance.pendingTimeoutSeconds": 30})
    running = fresh(replicas=ReplicaStatus(desired=2, current=2, ready=1))
    assert pending_timeout(running, view(s, [pod(0), stuck(1)])) is None
    none_ready = fresh(Phase.PENDING, replicas=ReplicaStatus(desired=2, current=2, ready=0))
    assert pending_timeout(none_ready, view(s, [stuck(0), stuck(1)])) is not None


def test_reconcile_fails_a_job_pending_past_its_timeout() -> None:
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 30})
    out = reconcile(s, None, fresh(Phase.PENDING).status, [stuck(0), stuck(1)], _progress(), NOW)
    assert out.status.phase is Phase.FAILED
    true = {c.type for c in out.status.conditions if c.status == "True"}
    assert true & set(STATE_CONDITIONS) <= {Phase.FAILED.value} | MAY_HOLD[Phase.FAILED], true


def _progress() -> ObservedProgress:
    return ObservedProgress()
