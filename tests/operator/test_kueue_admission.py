"""A Kueue-queued job on the test cluster: the operator creates every worker behind Kueue's admission gate with the
pod-group metadata, tolerates the gated pods (Pending, neither Unschedulable nor failed, whatever
pendingTimeoutSeconds says), and the job runs once the gates are removed, as Kueue does when it admits the
workload (the test plays Kueue)."""

from __future__ import annotations

import importlib.util
import json
import time

from tests.operator.conftest import OpEnv, eventually

# The test cluster's scheduler keeps gated pods Pending (reason SchedulingGated) where it has the scheduler module.
HONOURS_GATES = importlib.util.find_spec("tests.k8s_emulator.scheduler") is not None


def test_a_queued_job_waits_for_kueue_admission_then_runs(op_env: OpEnv) -> None:
    name = "queued"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **{"scheduling.queue": "team-a",
                                                                "faultTolerance.pendingTimeoutSeconds": 1})))
    pods = eventually(lambda: len(p := op_env.pods(name)) == 2 and p, 30, "the gated pods")
    for p in pods:
        assert p["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
        assert p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == name
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    if HONOURS_GATES:
        time.sleep(4)  # past pendingTimeoutSeconds: a gated pod is waiting for admission, not unschedulable
        status = op_env.status(name)
        assert status.get("phase", "Pending") == "Pending", status
        held = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
        assert not held & {"Unschedulable", "Failed"}, status
        assert all(not p.get("spec", {}).get("nodeName") for p in op_env.pods(name))
    for p in pods:  # Kueue admits the workload: it removes its gate from every pod of the group
        op_env.kubectl("patch", "pod", p["metadata"]["name"], "--type=json",
                       "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]))
    op_env.wait_phase(name, "Succeeded", 180)
    assert op_env.status(name).get("restarts", 0) == 0
