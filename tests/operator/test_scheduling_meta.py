"""Kueue's pod-group metadata on the worker pods (flywheel/operator/scheduling_meta.py), and gated pods in the
reconcile policy: Pending behind Kueue's gate is neither a failure nor Unschedulable."""

from __future__ import annotations

from typing import Any

from flywheel.contracts.labels import NO_VOLUNTARY_DISRUPTION_ANNOTATIONS
from flywheel.operator import manifests as m
from flywheel.operator import scheduling_meta as k
from flywheel.operator.observe import pod_view
from flywheel.operator.spare_pods import spare_pod
from flywheel.policy.observed import ObservedProgress
from flywheel.spec import TrainingJob
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus
from tests import builders
from tests.builders import NOW, reconcile, spec


def job(scheduling: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
        replicas: dict[str, int] | None = None) -> TrainingJob:
    return builders.job({"replicas": replicas or {"min": 3, "max": 3},
                         "trainer": {"training": {"globalBatch": 12, "microBatch": 1}},
                         "scheduling": scheduling or {}}, name="llm", namespace="ml", labels=labels)


def worker_pod(j: TrainingJob, gang_scheduler: str = "none", index: int = 0) -> dict[str, Any]:
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", gang_scheduler=gang_scheduler)
    return m.pod(j, m.plan(j, "0123456789abcdef", settings, None)[index], 0, settings)


def test_a_queued_job_s_pods_are_one_kueue_pod_group_behind_the_admission_gate() -> None:
    pods = [worker_pod(job({"queue": "team-a"}), index=i) for i in range(3)]
    for p in pods:
        assert p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "llm"
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"
        assert p["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]


def test_the_job_s_own_queue_label_makes_the_group_too() -> None:
    p = worker_pod(job(labels={"kueue.x-k8s.io/queue-name": "lq"}))
    assert p["metadata"]["labels"][k.POD_GROUP_LABEL] == "llm" and p["spec"]["schedulingGates"]


def test_the_total_count_is_the_workers_the_job_runs_now() -> None:
    elastic = job({"queue": "q"}, replicas={"min": 1, "max": 4, "target": 2})
    assert k.kueue_metadata(elastic, "none")[1] == {k.POD_GROUP_TOTAL_ANNOTATION: "2"}


def test_no_queue_no_kueue_metadata_and_no_gate() -> None:
    p = worker_pod(job())
    assert k.POD_GROUP_LABEL not in p["metadata"]["labels"] and "schedulingGates" not in p["spec"]
    assert _scheduling_annotations(p) == {}


def test_with_volcano_the_queue_is_volcano_s() -> None:
    j = job({"queue": "vq"})
    p = worker_pod(j, gang_scheduler="volcano")
    assert "schedulingGates" not in p["spec"] and k.POD_GROUP_LABEL not in p["metadata"]["labels"]
    assert _scheduling_annotations(p) == {"scheduling.k8s.io/group-name": "llm"}
    assert m.pod_group(j, m.OperatorSettings(etcd_endpoints="", gang_scheduler="volcano"))["spec"]["queue"] == "vq"


def test_gates_already_on_the_pod_are_kept_and_not_doubled() -> None:
    j = job({"queue": "q"})
    given = {"metadata": {"labels": {"team": "a"}}, "spec": {"schedulingGates": [
        {"name": "example.com/quota"}, {"name": k.ADMISSION_GATE}]}}
    out = k.with_scheduling_meta(j, "none", given)
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, {"name": k.ADMISSION_GATE}]
    assert out["metadata"]["labels"]["team"] == "a" and given["metadata"]["labels"] == {"team": "a"}  # a copy


GATED_STATUS = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
     "message": "Scheduling is blocked due to non-empty scheduling gates",
     "lastTransitionTime": "2020-01-01T00:00:00Z"}]}


def gated_view(index: int) -> Any:
    obj = {"metadata": {"name": f"j-worker-{index}", "uid": f"u{index}",
                        "labels": {m.INDEX_LABEL: str(index), m.GENERATION_LABEL: "0"},
                        "creationTimestamp": "2020-01-01T00:00:00Z"},
           "spec": {"schedulingGates": [{"name": k.ADMISSION_GATE}]}, "status": GATED_STATUS}
    return pod_view(obj, set())


def test_a_gated_pod_is_neither_unschedulable_nor_failed() -> None:
    view = gated_view(0)
    assert view is not None and view.unschedulable_since is None and view.scheduler_message is None
    assert view.reason is None and view.exit_code is None and view.waiting_since is None


def test_a_job_waiting_for_kueue_stays_pending_for_ever_even_with_a_pending_timeout() -> None:
    s = spec(**{"faultTolerance.pendingTimeoutSeconds": 30, "faultTolerance.startFailureGraceSeconds": 1})
    out = reconcile(s, None, TrainingJobStatus(phase=Phase.PENDING), [gated_view(0), gated_view(1)],
                    ObservedProgress(), NOW)
    assert out.status.phase is Phase.PENDING
    held = {c.type for c in out.status.conditions if c.status == "True"}
    assert ConditionType.UNSCHEDULABLE.value not in held and ConditionType.FAILED.value not in held
    assert out.status.restarts == 0


def test_the_spares_are_part_of_the_kueue_request() -> None:
    j = job({"queue": "team-a"}, replicas={"min": 3, "max": 3, "spares": 1})
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379")
    pods = [worker_pod(j), spare_pod(j, m.plan(j, "0123456789abcdef", settings, None)[0], 0, 0, settings)]
    for p in pods:
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "4"
        assert p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "llm"


def _scheduling_annotations(pod: dict) -> dict:
    """The pod's annotations but the spec it was created with (policy/spec_change.py) and the autoscalers'
    opt-outs (contracts/labels.py), which every pod has."""
    return {k: v for k, v in pod["metadata"]["annotations"].items()
            if not k.startswith("flywheel.dev/spec-") and k not in NO_VOLUNTARY_DISRUPTION_ANNOTATIONS}
