"""A Kueue-queued job on the test cluster: the operator creates every worker behind Kueue's admission gate with the
pod-group metadata, tolerates the gated pods (Pending, neither Unschedulable nor failed, whatever
pendingTimeoutSeconds says; the real kube-scheduler leaves them unbound, SchedulingGated), and the job runs once the
gates are removed, as Kueue does when it admits the workload (the test plays Kueue)."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.operator.conftest import OpEnv, eventually


def gated(pod: dict[str, Any]) -> bool:
    """Held back by its gate as Kubernetes says it: unbound, PodScheduled False with reason SchedulingGated."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["spec"].get("nodeName") and any(
        c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "SchedulingGated"
        for c in conditions)


def test_a_queued_job_waits_for_kueue_admission_then_runs(op_env: OpEnv) -> None:
    name = "queued"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **{"scheduling.queue": "team-a",
                                                                "faultTolerance.pendingTimeoutSeconds": 1})))
    pods = eventually(lambda: len(p := op_env.pods(name)) == 2 and p, 30, "the gated pods")
    for p in pods:
        assert p["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
        assert p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == name
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    time.sleep(4)  # past pendingTimeoutSeconds: a gated pod is waiting for admission, not unschedulable
    status = op_env.status(name)
    assert status.get("phase", "Pending") == "Pending", status
    held = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
    assert not held & {"Unschedulable", "Failed"}, status
    still = op_env.pods(name)
    assert len(still) == 2 and all(gated(p) for p in still), still  # kube-scheduler left them alone
    for p in pods:  # Kueue admits the workload: it removes its gate from every pod of the group
        op_env.kubectl("patch", "pod", p["metadata"]["name"], "--type=json",
                       "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]))
    op_env.wait_phase(name, "Succeeded", 180)
    assert op_env.status(name).get("restarts", 0) == 0
