"""Every interruption counts in status.restarts and is named by status.lastRestartReason."""

from __future__ import annotations

from typing import Any

import pytest

from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreatePod, DeletePod, Relabel
from flywheel.policy.failure_decision import decide_failure
from flywheel.policy.observed import HangReport, HealthFindings, ObservedProgress
from flywheel.spec.status import TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spec, view


def test_a_pod_deleted_by_someone_else_counts_without_budget_and_only_it_is_replaced() -> None:
    out = decide_failure(fresh(), view(spec(), [pod(0), pod(1, "Failed", exit_code=6, deleting_since=NOW)]))
    assert out is not None and out.status.restarts == 1
    assert out.status.last_restart_reason == R.RESTART_POD_DELETED and out.status.restart_budget.used == 0
    assert Relabel("j-worker-0", 1) in out.actions and not [a for a in out.actions if isinstance(a, DeletePod)]


def test_the_health_monitor_s_xid_deletion_is_named_xid() -> None:
    xid = pod(1, deleting_since=NOW, deleted_for=R.RESTART_XID)
    out = decide_failure(fresh(), view(spec(), [pod(0), xid]))
    assert out is not None and out.status.last_restart_reason == "XID" and out.status.restarts == 1


def test_the_deleted_pod_is_decided_once_then_recreated_in_the_new_generation() -> None:
    s = spec()
    first = reconcile(s, None, TrainingJobStatus(), [pod(0), pod(1)], _progress(), NOW)
    deleted = reconcile(s, None, first.status, [pod(0), pod(1, deleting_since=NOW)], _progress(), NOW + 1)
    assert deleted.status.restarts == 1
    again = reconcile(s, None, deleted.status, [pod(0, generation=1), pod(1, deleting_since=NOW)], _progress(),
                      NOW + 2)
    assert again.status.restarts == 1 and not again.events  # an older generation's pod: only waited for
    gone = reconcile(s, None, again.status, [pod(0, generation=1)], _progress(), NOW + 3)
    assert CreatePod(1, 1) in gone.actions


def test_pods_above_the_desired_count_deleted_by_a_scale_down_are_not_interruptions() -> None:
    s = spec(**{"replicas.min": 1, "replicas.max": 2, "replicas.target": 1})
    assert decide_failure(fresh(), view(s, [pod(0), pod(1, deleting_since=NOW)])) is None


@pytest.mark.parametrize(("failed", "reason"), [
    ({"phase": "Failed", "reason": "OOMKilled", "exit_code": 137}, "OOMKilled"),
    ({"phase": "Failed", "exit_code": 137}, "Killed"),
    ({"phase": "Running", "node_lost": True}, "NodeLost"),
    ({"phase": "Failed", "exit_code": 143, "disruption": "EvictionByEvictionAPI"}, "Evicted"),
    ({"phase": "Failed", "exit_code": 4}, "Hung"),  # the worker's own watchdog
])
def test_each_interruption_is_named(failed: dict[str, Any], reason: str) -> None:
    out = decide_failure(fresh(), view(spec(), [pod(0), pod(1, **failed)]))
    assert out is not None and out.status.last_restart_reason == reason and out.status.restarts == 1


def test_a_hang_finding_is_named_hung() -> None:
    out = decide_failure(fresh(), view(spec(), [pod(0), pod(1)], findings=HealthFindings(hang=HangReport("x", 0))))
    assert out is not None and out.status.last_restart_reason == R.RESTART_HUNG


def _progress() -> ObservedProgress:
    return ObservedProgress()
