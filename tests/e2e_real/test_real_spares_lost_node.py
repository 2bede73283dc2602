"""Real-cluster twin of tests/operator/test_spares_cluster.py's lost node (see conftest.py for the settings; skipped
without KUBECONFIG): with `replicas.spares: 1`, a worker whose node is lost is replaced by the warm spare (it takes
the lost replica index; no cold pod of that index is created), the job Succeeds, and its parameters equal a
fault-free run's.

Losing a node takes more than kubectl. What the operator must see is what a dead or partitioned node gives: the
worker's agent stops renewing its etcd liveness key, the node's kubelet stops reporting, and the pod cannot end
(it stays Terminating until force-deleted). kubectl alone cannot bring that about:

- `kubectl cordon` + `kubectl delete pod --grace-period=0 --force` is a deleted pod on a live node: the kubelet still
  runs, kills the container at once and keeps the node Ready, and the operator sees `PodDeleted` (the twin of the
  deleted-pod test, test_real_operator.py). The cordon alone is a drain-ahead signal
  (`node.kubernetes.io/unschedulable`): the operator would move the worker before anything is lost.
- Stopping the kubelet (`kubectl debug node/...` + `systemctl stop kubelet`) leaves the containers running: the
  agent keeps its liveness key and keeps training, which is no lost worker either.

So the test freezes a node through a command of the cluster's own platform, given as shell templates with `{node}`
(the node's name), and skips without them:

| env | kind (node = a container of the same name) | a cloud VM |
|---|---|---|
| `FLYWHEEL_E2E_LOSE_NODE` | `docker pause {node}` | e.g. `gcloud compute instances suspend {node}` |
| `FLYWHEEL_E2E_RESTORE_NODE` | `docker unpause {node}` | e.g. `gcloud compute instances resume {node}` |

`docker pause` freezes every process of the node (cgroup freezer), as the test cluster's lost node does
(docs/test-cluster.md). The node lost is one running a worker but none of the spare, the operator, an etcd member of
the chart (`FLYWHEEL_E2E_ETCD`) or the control plane; the test skips when no node qualifies (kind: three worker
nodes, or the operator and etcd pinned apart with a nodeSelector). The node is restored once the job trains without
it, and in any case before the test ends. The job keeps memory checkpoints (`memoryEverySteps: 10`): the promoted
spare restores from its peer's replica, whatever checkpoint volume the suite has.

On the suite's own cluster (local_cluster.py) both variables are the test cluster's fault command,
`python -m tests.cluster fault --kubeconfig K lose-node node={node}` and `restore-node`: the process kubelet stops
renewing the node's Lease and its processes die; the real node-lifecycle controller does the rest.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_real.conftest import RealCluster, eventually
from tests.operator.test_spares_cluster import PodNames

LONG = {"trainer.training.steps": 400, "checkpoint.everySteps": 20}
LOSE, RESTORE = os.environ.get("FLYWHEEL_E2E_LOSE_NODE", ""), os.environ.get("FLYWHEEL_E2E_RESTORE_NODE", "")
INDEX, ROLE = "flywheel.dev/replica-index", "flywheel.dev/role"

pytestmark = pytest.mark.skipif(not (LOSE and RESTORE), reason="set FLYWHEEL_E2E_LOSE_NODE and "
                                "FLYWHEEL_E2E_RESTORE_NODE (e.g. 'docker pause {node}' / 'docker unpause {node}' on "
                                "kind): kubectl cannot lose a node (this file's docstring)")


def _platform(template: str, node: str) -> None:
    done = subprocess.run(template.format(node=node), shell=True, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise AssertionError(f"{template.format(node=node)!r} exited {done.returncode}:\n{done.stdout}{done.stderr}")


def _nodes_of(real: RealCluster, namespace: str, selector: str) -> set[str]:
    out = real.kubectl("get", "pods", "-l", selector, "-o", "jsonpath={.items[*].spec.nodeName}",
                       namespace=namespace, check=False).stdout
    return set(out.split())


def _control_plane(real: RealCluster) -> set[str]:
    out = real.kubectl("get", "nodes", "-l", "node-role.kubernetes.io/control-plane", "-o",
                       "jsonpath={.items[*].metadata.name}").stdout
    return set(out.split())


def _pod(real: RealCluster, job: str, name: str) -> dict[str, Any] | None:
    return next((p for p in real.pods(job) if p["metadata"]["name"] == name), None)


def _params_hash(real: RealCluster, job: str) -> str:
    """The final parameter hash rank 0 logged: the log of the worker pod of replica 0 (a promoted spare keeps its
    own name)."""
    pod = next(p["metadata"]["name"] for p in real.pods(job) if p["metadata"]["labels"].get(INDEX) == "0"
               and p["metadata"]["labels"].get(ROLE) == "worker" and p["status"].get("phase") == "Succeeded")
    found = re.findall(r"params sha256 ([0-9a-f]{64})", real.kubectl("logs", pod).stdout)
    assert found, f"{pod}'s log has no final parameter hash"
    return found[-1]


def test_a_lost_node_is_replaced_by_the_warm_spare(real: RealCluster, tmp_path: Path) -> None:
    name, ref = "e2e-spare-lost", "e2e-spare-lost-ref"
    real.apply_job(ref, tmp_path, **LONG)
    real.apply_job(name, tmp_path, **LONG, **{"replicas.spares": 1, "checkpoint.memoryEverySteps": 10,
                                              "faultTolerance.nodeFailureGraceSeconds": 10})
    eventually(lambda: real.status(name).get("spares") == 1, 600, "the spare to be ready")
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    etcd_ns, _, etcd_selector = os.environ.get("FLYWHEEL_E2E_ETCD",
                                               f"{real.operator_ns}:app.kubernetes.io/component=etcd").partition(":")
    spare_node = ((_pod(real, name, f"{name}-spare-0") or {}).get("spec") or {}).get("nodeName")
    keep = {spare_node, *_nodes_of(real, real.operator_ns, real.operator_selector),
            *_nodes_of(real, etcd_ns, etcd_selector), *_control_plane(real)}
    workers = [p for p in real.pods(name) if p["metadata"]["labels"].get(ROLE) == "worker"]
    victim = next((p for p in sorted(workers, key=lambda p: p["metadata"]["name"], reverse=True)
                   if p["spec"].get("nodeName") not in keep), None)
    if victim is None:
        pytest.skip(f"every worker's node also runs the spare, the operator, etcd or the control plane ({keep})")
    worker, node, uid = victim["metadata"]["name"], victim["spec"]["nodeName"], victim["metadata"]["uid"]
    index = victim["metadata"]["labels"][INDEX]
    names = PodNames(real, name, interval=1.0)
    step_at_loss = real.status(name).get("step", 0)
    _platform(LOSE, node)
    failed = True
    try:
        # The frozen agent's liveness key expires: the spare is promoted at once, the lost pod force-deleted after
        # nodeFailureGraceSeconds (its kubelet never confirms the deletion).
        eventually(lambda: ((p := _pod(real, name, f"{name}-spare-0")) is not None
                            and p["metadata"]["labels"].get(INDEX) == index), 300, f"the spare to take index {index}")
        eventually(lambda: all(p["metadata"]["uid"] != uid for p in real.pods(name)), 300,
                   "the lost pod to be force-deleted")
        eventually(lambda: real.status(name).get("step", 0) > step_at_loss + 20, 600, "training without the node")
        failed = False
    finally:
        try:
            _platform(RESTORE, node)
        except AssertionError as err:
            if not failed:
                raise
            print(f"restoring {node} failed too: {err}")  # the failure above is the one reported
    status = real.wait_phase(name, "Succeeded", 1800)
    names.close()
    cold = {u for u in names.uids.get(worker, {}) if u != uid}
    assert not cold, f"a cold {worker} was created instead of promoting the spare"
    assert status["step"] == 400 and status["lastRestartReason"] == "NodeLost", status
    assert status["restartBudget"].get("used", 0) == 0  # a lost node is an external failure
    real.wait_phase(ref, "Succeeded", 1800)
    assert _params_hash(real, name) == _params_hash(real, ref)
