"""Pure decisions (no I/O) on failures the pod phase alone does not show -- containers that cannot start (image
pulls, missing config) and preempted or evicted pods (DisruptionTarget) -- and conditions that agree with the
phase after every pass."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from flywheel.operator import manifests as m
from flywheel.operator.observe import pod_view
from flywheel.policy.conditions import MAY_HOLD, PHASE_CONDITIONS, STATE_CONDITIONS
from flywheel.policy.decisions import Relabel
from flywheel.policy.failures import START_FAILURE_GRACE_SECONDS, FailureKind, classify_waiting
from flywheel.policy.observed import ObservedProgress as Progress
from flywheel.policy.observed import PodView
from tests.operator.reconcile_json import condition, reconcile
from tests.operator.test_reconcile_policy import NOW, creates, deletes, hang, pod, spec

GRACE = START_FAILURE_GRACE_SECONDS
ELASTIC = {"replicas.min": 1, "replicas.max": 2}


def waiting(index: int, reason: str, seconds: float, generation: int = 0, message: str = "") -> PodView:
    return pod(index, "Pending", generation, reason=reason, waiting_since=NOW - seconds, message=message or None)


def assert_consistent(status: dict[str, Any]) -> None:
    """The phase and the state conditions agree: the phase's own condition is True, no other phase condition is,
    and Degraded/Hung/Unschedulable are True only where the phase allows them."""
    true = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
    phase = status["phase"]
    assert true & set(PHASE_CONDITIONS) == ({phase} if phase in PHASE_CONDITIONS else set()), (phase, true)
    assert true & set(STATE_CONDITIONS) <= {phase} | MAY_HOLD[phase], (phase, true)


# -- containers that cannot start --------------------------------------------------------------------------------

def test_waiting_reasons_fail_at_once_or_after_the_grace() -> None:
    assert classify_waiting("InvalidImageName", 0) is FailureKind.IMAGE_PULL
    assert classify_waiting("ErrImageNeverPull", 0) is FailureKind.IMAGE_PULL
    for reason in ("ErrImagePull", "ImagePullBackOff"):
        assert classify_waiting(reason, GRACE - 1) is None and classify_waiting(reason, GRACE) is FailureKind.IMAGE_PULL
    assert classify_waiting("CreateContainerConfigError", GRACE - 1) is None
    assert classify_waiting("CreateContainerConfigError", GRACE) is FailureKind.CONFIG_ERROR
    assert classify_waiting("ContainerCreating", 10 * GRACE) is None and classify_waiting(None, 10 * GRACE) is None
    # The grace is the caller's (the job's startFailureGraceSeconds); START_FAILURE_GRACE_SECONDS is the default.
    assert classify_waiting("ErrImagePull", 5, grace_seconds=5) is FailureKind.IMAGE_PULL
    assert classify_waiting("ErrImagePull", 4.9, grace_seconds=5) is None
    assert classify_waiting("InvalidImageName", 0, grace_seconds=1000) is FailureKind.IMAGE_PULL


def test_invalid_image_name_fails_the_job_at_once_with_a_clear_condition() -> None:
    bad = waiting(1, "InvalidImageName", 2, message='couldn\'t parse image name "Bad:x": invalid reference format')
    out = reconcile(spec(), None, {}, [pod(0, "Pending"), bad], Progress(), NOW)
    failed = condition(out.status, "Failed")
    assert out.status["phase"] == "Failed" and failed["status"] == "True" and failed["reason"] == "ImagePullError"
    assert "j-worker-1" in failed["message"] and "InvalidImageName" in failed["message"]
    assert "invalid reference format" in failed["message"] and "spec.image" in failed["message"]
    assert deletes(out) == ["j-worker-0", "j-worker-1"] and creates(out) == []  # nothing keeps pulling
    assert [(e.type, e.reason) for e in out.events][-1] == ("Warning", "ImagePullError")
    assert out.status.get("restarts", 0) == 0 and out.status["restartBudget"]["used"] == 0
    assert_consistent(out.status)


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
def test_pull_errors_get_a_grace_for_a_registry_blip(reason: str) -> None:
    early = reconcile(spec(), None, {}, [pod(0), waiting(1, reason, GRACE - 1)], Progress(), NOW)
    assert early.status["phase"] == "Pending" and deletes(early) == [] and condition(early.status, "Failed") is None
    late = reconcile(spec(), None, early.status, [pod(0), waiting(1, reason, GRACE)], Progress(), NOW)
    assert late.status["phase"] == "Failed" and condition(late.status, "Failed")["reason"] == "ImagePullError"
    assert f"waiting {GRACE:.0f}s: {reason}" in condition(late.status, "Failed")["message"]
    # Elastic or not, the image is the job's: a pull error is not a lost worker to shrink away from.
    elastic = reconcile(spec(**ELASTIC), None, {}, [pod(0), waiting(1, reason, GRACE)], Progress(), NOW)
    assert elastic.status["phase"] == "Failed"


def test_the_jobs_start_failure_grace_replaces_the_default() -> None:
    """faultTolerance.startFailureGraceSeconds: 5 fails an ErrImagePull worker after 5 s, not before; the default
    is START_FAILURE_GRACE_SECONDS."""
    assert spec().fault_tolerance.start_failure_grace_seconds == GRACE
    short = spec(**{"faultTolerance.startFailureGraceSeconds": 5})
    early = reconcile(short, None, {}, [pod(0), waiting(1, "ErrImagePull", 4.9)], Progress(), NOW)
    assert early.status["phase"] == "Pending" and deletes(early) == [] and condition(early.status, "Failed") is None
    late = reconcile(short, None, early.status, [pod(0), waiting(1, "ErrImagePull", 5)], Progress(), NOW)
    assert late.status["phase"] == "Failed" and condition(late.status, "Failed")["reason"] == "ImagePullError"
    assert "waiting 5s: ErrImagePull" in condition(late.status, "Failed")["message"]
    assert deletes(late) == ["j-worker-0", "j-worker-1"]
    # A longer grace (a large image on a slow registry) keeps the job waiting past the default.
    long = spec(**{"faultTolerance.startFailureGraceSeconds": 10 * GRACE})
    patient = reconcile(long, None, {}, [pod(0), waiting(1, "ImagePullBackOff", 2 * GRACE)], Progress(), NOW)
    assert patient.status["phase"] == "Pending" and deletes(patient) == []


def test_missing_config_fails_after_the_grace_and_starting_containers_never_do() -> None:
    missing = waiting(0, "CreateContainerConfigError", GRACE, message='secret "hf-token" not found')
    out = reconcile(spec(), None, {}, [missing, pod(1)], Progress(), NOW)
    assert condition(out.status, "Failed")["reason"] == "ContainerConfigError"
    assert 'secret "hf-token" not found' in condition(out.status, "Failed")["message"]
    slow = reconcile(spec(), None, {}, [waiting(0, "ContainerCreating", 10 * GRACE), pod(1)], Progress(), NOW)
    assert slow.status["phase"] == "Pending" and slow.actions == []


def test_pod_view_reads_the_waiting_state_and_since_when() -> None:
    obj = {"metadata": {"name": "j-worker-0", "uid": "u", "labels": {m.INDEX_LABEL: "0"},
                        "creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"phase": "Pending", "startTime": "2026-01-01T00:00:02Z", "containerStatuses": [
               {"state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}}]}}
    view = pod_view(obj, set())
    assert view is not None and view.reason == "ImagePullBackOff" and view.message == 'Back-off pulling image "x"'
    assert view.waiting_since == 1767225602.0 and view.disruption is None
    del obj["status"]["startTime"]  # not acknowledged by a kubelet yet: from its creation
    assert pod_view(obj, set()).waiting_since == 1767225600.0  # type: ignore[union-attr]


# -- preempted or evicted pods (DisruptionTarget) ---------------------------------------------------------------

def disrupted_obj(reason: str = "PreemptionByScheduler", deleting: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j-worker-1", "uid": "u1", "labels": {m.INDEX_LABEL: "1"}}
    if deleting:
        meta.update(deletionTimestamp="2026-01-01T00:00:30Z", deletionGracePeriodSeconds=30)
    return {"metadata": meta, "spec": {"nodeName": "node-2"},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": reason,
                 "message": "preempted by a higher-priority pod"}]}}


def test_preempted_pod_is_an_external_failure_decided_once() -> None:
    view = pod_view(disrupted_obj(), set())
    assert view is not None and view.disruption == "PreemptionByScheduler" and view.deleting_since is not None
    s = spec(**{"faultTolerance.maxRestarts": 0})  # no budget at all: an external failure still restarts
    status = reconcile(s, None, {}, [pod(0), pod(1)], Progress(), NOW).status
    decided = reconcile(s, None, status, [pod(0), view], Progress(), NOW + 1)
    assert decided.status["restarts"] == 1 and decided.status["lastRestartReason"] == "Evicted"
    assert decided.status["restartBudget"]["used"] == 0 and decided.status["phase"] == "Restarting"
    assert "PreemptionByScheduler" in condition(decided.status, "Restarting")["message"]
    assert deletes(decided) == ["j-worker-0"]  # the preempted pod is being deleted already
    assert "failed: Evicted" in decided.events[-1].message  # the API's restart history reads the kind from it
    assert_consistent(decided.status)
    again = reconcile(s, None, decided.status, [pod(0), view], Progress(), NOW + 2)
    assert again.status["restarts"] == 1 and not again.events


def test_disruption_wins_over_the_exit_code_and_elastic_jobs_shrink() -> None:
    evicted = pod(1, "Failed", exit_code=143, reason="Error", disruption="TerminationByKubelet")
    out = reconcile(spec(), None, {}, [pod(0), evicted], Progress(), NOW)
    assert out.status["lastRestartReason"] == "Evicted" and out.status["restartBudget"]["used"] == 0
    preempted = pod(1, deleting_since=NOW, disruption="EvictionByEvictionAPI")
    shrink = reconcile(spec(**ELASTIC), None, {}, [pod(0), preempted], Progress(), NOW)
    assert shrink.status["lastRestartReason"] == "Evicted" and deletes(shrink) == []
    assert [a for a in shrink.actions if isinstance(a, Relabel)] == [Relabel("j-worker-0", 1)]
    # A pod deleted without a DisruptionTarget (kubectl delete) is only replaced, but the interruption counts.
    plain = reconcile(spec(), None, {}, [pod(0), pod(1, deleting_since=NOW)], Progress(), NOW)
    assert plain.status["restarts"] == 1 and plain.status["lastRestartReason"] == "PodDeleted"
    assert plain.status["restartBudget"]["used"] == 0 and deletes(plain) == []
    assert [a for a in plain.actions if isinstance(a, Relabel)] == [Relabel("j-worker-0", 1)]


# -- conditions agree with the phase -----------------------------------------------------------------------------

def test_conditions_follow_the_phase_through_failure_restart_and_recovery() -> None:
    running = reconcile(spec(), None, {}, [pod(0), pod(1)], Progress(), NOW).status
    assert condition(running, "Running")["status"] == "True"
    decided = reconcile(spec(), None, running, [pod(0), pod(1, "Failed", exit_code=1)], Progress(), NOW + 1).status
    assert decided["phase"] == "Restarting" and condition(decided, "Running")["status"] == "False"
    assert condition(decided, "Running")["reason"] == "Crash"  # why it stopped running
    waiting_pass = reconcile(spec(), None, decided, [], Progress(), NOW + 2).status
    restarting = condition(waiting_pass, "Restarting")
    assert restarting["status"] == "True" and restarting["reason"] == "Crash"  # still names the failure
    back = reconcile(spec(), None, waiting_pass, [pod(0, generation=1), pod(1, generation=1)], Progress(), NOW + 3)
    assert condition(back.status, "Restarting")["status"] == "False"
    assert condition(back.status, "Running")["status"] == "True"
    for status in (running, decided, waiting_pass, back.status):
        assert_consistent(status)


def test_a_running_job_that_loses_its_workers_is_not_running_any_more() -> None:
    elastic = spec(**ELASTIC)
    degraded = reconcile(elastic, None, {}, [pod(0), pod(1, "Pending")], Progress(), NOW).status
    assert condition(degraded, "Degraded")["status"] == "True" and degraded["phase"] == "Running"
    gone = reconcile(elastic, None, degraded, [pod(0, "Pending"), pod(1, "Pending")], Progress(), NOW + 1).status
    assert gone["phase"] == "Pending"
    for ctype in ("Running", "Degraded"):
        assert condition(gone, ctype)["status"] == "False" and condition(gone, ctype)["reason"] == "WaitingForWorkers"
    assert_consistent(gone)


def test_a_restart_request_also_serves_a_pending_hang() -> None:
    running = reconcile(spec(), None, {}, [pod(0), pod(1)], Progress(), NOW).status
    asked = reconcile(spec(), None, running, [pod(0), pod(1)], Progress(), NOW + 1, restart_requested_at="t1",
                      findings=hang("no step for 99s"))
    assert asked.status["restarts"] == 1 and condition(asked.status, "Hung") is None
    assert_consistent(asked.status)
    after = reconcile(spec(), None, asked.status, [], Progress(), NOW + 2, restart_requested_at="t1",
                      findings=hang("no step for 99s"))
    assert after.status["restarts"] == 1  # not restarted a second time for the hang


POD_STATES = [
    lambda i, g: pod(i, "Running", g), lambda i, g: pod(i, "Pending", g),
    lambda i, g: pod(i, "Failed", g, exit_code=1), lambda i, g: pod(i, "Succeeded", g),
    lambda i, g: pod(i, "Running", g, node_lost=True), lambda i, g: pod(i, "Running", g, deleting_since=NOW - 9),
    lambda i, g: waiting(i, "ImagePullBackOff", 1, g), lambda i, g: pod(i, "Pending", g, unschedulable_since=NOW - 99),
    lambda i, g: pod(i, "Running", g, deleting_since=NOW, disruption="PreemptionByScheduler"), None,
]


def test_every_pass_leaves_consistent_conditions() -> None:
    """Every combination of two workers' states, from a running, restarting, degraded and hung job, for a fixed and
    an elastic spec, twice in a row: the conditions always agree with the phase."""
    specs = [spec(), spec(**ELASTIC), spec(**{**ELASTIC, "faultTolerance.restartScope": "worker"})]
    base = reconcile(spec(**ELASTIC), None, {}, [pod(0), pod(1, "Pending")], Progress(), NOW - 10).status  # degraded
    restarting = reconcile(spec(), None, base, [pod(0), pod(1, "Failed", exit_code=1)], Progress(), NOW - 5).status
    starts = [(base, None), (restarting, None), (base, hang("no step"))]  # the last: a hang reported
    checked = 0
    pairs = itertools.product(POD_STATES, POD_STATES)
    for s, (start, findings), (a, b) in itertools.product(specs, starts, pairs):
        gen = int(start.get("restarts", 0))
        pods = [f(i, gen) for i, f in enumerate((a, b)) if f is not None]
        extra = {"findings": findings} if findings is not None else {}
        status = reconcile(s, None, start, pods, Progress(), NOW, **extra).status
        assert_consistent(status)
        assert_consistent(reconcile(s, None, status, pods, Progress(), NOW + 1, **extra).status)
        checked += 1
    assert checked == 3 * 3 * len(POD_STATES) ** 2


def test_success_seen_from_the_pods_alone() -> None:
    """Without an event log (no --events-dir) the status has no step: success still comes from the pods."""
    done = reconcile(spec(), None, {}, [pod(0, "Succeeded"), pod(1, "Succeeded")], Progress(), NOW)
    assert done.status["phase"] == "Succeeded" and "step 0" in condition(done.status, "Succeeded")["message"]
