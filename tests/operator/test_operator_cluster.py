"""The operator end to end on the test cluster, driven by the real kubectl: success, a killed worker (exact
recovery), a killed operator (many times), invalid specs, and a lost node."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import pytest

from flywheel.contracts.timefmt import parse_rfc3339
from tests.operator.conftest import LONG_STEPS, OpEnv, eventually, node_tainted, worker_node

CHAOS_STEPS = 300  # paced (~20 s): still training through the ten operator kills (~13-23 s)
_REFERENCE: dict[str, str] = {}  # params hash of the fault-free LONG run, shared by the tests of this module


def _reference_hash(env: OpEnv) -> str:
    if "hash" not in _REFERENCE:
        if env.kubectl("get", "tj", "ref-run", check=False).returncode != 0:
            env.kubectl("apply", "-f", str(env.long_job_yaml("ref-run")))
        env.wait_phase("ref-run", "Succeeded", 180)
        _REFERENCE["hash"] = env.done_hash("ref-run")
    return _REFERENCE["hash"]


def _columns(env: OpEnv, name: str) -> dict[str, str]:
    header, row = env.kubectl("get", "tj", name).stdout.splitlines()[:2]
    return dict(zip(header.split(), row.split()))


def test_tiny_job_succeeds_with_columns_and_events(op_env: OpEnv) -> None:
    op_env.kubectl("apply", "-f", str(op_env.job_yaml("tiny-ok")))
    status = op_env.wait_phase("tiny-ok", "Succeeded", 120)
    assert status["step"] == 30 and status["restarts"] == 0 and status["worldSize"] == 2
    assert status["lastCheckpoint"]["step"] == 30 and status["lastCheckpoint"]["path"].endswith("step-00000030")
    assert 0 < status["goodput"]["ratio"] <= 1 and status["goodput"]["lostSteps"] == 0
    cols = _columns(op_env, "tiny-ok")
    assert (cols["PHASE"], cols["READY"], cols["DESIRED"], cols["STEP"], cols["RESTARTS"]) == \
        ("Succeeded", "0", "2", "30", "0")
    pods = op_env.pods("tiny-ok")
    assert sorted(p["metadata"]["name"] for p in pods) == ["tiny-ok-worker-0", "tiny-ok-worker-1"]
    for p in pods:
        assert p["spec"]["subdomain"] == "tiny-ok-workers" and p["spec"]["hostname"] == p["metadata"]["name"]
        assert p["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
        env = {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
        assert env["PET_RDZV_BACKEND"] == "etcd-v3" and env["PET_NNODES"] == "2:2"
    op_env.kubectl("get", "service", "tiny-ok-workers")
    describe = op_env.kubectl("describe", "tj", "tiny-ok").stdout
    assert "TrainingSucceeded" in describe and "WorkersRunning" in describe and "Created" in describe
    # Up to six checkpoints (every 5 steps; an async one still writing when the next is due is skipped) in a few
    # seconds: the first at once, the rest coalesced into the event that finishing flushes; together they stand for
    # every checkpoint in the event log.
    committed = len([r for r in op_env.records("tiny-ok") if r["event"] == "checkpoint"])
    def checkpoint_events() -> list[dict[str, Any]]:
        found = [e for e in op_env.events_of("tiny-ok") if e["reason"] == "CheckpointCommitted"]
        return found if sum(e["count"] for e in found) == committed else []
    found = eventually(checkpoint_events, 10, "CheckpointCommitted events for every checkpoint")
    assert any(e["message"].startswith("checkpoint at step 30 committed to ") for e in found)
    assert 1 <= len(found) <= 2 and all(e["type"] == "Normal" for e in found)


@pytest.mark.heavy
def test_killed_worker_recovers_to_the_fault_free_parameters(op_env: OpEnv) -> None:
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml("ref-run")))
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml("kill-run")))
    # Kill worker 1's agent (its ranks die with it) once the run is past its first checkpoints.
    eventually(lambda: op_env.last_step("kill-run") >= 50, 120, "kill-run to pass step 50", interval=0.05)
    pid = op_env.cluster.kubelet.pid_of("default", "kill-run-worker-1")
    assert pid
    # The decision's status write meets stale-resourceVersion conflicts and every watch stream ends: the pass is
    # redone from fresh observations, and the failure is still decided exactly once.
    op_env.cluster.api.force_conflict("trainingjobs", "default", "kill-run", group="flywheel.dev", count=2)
    os.kill(pid, signal.SIGKILL)
    op_env.cluster.api.drop_watches()
    killed_at = op_env.last_step("kill-run")
    # 36-51 s here in a full run, once 163 s (cause not found; its logs were gone): the bound is for a hang, not a pace.
    status = op_env.wait_phase("kill-run", "Succeeded", 300)
    events = [f"{e['reason']}: {e['message']}" for e in op_env.events_of("kill-run")]
    # Killed: the pod's exit 137 decided it. On a host loaded enough that the kubelet reports the exit later than
    # the dead agent's etcd key lapses (its 3 s TTL + 1 s), the key decides first: NodeLost. Either way, once.
    reason = status["lastRestartReason"]
    assert status["restarts"] == 1 and reason in ("Killed", "NodeLost"), (status, events)
    metrics = op_env.operator.metrics()
    assert f'flywheel_job_restarts_total{{job="kill-run",namespace="default",reason="{reason}"}} 1.0' in metrics
    assert 'flywheel_operator_reconcile_duration_seconds_count{result="ok"}' in metrics
    assert 'flywheel_operator_jobs{namespace="default",phase="Succeeded"}' in metrics
    # The kill was detected (container end -> decision) and recovered from (last step -> first step after).
    assert f'flywheel_operator_time_to_detect_seconds_count{{reason="{reason}"}} 1.0' in metrics
    assert f'flywheel_operator_time_to_recover_seconds_count{{reason="{reason}"}} 1.0' in metrics
    assert status["step"] == LONG_STEPS and status["goodput"]["lostSteps"] >= 1
    assert status["goodput"]["meanTimeToRecoverSeconds"] > 0
    assert op_env.done_hash("kill-run") == _reference_hash(op_env)
    restores = [r for r in op_env.records("kill-run") if r["event"] == "restore"]
    assert restores and restores[-1]["step"] <= killed_at
    assert "Restarting" in op_env.kubectl("describe", "tj", "kill-run").stdout


@pytest.mark.heavy
@pytest.mark.slow
def test_force_deleted_pod_is_replaced_and_the_agents_recover(op_env: OpEnv) -> None:
    """A pod deleted behind the operator's back (kubectl delete --force) is recreated at once and counted as the
    interruption it was (PodDeleted, outside the restart budget: nothing failed), the surviving agent
    re-rendezvouses with the newcomer and training resumes exactly."""
    name = "deleted-pod"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name)))
    eventually(lambda: op_env.last_step(name) >= 50, 120, "deleted-pod to pass step 50", interval=0.05)
    old = op_env.cluster.kubelet.pid_of("default", f"{name}-worker-1")
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--grace-period=0", "--force")
    eventually(lambda: (pid := op_env.cluster.kubelet.pid_of("default", f"{name}-worker-1")) and pid != old, 30,
               "the replacement worker process")
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == LONG_STEPS and status["restarts"] == 1 and status["lastRestartReason"] == "PodDeleted"
    assert status["restartBudget"]["used"] == 0
    assert any(r["event"] == "restore" for r in op_env.records(name))
    assert op_env.done_hash(name) == _reference_hash(op_env)


def _restart_etcd(env: OpEnv, down_seconds: float) -> None:
    """Stop the cluster's etcd and start it again on the same ports and data dir (tests/etcd_process.py)."""
    etcd = env.cluster.rendezvous
    assert etcd is not None
    etcd.restart(down_seconds)


