"""Warm spares on the test cluster, driven by the real kubectl (issue 21): a job with `replicas.spares: 1` keeps a
spare pod running and registered; a deleted worker pod, and a worker on a lost node, are each replaced by promoting
that spare (relabelled to the lost index; no new worker pod in the critical path), a new spare is created behind it,
and the job trains to the same parameters as a fault-free run.

The lost node is the test cluster's (docs/test-cluster.md): its kubelet stops renewing the node's Lease and freezes
its pods' processes (SIGSTOP); the real node-lifecycle controller marks it unreachable, and its pods stay
Terminating (no kubelet finalizes them) until force-deleted. These jobs take no memory checkpoints and restore from
disk, as a real cluster's spare does. Its real-cluster twin: tests/e2e_real/test_real_spares_lost_node.py."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import pytest

from flywheel.contracts.labels import INDEX_LABEL, ROLE_LABEL
from flywheel.policy import reasons as R
from tests.operator.conftest import IDLE_STEP_S, LONG, LONG_STEPS, OpEnv, eventually
from tests.operator.spare_jobs import train_with_a_ready_spare
from tests.operator.test_operator_cluster import _columns, _reference_hash

pytestmark = pytest.mark.slow


def _labels(env: OpEnv, pod: str) -> dict[str, str]:
    found = [p for p in env.pods(pod.rsplit("-", 2)[0]) if p["metadata"]["name"] == pod]
    return dict(found[0]["metadata"].get("labels") or {}) if found else {}


class JobPods(Protocol):
    def pods(self, name: str) -> list[dict[str, Any]]: ...


class PodNames:
    """Every pod name of a job seen while it runs (polled): was a pod created that the test must not see? `uids`
    keeps each name's pod uids, first seen when (wall time). `env`: the test cluster's OpEnv or a real cluster's."""

    def __init__(self, env: JobPods, job: str, interval: float = 0.2) -> None:
        self.env, self.job, self.seen, self.stop = env, job, set(), threading.Event()  # type: ignore[var-annotated]
        self.interval = interval
        self.uids: dict[str, dict[str, float]] = {}
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                pods = self.env.pods(self.job)
            except Exception:  # noqa: BLE001 (a kubectl hiccup: the next poll sees it)
                continue
            now = time.time()
            for p in pods:
                self.seen.add(p["metadata"]["name"])
                self.uids.setdefault(p["metadata"]["name"], {}).setdefault(p["metadata"]["uid"], now)

    def close(self) -> set[str]:
        self.stop.set()
        self.thread.join(5)
        return self.seen


@pytest.mark.heavy
def test_a_deleted_worker_is_replaced_by_the_warm_spare(op_env: OpEnv) -> None:
    name = "spare-run"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"replicas.spares": 1})))
    # The spare runs, its agent registered as a ready spare: status.spares and the Spares column count it.
    eventually(lambda: op_env.status(name).get("spares") == 1, 120, "the spare to be ready")
    spare: dict[str, Any] = next(p for p in op_env.pods(name) if p["metadata"]["name"] == f"{name}-spare-0")
    assert spare["metadata"]["labels"][ROLE_LABEL] == "spare" and INDEX_LABEL not in spare["metadata"]["labels"]
    assert _columns(op_env, name)["SPARES"] == "1"
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    names = PodNames(op_env, name)
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--grace-period=0", "--force")
    eventually(lambda: _labels(op_env, f"{name}-spare-0").get(INDEX_LABEL) == "1", 30, "the spare to take index 1")
    assert _labels(op_env, f"{name}-spare-0")[ROLE_LABEL] == "worker"
    eventually(lambda: any(p["metadata"]["name"] == f"{name}-spare-1" for p in op_env.pods(name)), 30,
               "a new spare behind the promoted one")
    status = op_env.wait_phase(name, "Succeeded", 180)
    seen = names.close()
    assert f"{name}-worker-1" not in seen, "a cold worker pod was created instead of promoting the spare"
    assert status["step"] == LONG_STEPS and status["restarts"] == 1 and status["lastRestartReason"] == "PodDeleted"
    events = [e for e in op_env.events_of(name) if e["reason"] == "SparePromoted"]
    # Force-deleted with grace 0, the old pod was gone before the pass that promoted: the event cannot name it.
    assert events and events[0]["message"] == f"spare {name}-spare-0 took replica 1 (its worker lost: PodDeleted)"
    assert op_env.done_hash(name) == _reference_hash(op_env)
    # Spares go with the finished job; none is left running.
    eventually(lambda: not [p for p in op_env.pods(name) if p["metadata"]["labels"].get(ROLE_LABEL) == "spare"
                            and p["status"].get("phase") in ("Pending", "Running")], 30, "the spares to go")


def _first_step_after(records: list[dict[str, Any]], t: float) -> float | None:
    """The time of the first step trained by a group (re)started after `t` (a step the old group logged in flight
    just after `t` does not count), None while there is none."""
    starts = [r["time"] for r in records if r["event"] == "start" and r["time"] > t]
    if not starts:
        return None
    return min((r["time"] for r in records if r["event"] == "step" and r["time"] > min(starts)), default=None)


