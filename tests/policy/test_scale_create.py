from typing import Any

from flywheel.policy.decisions import CreatePod, DeletePod, ResetRendezvous
from flywheel.policy.observed import ObservedProgress
from flywheel.policy.scale_create import clean_up, create_missing
from flywheel.spec.status import Phase, TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spec, view


def test_clean_up_deletes_extra_and_decided_pods_and_force_deletes_lost_ones() -> None:
    pods = [pod(0, generation=1), pod(1, "Failed", exit_code=1), pod(2),
            pod(3, deleting_since=NOW - 10, node_lost=True)]
    out = clean_up(fresh(), view(spec(), pods, generation=1))
    assert out.actions == [DeletePod("j-worker-1", "u1-0"), DeletePod("j-worker-2", "u2-0"),
                           DeletePod("j-worker-3", "u3-0", force=True)]
    assert [e.reason for e in out.events] == ["ForceDeleted"]


def test_create_missing_reuses_free_names_and_resets_the_rendezvous_for_a_new_group() -> None:
    assert create_missing(fresh(), view(spec(), [pod(1)])).actions == [CreatePod(0, 0)]
    assert create_missing(fresh(), view(spec(), [pod(0, generation=0)], generation=1)).actions == []  # old group
    new_group = create_missing(fresh(), view(spec(), [], generation=1)).actions
    assert new_group == [ResetRendezvous(), CreatePod(0, 1), CreatePod(1, 1)]


def _elastic(target: int) -> Any:
    return spec(**{"replicas": {"min": 1, "max": 2, "target": target}})


def test_a_pod_scaled_down_is_no_failure_when_the_job_is_scaled_back_up_before_it_is_gone() -> None:
    """kubectl scale 1, then 2 at once: the operator's own deletion of worker 1 is still under way when index 1 is
    within the count again. It is remembered (status.deletedByOperator), so it is not a worker deleted by someone
    else (a PodDeleted restart); worker 1 is recreated once the old pod is gone. A pod deleted from outside is."""
    progress = ObservedProgress(step=50, world_size=2)
    down = reconcile(_elastic(1), None, TrainingJobStatus(phase=Phase.RUNNING), [pod(0), pod(1)], progress, NOW)
    assert down.actions == [DeletePod("j-worker-1", "u1-0")] and down.status.deleted_by_operator == ["u1-0"]
    leaving = [pod(0), pod(1, deleting_since=NOW)]
    up = reconcile(_elastic(2), None, down.status, leaving, progress, NOW + 1)
    assert up.status.restarts == 0 and up.actions == [] and up.status.phase is Phase.RUNNING, up
    gone = reconcile(_elastic(2), None, up.status, [pod(0)], progress, NOW + 2)
    assert gone.actions == [CreatePod(1, 0)] and gone.status.deleted_by_operator == [] and gone.status.restarts == 0
    outside = reconcile(_elastic(2), None, gone.status, leaving, progress, NOW + 3)
    assert outside.status.restarts == 1 and outside.status.last_restart_reason == "PodDeleted"
