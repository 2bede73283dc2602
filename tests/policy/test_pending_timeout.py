"""Unschedulable workers: the condition carries the scheduler's message; pendingTimeoutSeconds fails the job, or
an elastic job running at least min workers goes on (shrunk). The wait counts from when the operator first saw a
worker Unschedulable (status.unschedulableSince), never from the pod's condition: a Kueue-gated pod's condition
dates from its gating, and a job queued for hours must not time out as soon as it is admitted."""

from __future__ import annotations

from typing import Any

from flywheel.operator import manifests as m
from flywheel.operator.observe import pod_view
from flywheel.policy import reasons as R
from flywheel.policy.conditions import MAY_HOLD, STATE_CONDITIONS, iso
from flywheel.policy.decisions import Pass
from flywheel.policy.due import next_due
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.pending_timeout import pending_timeout, track_unschedulable
from flywheel.policy.running_state import settle
from flywheel.spec.status import ConditionType, Phase, ReplicaStatus, TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spec, view

FITS_NOT = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
RENDEZVOUS_GAVE_UP = "rendezvous failed: RendezvousTimeoutError: "


def stuck(index: int, since: float = NOW - 100, generation: int = 0) -> PodView:
    return pod(index, "Pending", generation, unschedulable_since=since, scheduler_message=FITS_NOT)


def waited(since: float, phase: Phase = Phase.PENDING, **fields: Any) -> Pass:
    """A status whose job the operator saw unschedulable first at `since`."""
    return fresh(phase, unschedulable_since=iso(since), **fields)


def test_the_unschedulable_condition_names_the_pod_and_the_scheduler_s_message() -> None:
    out = settle(waited(NOW - 100), view(spec(), [pod(0), stuck(1)]), Phase.PENDING)
    cond = next(c for c in out.status.conditions if c.type == ConditionType.UNSCHEDULABLE)
    assert cond.status == "True" and cond.message == f"worker j-worker-1 cannot be scheduled: {FITS_NOT}"


def _pod_obj(sched: dict[str, str], **spec_: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j-worker-1", "uid": "u", "labels": {m.INDEX_LABEL: "1"}}, "spec": spec_,
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", **sched}]}}


def test_pod_view_reads_the_scheduler_s_message_and_a_gate() -> None:
    view_ = pod_view(_pod_obj({"reason": "Unschedulable", "message": FITS_NOT,
                                 "lastTransitionTime": "2026-01-01T00:00:00Z"}), set())
    assert view_ is not None and view_.scheduler_message == FITS_NOT and view_.unschedulable_since is not None
    assert not view_.gated
    gated = pod_view(_pod_obj({"reason": "SchedulingGated"},
                                schedulingGates=[{"name": "kueue.x-k8s.io/admission"}]), set())
    assert gated is not None and gated.gated and gated.unschedulable_since is None


def test_no_timeout_waits_for_ever_and_a_timeout_fails_the_job_naming_the_field() -> None:
    pods = [pod(0), stuck(1, NOW - 10_000)]
    assert pending_timeout(waited(NOW - 10_000), view(spec(), pods)) is None
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 120})
    assert pending_timeout(waited(NOW - 60), view(s, pods)) is None  # the pod's own time does not count
    out = pending_timeout(waited(NOW - 10_000), view(s, pods))
    assert out is not None and out.status.phase is Phase.FAILED
    failed = next(c for c in out.status.conditions if c.type == ConditionType.FAILED)
    assert failed.reason == R.UNSCHEDULABLE and "pendingTimeoutSeconds=120" in failed.message
    assert "unschedulable for 10000s" in failed.message and FITS_NOT in failed.message


def test_the_record_starts_when_first_seen_stays_while_pods_are_recreated_and_clears_when_placed() -> None:
    s = spec()
    status = TrainingJobStatus()
    track_unschedulable(status, view(s, [pod(0), stuck(1, NOW - 7200)]))
    assert status.unschedulable_since == iso(NOW)  # first seen now, whatever the pod's condition says
    track_unschedulable(status, view(s, [pod(0), stuck(1, NOW - 7200)], now=NOW + 60))
    assert status.unschedulable_since == iso(NOW)
    for between in ([], [pod(0, generation=1)], [pod(0, generation=1), pod(1, "Pending", generation=1)]):
        track_unschedulable(status, view(s, between, generation=1, now=NOW + 90))  # recreated, not yet tried
        assert status.unschedulable_since == iso(NOW), between
    track_unschedulable(status, view(s, [pod(0), pod(1, "Pending", node="n1")], now=NOW + 99))
    assert status.unschedulable_since == "" and status.to_json()["unschedulableSince"] == ""  # every worker placed
    for cleared in ([pod(0), pod(1, "Pending", gated=True)],):  # queued again: the queue's wait, not the cluster's
        again = TrainingJobStatus(unschedulable_since=iso(NOW))
        track_unschedulable(again, view(s, cleared, now=NOW + 99))
        assert again.unschedulable_since == ""
    suspended = TrainingJobStatus(unschedulable_since=iso(NOW))
    track_unschedulable(suspended, view(spec(suspend=True), [], now=NOW + 99))
    assert suspended.unschedulable_since == ""


