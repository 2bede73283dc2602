"""A pod force-deleted with grace 0 vanishes unseen: it is still a PodDeleted interruption (policy/vanished.py)."""

from __future__ import annotations

from dataclasses import replace

from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreatePod, DeletePod
from flywheel.policy.observed import ObservedProgress
from flywheel.policy.vanished import vanished_pods
from flywheel.spec.status import Phase, TrainingJobStatus
from tests.builders import NOW, pod, reconcile, spec


def test_a_pod_gone_unseen_is_handed_back_as_deleted_by_someone_else() -> None:
    gone = vanished_pods([pod(0), pod(1)], [pod(0)], set(), 0, NOW)
    assert [(p.name, p.deleting_since, p.message) for p in gone] == [("j-worker-1", NOW, R.MSG_POD_VANISHED)]


def test_pods_the_executor_deleted_itself_are_not_vanished() -> None:
    assert vanished_pods([pod(0), pod(1)], [pod(0)], {pod(1).uid}, 0, NOW) == []


def test_older_generations_and_finished_pods_are_not_vanished() -> None:
    seen = [pod(0, generation=0), pod(1, "Succeeded", generation=1), pod(2, "Failed", generation=1)]
    assert vanished_pods(seen, [], set(), 1, NOW) == []


def test_a_pod_seen_terminating_keeps_its_deletion_time() -> None:
    gone = vanished_pods([pod(1, deleting_since=NOW - 5)], [], set(), 0, NOW)
    assert gone[0].deleting_since == NOW - 5


def test_the_first_pass_after_a_restart_has_seen_nothing() -> None:
    assert vanished_pods([], [pod(0)], set(), 0, NOW) == []


def test_a_force_deleted_pod_is_counted_once_then_recreated() -> None:
    s, progress = spec(), ObservedProgress()
    running = reconcile(s, None, TrainingJobStatus(phase=Phase.RUNNING), [pod(0), pod(1)], progress, NOW)
    seen = [pod(0), pod(1)]
    present = [pod(0)]
    decided = reconcile(s, None, running.status, present + vanished_pods(seen, present, set(), 0, NOW + 1),
                        progress, NOW + 1)
    assert decided.status.restarts == 1 and decided.status.last_restart_reason == R.RESTART_POD_DELETED
    assert decided.status.restart_budget.used == 0
    assert not [a for a in decided.actions if isinstance(a, DeletePod)]
    relabelled = [replace(pod(0), generation=1)]  # the survivor, relabelled to generation 1 (same uid)
    again = reconcile(s, None, decided.status, relabelled + vanished_pods(present, relabelled, set(), 1, NOW + 2),
                      progress, NOW + 2)
    assert again.status.restarts == 1 and CreatePod(1, 1) in again.actions