@pytest.mark.slow
def test_etcd_restart_mid_run_is_survived(op_env: OpEnv) -> None:
    name = "etcd-restart"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name)))
    eventually(lambda: op_env.last_step(name) >= 50, 120, "etcd-restart to pass step 50", interval=0.05)
    _restart_etcd(op_env, down_seconds=2.0)
    at_restart = op_env.last_step(name)
    eventually(lambda: op_env.last_step(name) > at_restart + 20, 60, "training to go on after the etcd restart")
    status = op_env.wait_phase(name, "Succeeded", 180)
    # etcd keeps leases across a restart: no worker looked dead, nothing was restarted.
    assert status["restarts"] == 0 and status["step"] == LONG_STEPS
    assert op_env.done_hash(name) == _reference_hash(op_env)


@pytest.mark.heavy
def test_operator_killed_ten_times_no_duplicates_and_converges(op_env: OpEnv) -> None:
    name = "op-chaos"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"trainer.training.steps": CHAOS_STEPS})))
    rng = random.Random(7)
    seen_uids: dict[str, set[str]] = {}
    kills = 0
    deadline = time.monotonic() + 150
    try:
        while kills < 10 and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 1.8))
            op_env.operator.kill()
            kills += 1
            for p in op_env.pods(name):
                seen_uids.setdefault(p["metadata"]["name"], set()).add(p["metadata"]["uid"])
                active = [q for q in op_env.pods(name) if q["metadata"]["name"] == p["metadata"]["name"]]
                assert len(active) == 1
            time.sleep(rng.uniform(0.0, 0.5))
            op_env.operator.start()
    finally:
        if op_env.operator.proc is None or op_env.operator.proc.poll() is not None:
            op_env.operator.start()
    assert kills >= 10
    status = op_env.wait_phase(name, "Succeeded", 180)
    for p in op_env.pods(name):
        seen_uids.setdefault(p["metadata"]["name"], set()).add(p["metadata"]["uid"])
    # No fault hit the workers: operator restarts must neither restart the job nor create a second pod.
    assert status["restarts"] == 0 and status["step"] == CHAOS_STEPS
    assert {n: len(u) for n, u in seen_uids.items()} == {f"{name}-worker-0": 1, f"{name}-worker-1": 1}
    # Events go out after the status write that decided them: an operator killed in between loses one, but none
    # is ever sent twice.
    reasons = [e["reason"] for e in op_env.events_of(name)]
    assert reasons.count("Created") <= 1 and reasons.count("TrainingSucceeded") <= 1 and "Restarting" not in reasons


