"""Pure planning and policy decisions, tested over plain data."""

import json
import signal

import pytest

from flywheel.contracts import exitcodes
from flywheel.policy import Action, FailureKind, RestartBudget, classify_exit, classify_pod, decide_restart
from flywheel.spec import parse_job, parse_spec
from flywheel.worker_plan import Placement, faults_env, plan_workers
from tests.spec.test_spec import BASE, job_with


def placement(**kw):
    base = dict(replicas=2, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:5000", master_addr="127.0.0.1",
                master_port=29500, checkpoint_dir="/ck", launcher=("flywheel", "launch"), metrics_port_base=9100)
    base.update(kw)
    return Placement(**base)


def test_plan_gives_each_worker_the_contract_env():
    job = parse_job(BASE)
    plans = plan_workers(job, placement(events_file="/r/events.jsonl"))
    assert [p.name for p in plans] == ["gpt-tiny-worker-0", "gpt-tiny-worker-1"]
    assert [(p.first_rank, p.last_rank) for p in plans] == [(0, 1), (2, 3)]
    env = plans[1].env
    assert env["WORLD_SIZE"] == "4" and env["PET_NNODES"] == "2:2" and env["PET_NPROC_PER_NODE"] == "2"
    assert env["FLYWHEEL_REPLICA_INDEX"] == "1" and env["FLYWHEEL_METRICS_PORT"] == "9101"
    assert env["FLYWHEEL_JOB"] == "default/gpt-tiny" and env["PET_RDZV_ID"] == "default-gpt-tiny"
    assert env["FLYWHEEL_EVENTS_FILE"] == "/r/events.jsonl"
    assert parse_spec(json.loads(env["FLYWHEEL_SPEC"])) == job.spec
    assert plans[0].argv == ("flywheel", "launch")
    assert env["FLYWHEEL_WARM_START"] == "1"  # faultTolerance.warmStart, on by default
    cold = plan_workers(parse_job(job_with("spec.faultTolerance.warmStart", False)), placement())
    assert {p.env["FLYWHEEL_WARM_START"] for p in cold} == {"0"}


def test_plan_on_a_cluster_shares_the_port_and_uses_service_dns():
    plans = plan_workers(parse_job(BASE), placement(per_worker_metrics_port=False,
                                                    hostname_suffix=".gpt-tiny-workers.default.svc"))
    assert {p.env["FLYWHEEL_METRICS_PORT"] for p in plans} == {"9100"}
    assert plans[1].hostname == "gpt-tiny-worker-1.gpt-tiny-workers.default.svc"


def test_user_command_is_passed_after_the_launcher():
    doc = job_with("spec.command", ["python", "train.py", "--lr", "1"])
    assert plan_workers(parse_job(doc), placement())[0].argv == ("flywheel", "launch", "--", "python", "train.py",
                                                                  "--lr", "1")


def test_plan_refuses_a_replica_count_outside_the_bounds():
    with pytest.raises(ValueError, match="outside spec.replicas"):
        plan_workers(parse_job(BASE), placement(replicas=3))


def test_faults_env_only_carries_rank_faults():
    faults = [{"id": "f0", "kind": "kill", "rank": 1, "step": 5}, {"id": "f1", "kind": "lose-worker", "replica": 0,
                                                                     "step": 9}]
    env = faults_env(faults, "/r/faults")
    assert json.loads(env["FLYWHEEL_FAULTS"]) == faults[:1] and env["FLYWHEEL_FAULT_DIR"] == "/r/faults"
    assert faults_env(faults[1:], "/x") == {}


@pytest.mark.parametrize("code,kind", [
    (0, None), (1, FailureKind.CRASH), (exitcodes.USER_ERROR, FailureKind.USER_ERROR),
    (exitcodes.HANG, FailureKind.HANG), (exitcodes.COLLECTIVE_TIMEOUT, FailureKind.COLLECTIVE_TIMEOUT),
    (exitcodes.STOPPED, FailureKind.STOPPED), (-signal.SIGKILL, FailureKind.KILLED), (137, FailureKind.KILLED),
    (-signal.SIGTERM, FailureKind.STOPPED), (143, FailureKind.STOPPED), (2, FailureKind.CRASH),
])
def test_exit_codes_classify(code, kind):
    assert classify_exit(code) == kind


def test_pod_status_classifies():
    assert classify_pod("Failed", "OOMKilled", 137) == FailureKind.OOM
    assert classify_pod("Pending", "ImagePullBackOff", None) == FailureKind.IMAGE_PULL
    assert classify_pod("Running", None, None, node_lost=True) == FailureKind.NODE_LOST
    assert classify_pod("Failed", "Error", exitcodes.HANG) == FailureKind.HANG
    assert classify_pod("Failed", "Evicted", None) == FailureKind.EVICTED
    assert classify_pod("Running", None, None) is None


def spec_with(**ft):
    doc = job_with("spec.faultTolerance", ft)
    return parse_job(doc).spec


def test_budget_is_spent_and_then_exhausted():
    spec = spec_with(maxRestarts=2, budgetResetAfterSteps=100)
    budget = RestartBudget()
    for _ in range(2):
        d = decide_restart(spec, FailureKind.KILLED, budget, committed_step=10, live_replicas=1)
        assert d.action == Action.RESTART_JOB and d.reason == "Killed"
        budget = d.budget
    d = decide_restart(spec, FailureKind.KILLED, budget, committed_step=10, live_replicas=1)
    assert d.action == Action.FAIL and d.reason == "RestartBudgetExhausted" and "maxRestarts=2" in d.message


def test_budget_resets_after_enough_committed_steps():
    spec = spec_with(maxRestarts=1, budgetResetAfterSteps=50)
    spent = RestartBudget(used=1, window_start_step=0)
    assert decide_restart(spec, FailureKind.HANG, spent, 49, 1).action == Action.FAIL
    d = decide_restart(spec, FailureKind.HANG, spent, 50, 1)
    assert d.action == Action.RESTART_JOB and d.budget == RestartBudget(used=1, window_start_step=50)


def test_permanent_failures_fail_fast_and_external_ones_are_free():
    spec = spec_with(maxRestarts=0)
    assert decide_restart(spec, FailureKind.USER_ERROR, RestartBudget(), 0, 1).action == Action.FAIL
    d = decide_restart(spec, FailureKind.STOPPED, RestartBudget(), 0, 1)
    assert d.action == Action.RESTART_JOB and d.budget.used == 0


def test_elastic_job_shrinks_on_a_lost_node_and_worker_scope_restarts_one():
    doc = job_with("spec.replicas", {"min": 1, "max": 2})
    doc["spec"]["trainer"]["training"]["globalBatch"] = 16
    spec = parse_job(doc).spec
    assert decide_restart(spec, FailureKind.NODE_LOST, RestartBudget(), 0, live_replicas=1).action == Action.SHRINK
    assert decide_restart(spec, FailureKind.NODE_LOST, RestartBudget(), 0, live_replicas=0).action == Action.RESTART_JOB
    scoped = spec_with(restartScope="worker")
    assert decide_restart(scoped, FailureKind.CRASH, RestartBudget(), 0, 1).action == Action.RESTART_WORKER
