"""The operator as the chart starts it by default: etcd endpoints, no --events-dir, no Prometheus. Step,
checkpoint and goodput reach the status through the workers' etcd progress record, a job resumed at its last step
says it was already complete, and a job whose ranks are all SIGSTOPped is marked Hung and restarted from that
record alone -- in place, its agents being alive."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.fixtures import start_cluster
from tests.operator.conftest import KUBECTL, OpEnv, OperatorProcess, eventually, operator_running
from tests.rank_processes import alive, trainer_ranks

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def etcd_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpEnv]:
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    tmp = tmp_path_factory.mktemp("etcd-only")
    cluster = start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=3.0, heartbeat_seconds=0.5)
    cluster.add_claim("flywheel-ckpt")  # the example's checkpoint claim: kube-scheduler places no pod without it
    operator = OperatorProcess(cluster, None, tmp / "operator.log")  # no events dir; --no-health-monitor
    with operator_running(cluster, operator):
        yield OpEnv(cluster, operator, tmp / "no-events", tmp)


def test_status_fills_from_etcd_without_an_events_dir(etcd_only: OpEnv) -> None:
    env, name = etcd_only, "etcd-status"
    env.kubectl("apply", "-f", str(env.job_yaml(name, **{"trainer.training.steps": 200})))
    try:
        seen: set[int] = set()

        def finished() -> bool:
            status = env.status(name)
            if status.get("phase") == "Running":
                seen.add(int(status.get("step", 0)))
            return status.get("phase") in ("Succeeded", "Failed")

        eventually(finished, 300, f"{name} to finish", interval=0.3)
        status = env.status(name)
        assert status["phase"] == "Succeeded", status
        assert len({s for s in seen if 0 < s < 200}) >= 2, f"status.step did not rise while training: {seen}"
        assert status["step"] == 200
        assert status["lastCheckpoint"]["step"] == 200 and status["lastCheckpoint"]["path"]
        assert status["goodput"]["ratio"] > 0 and status["goodput"]["productiveSeconds"] > 0
        done = next(c for c in status["conditions"] if c["type"] == "Succeeded")
        assert "step 200" in done["message"], done
        assert not env.events_file(name).exists()  # nothing came through an event log
    finally:
        env.delete(name)


def test_a_job_resuming_at_its_last_step_says_already_complete_without_an_events_dir(etcd_only: OpEnv) -> None:
    """A second job naming the first's checkpoint dir resumes at its last step and trains nothing: its condition
    and `kubectl describe` say so with the checkpoint, from the etcd progress record alone."""
    env = etcd_only
    env.kubectl("apply", "-f", str(env.job_yaml("etcd-first", **{"trainer.training.steps": 30,
                                                                 "checkpoint.everySteps": 10})))
    try:
        assert env.wait_phase("etcd-first", "Succeeded", 300)["step"] == 30
        directory = env.job("etcd-first")["spec"]["checkpoint"]["dir"]
        env.kubectl("apply", "-f", str(env.job_yaml("etcd-again", **{"trainer.training.steps": 30,
                                                                     "checkpoint.dir": directory})))
        done = env.wait_phase("etcd-again", "Succeeded", 300)
        said = f"already complete at step 30 (checkpoint {directory}/step-00000030)"
        assert said in next(c for c in done["conditions"] if c["type"] == "Succeeded")["message"], done
        assert said in env.kubectl("describe", "tj", "etcd-again").stdout
    finally:
        env.delete("etcd-first")
        env.delete("etcd-again")


def test_a_damaged_checkpoint_is_a_warning_event_without_an_events_dir(etcd_only: OpEnv) -> None:
    """A job resuming from a dir whose newest checkpoint was damaged after its commit skips it for the previous one
    and says so where the user looks: a CheckpointDamaged Warning in `kubectl describe`, through etcd alone."""
    env = etcd_only
    env.kubectl("apply", "-f", str(env.job_yaml("etcd-damaged", **{"trainer.training.steps": 20,
                                                                   "checkpoint.everySteps": 10,
                                                                   "checkpoint.keep": 2})))
    try:
        assert env.wait_phase("etcd-damaged", "Succeeded", 300)["step"] == 20
        directory = Path(env.job("etcd-damaged")["spec"]["checkpoint"]["dir"])
        shard = next((directory / "step-00000020").glob("__0_*.distcp"))
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        shard.write_bytes(bytes(raw))
        env.kubectl("apply", "-f", str(env.job_yaml("etcd-resumed", **{"trainer.training.steps": 30,
                                                                       "checkpoint.dir": str(directory)})))
        done = env.wait_phase("etcd-resumed", "Succeeded", 300)
        assert done["step"] == 30 and done["lastRestore"] == {"source": "disk", "step": 10}, done
        warnings = eventually(lambda: [e for e in env.events_of("etcd-resumed") if e["reason"] == "CheckpointDamaged"],
                              30, "the CheckpointDamaged event")
        assert "checkpoint at step 20 is damaged" in warnings[0]["message"] and warnings[0]["type"] == "Warning"
        assert shard.name in warnings[0]["message"]
        assert "CheckpointDamaged" in env.kubectl("describe", "tj", "etcd-resumed").stdout
    finally:
        env.delete("etcd-damaged")
        env.delete("etcd-resumed")


def _stop_ranks(env: OpEnv, pod: str) -> list[int]:
    """SIGSTOP every rank process of the pod; the agent runs on and keeps its liveness lease, so only the missing
    steps can tell."""
    assert env.cluster.kubelet is not None
    agent = env.cluster.kubelet.pid_of("default", pod)
    assert agent is not None, f"{pod} has no process"
    ranks = trainer_ranks(agent)
    assert ranks, f"{pod}: no rank processes below the agent {agent}"
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    return ranks


def test_stopped_ranks_are_marked_hung_and_restarted_in_place_without_prometheus(etcd_only: OpEnv) -> None:
    """Every worker's agent is alive: the ranks are restarted in place (the same pods, relabelled to the new
    generation), counted once although each agent reports the restart it was asked for, and the job finishes."""
    env, name, steps = etcd_only, "etcd-hang", 120
    env.kubectl("apply", "-f", str(env.job_yaml(name, **{
        "trainer.training.steps": steps, "faultTolerance.progressTimeoutSeconds": 4,
        "faultTolerance.firstStepTimeoutSeconds": 120, "faultTolerance.budgetResetAfterSteps": 5})))
    stopped: list[int] = []
    try:
        eventually(lambda: env.status(name).get("lastCheckpoint", {}).get("step", 0) >= 10, 200,
                   f"{name} to commit a checkpoint at step >= 10", interval=0.5)
        pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in env.pods(name)}
        assert len(pods) == 2
        began = time.time()
        for i in range(2):  # every worker's ranks: no rank's own watchdog can end it, only the operator
            stopped += _stop_ranks(env, f"{name}-worker-{i}")
        status = eventually(lambda: (s := env.status(name)).get("lastRestartReason") == "Hung" and s, 60,
                            "a restart for the hang")
        detected = time.time() - began
        assert status["restarts"] == 1 and status["inPlaceRestartGeneration"] == 1, status
        hung = next(c for c in status["conditions"] if c["type"] == "Hung")
        assert "etcd progress" in hung["message"] and "progressTimeoutSeconds" in hung["message"], hung
        assert detected < 4 + 10, f"hang seen after {detected:.1f} s"
        # The budget window opened at the last committed checkpoint, which only etcd reported.
        budget = status["restartBudget"]
        assert budget["windowStartStep"] == status["lastCheckpoint"]["step"] > 0, status
        # The pods keep running (Running at once); a step past the one the ranks hung at is the new group's.
        hung_at = status["step"]
        eventually(lambda: env.status(name).get("phase") == "Running" and env.status(name).get("step", 0) > hung_at,
                   200, "training again after the restart", interval=0.5)
        # In place: the same pods, now of generation 1; the stopped ranks were killed, not left behind.
        after = env.pods(name)
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after} == pods
        assert {p["metadata"]["labels"]["flywheel.dev/generation"] for p in after} == {"1"}
        assert not [pid for pid in stopped if alive(pid)]
        restarting = [e["message"] for e in env.events_of(name) if e["reason"] == "Restarting"]
        assert restarting and "RestartRanksInPlace" in restarting[-1], restarting
        # Each agent reported the restart it was asked for in its liveness key: taken as the decided one.
        reported = eventually(lambda: sorted((s := env.status(name)).get("rankRestarts", {}).values()) == [1, 1]
                              and s, 30, "both agents' reports of their restart")
        assert reported["restarts"] == 1, reported
        final = env.wait_phase(name, "Succeeded", 300)
        assert final["step"] == steps and final["restarts"] == 1 and final["lastRestartReason"] == "Hung", final
    finally:
        for pid in stopped:  # let anything left end normally
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        env.delete(name)