def test_invalid_jobs_rejected_by_crd_or_marked_invalid(op_env: OpEnv) -> None:
    bad_crd = op_env.kubectl("apply", "-f", str(op_env.job_yaml("bad-minmax", **{"replicas.min": 3})), check=False)
    assert bad_crd.returncode != 0 and "replicas: min is greater than max; set min <= max" in bad_crd.stderr
    # An unknown model preset is a plain string to the CRD schema; the operator's parse rejects it.
    op_env.kubectl("apply", "-f", str(op_env.job_yaml("bad-preset", **{"trainer.model.preset": "gpt-huge"})))
    status = op_env.wait_phase("bad-preset", "Failed", 30)
    invalid = [c for c in status["conditions"] if c["type"] == "Invalid"]
    assert invalid and invalid[0]["status"] == "True" and "gpt-huge" in invalid[0]["message"]
    assert op_env.pods("bad-preset") == []
    assert "InvalidSpec" in op_env.kubectl("describe", "tj", "bad-preset").stdout
    assert op_env.operator.proc is not None and op_env.operator.proc.poll() is None  # never crashed


@pytest.mark.heavy
@pytest.mark.slow
def test_lost_node_pod_force_deleted_and_replaced(op_env: OpEnv) -> None:
    name = "lose-node"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"faultTolerance.nodeFailureGraceSeconds": 3})))
    eventually(lambda: op_env.last_step(name) >= 40, 120, "lose-node to pass step 40", interval=0.05)
    victim = next(p for p in op_env.pods(name) if p["metadata"]["name"].endswith("-1"))
    node, uid = victim["spec"]["nodeName"], victim["metadata"]["uid"]
    op_env.cluster.kubelet.lose_node(node)
    lost_at = time.monotonic()
    try:
        def replaced() -> bool:
            pods = {p["metadata"]["name"]: p for p in op_env.pods(name)}
            new = pods.get(f"{name}-worker-1")
            return new is not None and new["metadata"]["uid"] != uid
        eventually(replaced, 60, "the worker on the lost node to be replaced")
        detect_and_replace = time.monotonic() - lost_at
    finally:
        op_env.cluster.kubelet.restore_node(node)
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["restarts"] >= 1 and status["lastRestartReason"] == "NodeLost"
    assert detect_and_replace < 5 + 3 + 10  # liveness TTL 5 s + grace 3 s + passes
    assert "ForceDeleted" in op_env.kubectl("describe", "tj", name).stdout


