"""Drain ahead on the test cluster, driven by the real kubectl (issue 21): a worker's node gets a maintenance taint
mid-run; the operator asks every rank for a memory checkpoint, moves the worker to the warm spare once all answered
(lastRestartReason NodeDraining), and the job Succeeds with the fault-free run's parameters and no replayed step.
Without a spare the operator starts a warm pod for the drain first and moves the worker to it the same way."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from flywheel.contracts.labels import INDEX_LABEL
from tests.operator.conftest import KUBECTL, LONG, LONG_STEPS, OpEnv, eventually
from tests.operator.spare_jobs import node_of, train_with_a_ready_spare
from tests.operator.test_operator_cluster import _reference_hash
from tests.operator.timeline import timeline

pytestmark = pytest.mark.slow
TAINT = "nvidia.com/gpu-xid-error"  # NVSentinel's fatal-XID quarantine taint: one of the default drain keys
# The stall's bound (last step before the move -> first step after). The path takes ~1.3-1.4 s here (docs/operator.md,
# "Drain ahead": the ranks' answers ~0.1 s, the move ~0.1 s, the new rendezvous round ~0.6 s of 0.25 s polls, the
# ranks' warm start and memory restore ~0.4 s), and up to 5.9 s with the other test process and the real control
# plane busy on the 2 cores (CI). The regressions it must catch are waits, not slowness: the stopped agent's
# rendezvous heartbeat waited out (6 s more: 7.4 s before launch.py made it leave its round), a collective or
# rendezvous timeout, the 60 s drain timeout. Each adds 6 s or more to a path of 1.3 s or more, so 7 s catches every
# one of them at any load while the loaded path stays below it.
# (The cold-pod fallback is asserted apart: no new pod of the drained index.)
STALL_BOUND_S = 7.0
# Both workers on the drained node (the scheduler's choice): two spares promoted, a blocking disk save and a disk
# restore, the memory copies leaving with the pods (2.4-2.9 s here, idle); a wait adds 6 s or more to that.
STALL_BOUND_BOTH_S = 8.0
# Without a spare the drain first warms a new pod (pod start, imports, zygote: ~5 s on idle cores, over 13 s with the
# other test process busy), and the job must still be training once it is warm: 400 full-speed steps (~17 s) ended first
# under that load. That test's LONG job idles 0.12 s before each step: the 150 steps after the taint take over 18 s
# whatever the load (and it is the LONG reference run's job: no reference run of its own).
DRAINED_STEP_DELAY_S = 0.12


def _stall(records: list[dict[str, Any]], step: int) -> float:
    """Seconds from the last `step` record of the drained step to the first record of the step after it."""
    before = max(r["time"] for r in records if r["event"] == "step" and r["step"] == step)
    after = min(r["time"] for r in records if r["event"] == "step" and r["step"] == step + 1 and r["time"] > before)
    return after - before


@pytest.mark.heavy
def test_a_tainted_node_is_drained_ahead_to_the_spare_without_replay(op_env: OpEnv) -> None:
    name = "drain-run"
    spec = {"replicas.spares": 1, "checkpoint.memoryEverySteps": 10}
    worker = train_with_a_ready_spare(op_env, name, spec)
    node, index = node_of(op_env, name, worker), worker.rsplit("-", 1)[1]
    op_env.kubectl("taint", "node", node, f"{TAINT}=true:NoSchedule")
    try:
        eventually(lambda: _labels_of(op_env, name, f"{name}-spare-0").get(INDEX_LABEL) == index, 60,
                   f"the spare to take index {index}")
        status = op_env.wait_phase(name, "Succeeded", 180)
    finally:
        op_env.kubectl("taint", "node", node, f"{TAINT}-", check=False)
    assert status["step"] == LONG_STEPS and status["lastRestartReason"] == "NodeDraining", status
    assert status["restarts"] == 1 and status["goodput"].get("lostSteps", 0) == 0, status
    assert status["restartBudget"].get("used", 0) == 0  # a planned move is no failure
    # The promoted spare finished as that replica: no cold pod of the drained index was created behind it.
    assert worker not in {p["metadata"]["name"] for p in op_env.pods(name)}
    _no_replay_and_a_short_stall(op_env, name, node, _reference_hash(op_env))


@pytest.mark.heavy
def test_kubectl_drain_waits_on_the_jobs_budget_while_the_worker_moves_ahead(op_env: OpEnv) -> None:
    """`kubectl drain` of a worker's node: its cordon starts drain ahead, and its eviction of the worker is refused
    by the job's PodDisruptionBudget (429: kubectl retries every 5 s) until the operator has moved the worker to the
    spare after a memory checkpoint. The drain then completes; no step is lost or trained twice. (Without the
    budget the eviction came first: a cold restart, Evicted.) maxRestarts 0: the staying worker's ranks, stopped
    for the move's checkpoint, restart in place without a crash restart to spend (else it exited 6 and the job
    restarted whole from disk)."""
    name = "kdrain"
    worker = train_with_a_ready_spare(op_env, name, {"replicas.spares": 1, "checkpoint.memoryEverySteps": 10,
                                                     "faultTolerance.maxRestarts": 0})
    node = node_of(op_env, name, worker)
    budget = eventually(lambda: (b := json.loads(op_env.kubectl("get", "pdb", name, "-o", "json").stdout))
                        .get("status", {}).get("currentHealthy") == 2 and b, 30, "the budget to count both workers")
    assert budget["status"]["disruptionsAllowed"] == 0, budget
    drain = subprocess.Popen([str(KUBECTL), "--kubeconfig", str(op_env.cluster.kubeconfig), "drain", node,
                              "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=150s"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said, _ = drain.communicate(timeout=180)
        status = op_env.wait_phase(name, "Succeeded", 180)
    finally:
        drain.kill()
        op_env.kubectl("uncordon", node, check=False)
    assert drain.returncode == 0, said
    assert f'evicting pods/"{worker}"' in said and "violate the pod's disruption budget" in said, said
    assert status["step"] == LONG_STEPS and status["lastRestartReason"] == "NodeDraining", status
    assert status["restarts"] == 1 and status["goodput"].get("lostSteps", 0) == 0, status
    assert status["restartBudget"].get("used", 0) == 0, status
    _no_replay_and_a_short_stall(op_env, name, node, _reference_hash(op_env), cause="is cordoned")


@pytest.mark.heavy
def test_without_a_spare_a_drain_starts_a_warm_pod_first(op_env: OpEnv) -> None:
    """spares: 0. The drain starts a spare for the moving worker (the taint keeps it off the node) while the job
    trains on, asks for the checkpoint once it is warm, and moves the worker to it: no cold pod in the stall."""
    name = "drain-no-spare"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, step_delay_s=DRAINED_STEP_DELAY_S, **LONG,
                                                      **{"checkpoint.memoryEverySteps": 10})))
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    worker = f"{name}-worker-1"
    node = node_of(op_env, name, worker)
    moving = [p["metadata"]["name"] for p in op_env.pods(name) if p["spec"].get("nodeName") == node]
    op_env.kubectl("taint", "node", node, f"{TAINT}=true:NoSchedule")
    try:
        eventually(lambda: any(_labels_of(op_env, name, f"{name}-spare-{n}").get(INDEX_LABEL) == "1"
                               for n in range(len(moving))), 120, "a spare of the drain to take index 1")
        status = op_env.wait_phase(name, "Succeeded", 180)
    finally:
        op_env.kubectl("taint", "node", node, f"{TAINT}-", check=False)
    assert status["step"] == LONG_STEPS, status
    assert status["lastRestartReason"] == "NodeDraining", status
    assert status["restarts"] == 1 and status["restartBudget"].get("used", 0) == 0, status
    assert worker not in {p["metadata"]["name"] for p in op_env.pods(name)}
    draining = [e["message"] for e in op_env.events_of(name) if e["reason"] == "NodeDraining"]
    wait = f"waiting for {len(moving)} warm pod(s)"
    assert any(wait in m and f"{len(moving)} new spare" in m for m in draining), draining
    _no_replay_and_a_short_stall(op_env, name, node, _reference_hash(op_env),
                                 bound=STALL_BOUND_BOTH_S if len(moving) > 1 else STALL_BOUND_S)
    times = [r["time"] for r in op_env.records(name) if r["event"] == "step"]
    paces = sorted(b - a for a, b in zip(times, times[1:]))
    assert paces[len(paces) // 2] >= DRAINED_STEP_DELAY_S, "the step delay did not reach the ranks"


def _no_replay_and_a_short_stall(op_env: OpEnv, name: str, node: str, reference_hash: str,
                                 bound: float = STALL_BOUND_S, cause: str = TAINT) -> None:
    draining = [e["message"] for e in op_env.events_of(name) if e["reason"] == "NodeDraining"]
    assert any(node in m and cause in m for m in draining), draining
    assert op_env.status(name)["goodput"].get("lostSteps", 0) == 0
    assert op_env.done_hash(name) == reference_hash
    records = op_env.records(name)
    trained = [r["step"] for r in records if r["event"] == "step"]
    assert len(trained) == len(set(trained)), "a step was trained twice: the drain replayed steps"
    moved_at = next(int(m.split("step ")[1].split(";")[0]) for m in draining if "holds the checkpoint" in m)
    # Resumed at the checkpointed step: the first step of the new group is the one after it (0 replayed, and none
    # skipped), and the old group trained nothing past it.
    moved = max(r["time"] for r in records if r["event"] == "step" and r["step"] == moved_at)
    assert min(r["step"] for r in records if r["event"] == "step" and r["time"] > moved) == moved_at + 1
    # One group after the move, from its checkpoint: the moved worker's agent joined no round before its pod went
    # (agent/drain_hold.py; such a round trains on the leaving node, steps the move then throws away).
    # The ranks' start records: the agent logs its own start of each group too (source "agent").
    starts = [r.get("resumed_from") for r in records if r["event"] == "start" and r.get("source") != "agent"]
    assert starts == [None, moved_at], f"groups started (resumed from): {starts}"
    stall = _stall(records, moved_at)
    print(f"drain ahead: checkpoint at step {moved_at}, stall {stall:.2f}s (last step before -> first after)")
    if stall >= bound:
        before = max(r["time"] for r in records if r["event"] == "step" and r["step"] == moved_at)
        raise AssertionError(f"drain ahead stalled {stall:.2f}s (bound {bound}s); seconds from the last step before:\n"
                             + timeline(op_env, name, before - 3, before + stall + 1, zero=before))


def _labels_of(env: OpEnv, job: str, pod: str) -> dict[str, str]:
    found = [p for p in env.pods(job) if p["metadata"]["name"] == pod]
    return dict(found[0]["metadata"].get("labels") or {}) if found else {}