@pytest.mark.heavy
def test_a_lost_node_is_replaced_by_the_warm_spare(op_env: OpEnv) -> None:
    name = "spare-lost"
    spec = {"replicas.spares": 1, "faultTolerance.nodeFailureGraceSeconds": 3}
    worker = train_with_a_ready_spare(op_env, name, spec)
    lost = next(p for p in op_env.pods(name) if p["metadata"]["name"] == worker)
    node, uid, index = lost["spec"]["nodeName"], lost["metadata"]["uid"], worker.rsplit("-", 1)[1]
    names = PodNames(op_env, name)
    lost_at = time.time()
    op_env.cluster.kubelet.lose_node(node)
    try:
        # The etcd liveness key of the frozen agent expires (its TTL): the operator promotes the spare at once and
        # force-deletes the lost pod after nodeFailureGraceSeconds.
        eventually(lambda: _labels(op_env, f"{name}-spare-0").get(INDEX_LABEL) == index, 60,
                   f"the spare to take index {index}")
        assert _labels(op_env, f"{name}-spare-0")[ROLE_LABEL] == "worker"
        eventually(lambda: all(p["metadata"]["uid"] != uid for p in op_env.pods(name)), 60,
                   "the lost pod to be force-deleted")
        first_after = eventually(lambda: _first_step_after(op_env.records(name), lost_at), 60,
                                 "a step after the node was lost", interval=0.1)
        eventually(lambda: any(p["metadata"]["name"] == f"{name}-spare-1" for p in op_env.pods(name)), 30,
                   "a new spare behind the promoted one")
    finally:
        # Back once the job trains without it: its frozen processes resume, and those of deleted pods are killed.
        op_env.cluster.kubelet.restore_node(node)
    status = op_env.wait_phase(name, "Succeeded", 180)
    names.close()
    # No cold pod of the lost index at all, so none before the first step after the loss (the critical path).
    cold = {u: t for u, t in names.uids.get(worker, {}).items() if u != uid}
    assert not cold, f"a cold {worker} was created (first seen {cold}; first step after the loss at {first_after})"
    assert status["step"] == LONG_STEPS and status["restarts"] == 1, status
    assert status["lastRestartReason"] == "NodeLost", status
    assert status["restartBudget"].get("used", 0) == 0  # a lost node is an external failure
    events = [e["message"] for e in op_env.events_of(name) if e["reason"] == R.SPARE_PROMOTED]
    # The lost pod was still there (stuck Terminating on the frozen node) when the spare was promoted.
    assert events == [R.MSG_SPARE_PROMOTED.format(spare=f"{name}-spare-0", index=index, pod=worker,
                                                  reason="NodeLost")], events
    print(f"lost node {node}: spare promoted to {worker}; first step after {first_after - lost_at:.1f}s")
    assert op_env.done_hash(name) == _reference_hash(op_env)
    eventually(lambda: not [p for p in op_env.pods(name) if p["metadata"]["labels"].get(ROLE_LABEL) == "spare"
                            and p["status"].get("phase") in ("Pending", "Running")], 30, "the spares to go")


def test_a_spare_beside_a_worker_moves_to_a_node_that_frees_up(op_env: OpEnv) -> None:
    """node-2 cordoned at the start: both workers and the spare run on node-1. Uncordoned, node-2 holds no pod of
    the job: the operator starts a spare that may only run there and, once it is warm, lets the old spare go, so a
    loss of node-1 would no longer take the spare with the workers."""
    name = "spare-moves"
    op_env.kubectl("cordon", "node-2")
    try:
        op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, step_delay_s=IDLE_STEP_S, **{
            **LONG, "trainer.training.steps": 5000, "replicas.spares": 1})))
        eventually(lambda: op_env.status(name).get("spares") == 1, 120, "the spare to be ready")
        assert {p["spec"].get("nodeName") for p in op_env.pods(name)} == {"node-1"}
        eventually(lambda: op_env.last_step(name) >= 20, 120, f"{name} to train")
        assert op_env.status(name)["spareMove"]["spare"] == -1  # no usable node free: no move
    finally:
        op_env.kubectl("uncordon", "node-2")
    eventually(lambda: any(e["reason"] == R.SPARE_MOVED for e in op_env.events_of(name)), 120, "the spare to move")

    def spares() -> list[dict[str, Any]]:
        return [p for p in op_env.pods(name) if p["metadata"]["labels"].get(ROLE_LABEL) == "spare"
                and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]
    eventually(lambda: [p["metadata"]["name"] for p in spares()] == [f"{name}-spare-1"], 60, "the old spare to go")
    moved = spares()[0]
    assert moved["spec"]["nodeName"] == "node-2"
    terms = moved["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                           "values": ["node-2"]}]}]
    status = op_env.status(name)
    assert status["spares"] == 1 and status["spareMove"]["spare"] == -1 and status["phase"] == "Running", status
    assert status.get("restarts", 0) == 0  # moving a spare interrupts no training
    message = next(e["message"] for e in op_env.events_of(name) if e["reason"] == R.SPARE_MOVED)
    assert message == R.MSG_SPARE_MOVED.format(new=f"{name}-spare-1", node="node-2", old=f"{name}-spare-0",
                                               old_node="node-1")
    op_env.kubectl("delete", "tj", name, "--wait=false")