def _ts(text: str) -> float:
    value = parse_rfc3339(text)
    assert value is not None
    return value


def _failed_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Failed")


def test_invalid_image_name_fails_the_job_at_once(op_env: OpEnv) -> None:
    """The kubelet reports InvalidImageName for a name that is no image reference (the process kubelet's images.py): the
    job fails at once, naming the worker, the reason and the fix, instead of waiting Pending for ever."""
    name = "bad-image"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, image="Flywheel:Latest")))
    status = op_env.wait_phase(name, "Failed", 30)
    failed = _failed_condition(status)
    assert failed["reason"] == "ImagePullError" and "InvalidImageName" in failed["message"]
    assert "invalid reference format" in failed["message"] and "spec.image" in failed["message"]
    assert not any(c["type"] == "Running" and c["status"] == "True" for c in status["conditions"])
    assert status.get("restarts", 0) == 0 and _columns(op_env, name)["PHASE"] == "Failed"
    assert "ImagePullError" in op_env.kubectl("describe", "tj", name).stdout
    eventually(lambda: op_env.pods(name) == [], 30, "the workers that cannot start to be deleted")


@pytest.mark.slow
def test_unpullable_image_fails_after_the_pull_grace(op_env: OpEnv) -> None:
    """A registry that cannot be reached (ErrImagePull, then ImagePullBackOff, retried) is given the job's
    faultTolerance.startFailureGraceSeconds in case it is a blip, then the job fails with the same clear condition.
    The process kubelet backs off 1 s, 2 s, 4 s, ... (the process kubelet's images.py): both reasons show within ~2 s of
    the pod's start, well inside a 10 s grace (the default 60 s would only make this test slow)."""
    grace = 10
    name = "no-pull"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **{"image": "registry.invalid/flywheel:latest",
                                                               "faultTolerance.startFailureGraceSeconds": grace})))
    reasons: set[str] = set()

    def waiting_reasons() -> set[str]:
        for p in op_env.pods(name):
            for cs in p["status"].get("containerStatuses") or []:
                reasons.add(((cs.get("state") or {}).get("waiting") or {}).get("reason", ""))
        return reasons >= {"ErrImagePull", "ImagePullBackOff"} and reasons
    eventually(waiting_reasons, 30, "the kubelet to report ErrImagePull and ImagePullBackOff")
    started = min(_ts(p["status"]["startTime"]) for p in op_env.pods(name))
    assert op_env.status(name)["phase"] == "Pending"
    status = op_env.wait_phase(name, "Failed", grace + 30)
    failed = _failed_condition(status)
    assert failed["reason"] == "ImagePullError" and "registry.invalid" in failed["message"]
    assert _ts(failed["lastTransitionTime"]) - started >= grace - 1
    # The kubelet's own Warning events, as `kubectl describe pod` shows them.
    assert any("ErrImagePull" in e["message"] and e["type"] == "Warning" for e in op_env.events_of(f"{name}-worker-0"))