def test_a_job_queued_in_kueue_times_out_from_its_admission_not_its_gating() -> None:
    """Gated 2 h (SchedulingGated since creation), admitted, briefly unschedulable while the autoscaler adds a
    node: the scheduler kept the condition's lastTransitionTime (False -> False), the pod's creation."""
    created = NOW - 7200
    obj = _pod_obj({"reason": "Unschedulable", "message": FITS_NOT, "lastTransitionTime": iso(created)})
    obj["metadata"].update(creationTimestamp=iso(created), uid="u1")
    gated_long = pod_view(obj, set())
    assert gated_long is not None and gated_long.unschedulable_since == created
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 900})
    pods = [pod(0), gated_long]
    first = reconcile(s, None, TrainingJobStatus(), pods, ObservedProgress(), NOW + 10)
    assert first.status.phase is Phase.PENDING and first.status.unschedulable_since == iso(NOW + 10)
    assert not any(c.type == ConditionType.UNSCHEDULABLE and c.status == "True" for c in first.status.conditions)
    assert first.next_due == NOW + 15  # the condition after nodeFailureGraceSeconds, from the first sight
    # An operator restart reads the record back from the status it wrote.
    restarted = TrainingJobStatus.model_validate(first.status.to_json())
    shown = reconcile(s, None, restarted, pods, ObservedProgress(), NOW + 15)
    assert any(c.type == ConditionType.UNSCHEDULABLE and c.status == "True" for c in shown.status.conditions)
    assert shown.next_due == NOW + 910
    late = reconcile(s, None, shown.status, pods, ObservedProgress(), NOW + 910)
    assert late.status.phase is Phase.FAILED
    assert "unschedulable for 900s (faultTolerance.pendingTimeoutSeconds=900)" in late.status.conditions[-1].message


def test_a_peer_s_rendezvous_giving_up_is_not_charged_and_the_timeout_outlasts_the_restart() -> None:
    """pendingTimeoutSeconds above the rendezvous join timeout: the running worker's rendezvous gives up on the
    unschedulable one and crashes; the restart (restartScope job recreates the pending pod too) spends no budget
    and does not start the wait again, so the job fails Unschedulable, not RestartBudgetExhausted."""
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 1800, "faultTolerance.maxRestarts": 1})
    status = reconcile(s, None, TrainingJobStatus(), [pod(0), stuck(1, NOW)], ObservedProgress(), NOW).status
    for gen, t in enumerate((NOW + 900, NOW + 1700)):  # two crashes: more than maxRestarts, were they charged
        crashed = [pod(0, "Failed", gen, exit_code=1, message=RENDEZVOUS_GAVE_UP), stuck(1, t - 900, gen)]
        out = reconcile(s, None, status, crashed, ObservedProgress(), t)
        assert out.status.phase is Phase.RESTARTING and out.status.restart_budget.used == 0
        # The pods go and come back: none yet, created, then the new one unschedulable (its own condition anew).
        for pods in ([], [pod(0, generation=gen + 1), pod(1, "Pending", gen + 1)],
                     [pod(0, generation=gen + 1), stuck(1, t + 2, gen + 1)]):
            out = reconcile(s, None, out.status, pods, ObservedProgress(), t + 2)
            assert out.status.unschedulable_since == iso(NOW)
        assert out.next_due == NOW + 1800
        status = out.status
    late = reconcile(s, None, status, [pod(0, generation=2), stuck(1, NOW + 1702, 2)], ObservedProgress(), NOW + 1800)
    failed = next(c for c in late.status.conditions if c.type == ConditionType.FAILED and c.status == "True")
    assert failed.reason == R.UNSCHEDULABLE and "unschedulable for 1800s" in failed.message


def test_a_rendezvous_crash_with_every_worker_placed_is_charged() -> None:
    s = spec(**{"faultTolerance.maxRestarts": 1})
    crashed = [pod(0, "Failed", exit_code=1, message=RENDEZVOUS_GAVE_UP), pod(1)]
    out = reconcile(s, None, TrainingJobStatus(), crashed, ObservedProgress(), NOW)
    assert out.status.restart_budget.used == 1


def test_an_elastic_job_running_at_least_min_goes_on_shrunk() -> None:
    s = spec(**{"replicas.min": 1, "replicas.max": 2, "faultTolerance.pendingTimeoutSeconds": 30})
    running = waited(NOW - 100, Phase.RUNNING, replicas=ReplicaStatus(desired=2, current=2, ready=1))
    assert pending_timeout(running, view(s, [pod(0), stuck(1)])) is None
    none_ready = waited(NOW - 100, replicas=ReplicaStatus(desired=2, current=2, ready=0))
    assert pending_timeout(none_ready, view(s, [stuck(0), stuck(1)])) is not None


def test_reconcile_fails_a_job_pending_past_its_timeout() -> None:
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 30})
    seen = reconcile(s, None, fresh(Phase.PENDING).status, [stuck(0), stuck(1)], ObservedProgress(), NOW - 30)
    assert seen.status.phase is Phase.PENDING and next_due(seen.status, view(s, [stuck(0), stuck(1)], now=NOW - 30))
    out = reconcile(s, None, seen.status, [stuck(0), stuck(1)], ObservedProgress(), NOW)
    assert out.status.phase is Phase.FAILED
    true = {c.type for c in out.status.conditions if c.status == "True"}
    assert true & set(STATE_CONDITIONS) <= {Phase.FAILED.value} | MAY_HOLD[Phase.FAILED], true
