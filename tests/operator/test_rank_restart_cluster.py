"""A rank restarted in place by its worker's elastic agent shows in the status, on the test cluster: rank 1 is
SIGKILLed once (an injected fault), the agent restarts the ranks without its pod failing, the operator (etcd
only, as the chart starts it) counts it once in status.restarts with lastRestartReason RankRestarted, and the job
Succeeds with the same pods. Rank 0's agent restarts its rank too (its collective failed with rank 1): the same
recovery, counted once."""

from __future__ import annotations

import json
import time

from tests.operator.conftest import OpEnv, eventually

KILL_STEP = 30
FAULTS = [{"id": "rank1-once", "kind": "kill", "rank": 1, "step": KILL_STEP}]


def test_a_rank_restart_in_place_is_counted_once_with_its_reason(op_env: OpEnv) -> None:
    op_env.operator.restart("--worker-env", f"FLYWHEEL_FAULTS={json.dumps(FAULTS)}")
    name = "rank-restart"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **{
        "trainer.training.steps": 80, "checkpoint.everySteps": 10, "faultTolerance.maxRestarts": 3})))
    first_pods = eventually(lambda: len(uids := {p["metadata"]["uid"] for p in op_env.pods(name)}) == 2 and uids,
                            120, f"{name}'s two pods")
    counted = eventually(lambda: (s := op_env.status(name)).get("restarts", 0) >= 1 and s, 180, "the rank restart")
    assert counted["lastRestartReason"] == "RankRestarted", counted
    assert counted["restarts"] == 1 and counted.get("workerGeneration", 0) == 0, counted
    status = op_env.wait_phase(name, "Succeeded", 240)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "RankRestarted", (
        status, [e["message"] for e in op_env.events_of(name)])
    assert {p["metadata"]["uid"] for p in op_env.pods(name)} == first_pods  # no pod was replaced
    time.sleep(3)  # later passes (the tick is 1 s) add nothing
    assert op_env.status(name)["restarts"] == 1
    events = [e for e in op_env.events_of(name) if e["reason"] == "RankRestarted"]
    # Rank 0's collective failed with rank 1 and its agent restarted it too: the same recovery, counted once.
    assert len(events) == 1 and "rank 1: killed by SIGKILL" in events[0]["message"], events
    assert sorted(status["rankRestarts"].values()) in ([1], [1, 1]), status
    assert "RankRestarted" in op_env.kubectl("describe", "tj", name).stdout
    op_env.delete(name)