@pytest.mark.slow
def test_preempted_worker_is_an_external_failure(op_env: OpEnv) -> None:
    """A pod marked DisruptionTarget (as the scheduler does when it preempts it) and deleted: a restart with reason
    Evicted that spends no budget -- with maxRestarts 0 a charged restart would fail the job."""
    name = "preempted"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"faultTolerance.maxRestarts": 0})))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    victim = f"{name}-worker-1"
    pod = next(p for p in op_env.pods(name) if p["metadata"]["name"] == victim)
    target = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
              "message": "default-scheduler: preempting to accommodate a higher priority pod",
              "lastTransitionTime": pod["status"]["conditions"][0]["lastTransitionTime"]}
    conditions = [c for c in pod["status"]["conditions"] if c["type"] != "DisruptionTarget"] + [target]
    op_env.kubectl("patch", "pod", victim, "--subresource=status", "--type=merge", "-p",
                   json.dumps({"status": {"conditions": conditions}}))
    op_env.kubectl("delete", "pod", victim, "--wait=false")
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "Evicted"
    assert status["restartBudget"]["used"] == 0 and status["step"] == LONG_STEPS
    assert "DisruptionTarget: PreemptionByScheduler" in op_env.kubectl("describe", "tj", name).stdout


@pytest.mark.slow
def test_kubectl_drain_evicts_a_worker_without_spending_budget(op_env: OpEnv) -> None:
    """`kubectl drain` (a node's maintenance, as an administrator does it): the cordon, then the Eviction API, which
    marks the pod DisruptionTarget (EvictionByEvictionAPI) before deleting it. The job restarts once with reason
    Evicted, spends no budget (maxRestarts 0), replays no step (the evicted worker's SIGTERM has every rank save the
    step they reached) and ends with the fault-free run's parameters. The job's PodDisruptionBudget is deleted
    first (an administrator's way to let evictions through at once; with it, test_drain_cluster's drain waits for
    drain ahead), and the operator does not put it back."""
    name = "drained"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"faultTolerance.maxRestarts": 0})))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    node = worker_node(op_env.pods(name), f"{name}-worker-1")
    op_env.kubectl("delete", "pdb", name)
    try:
        drained = op_env.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s")
        assert f"pod/{name}-worker-1 evicted" in drained.stdout, drained.stdout  # evicted, not deleted
        status = op_env.wait_phase(name, "Succeeded", 180)
    finally:
        op_env.kubectl("uncordon", node, check=False)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "Evicted", status
    assert status["restartBudget"]["used"] == 0 and status["step"] == LONG_STEPS
    assert status["goodput"]["lostSteps"] == 0, status["goodput"]
    assert "DisruptionTarget: EvictionByEvictionAPI" in op_env.kubectl("describe", "tj", name).stdout
    assert op_env.done_hash(name) == _reference_hash(op_env)


def test_a_no_execute_taint_evicts_a_worker_without_spending_budget(op_env: OpEnv) -> None:
    """A NoExecute taint on a worker's node (an administrator's, or a remediation tool's): the taint manager marks
    the pod DisruptionTarget (DeletionByTaintManager) and deletes it gracefully. As for a drain: one restart with
    reason Evicted, no budget spent (maxRestarts 0), no step replayed, the fault-free run's parameters."""
    name = "tainted"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"faultTolerance.maxRestarts": 0})))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    with node_tainted(op_env.kubectl, worker_node(op_env.pods(name), f"{name}-worker-1"),
                      "example.com/maintenance=now:NoExecute"):
        status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "Evicted", status
    assert status["restartBudget"]["used"] == 0 and status["step"] == LONG_STEPS
    assert status["goodput"]["lostSteps"] == 0, status["goodput"]
    assert "DisruptionTarget: DeletionByTaintManager" in op_env.kubectl("describe", "tj", name).stdout
    assert op_env.done_hash(name) == _reference_hash(op_env)
