from flywheel.contracts.timefmt import rfc3339
from flywheel.policy.decisions import DeletePod, Relabel
from flywheel.policy.failure_decision import HUNG_POD_GRACE_SECONDS, budget_of, decide_failure, requested_restart
from flywheel.policy.observed import HangReport, HealthFindings, ObservedProgress
from flywheel.spec.status import ConditionType, Phase, RestartBudgetStatus, TrainingJobStatus
from tests.builders import NOW, fresh, pod, spec, view


def test_a_failed_worker_restarts_the_job_and_bumps_the_generation() -> None:
    out = decide_failure(fresh(), view(spec(), [pod(0), pod(1, "Failed", exit_code=1)]))
    assert out is not None and out.status.restarts == 1 and out.status.phase is Phase.RESTARTING
    assert out.status.restart_budget.used == 1 and len(out.actions) == 2
    assert decide_failure(fresh(), view(spec(), [pod(0), pod(1)])) is None


def test_worker_scope_relabels_the_survivors() -> None:
    s = spec(**{"faultTolerance.restartScope": "worker"})
    out = decide_failure(fresh(), view(s, [pod(0), pod(1, "Failed", exit_code=1)]))
    assert out is not None and Relabel("j-worker-0", 1) in out.actions
    assert DeletePod("j-worker-1", "u1-0") in out.actions


def test_a_hang_of_this_generation_restarts_all_with_a_short_grace_and_a_stale_one_is_ignored() -> None:
    hung = HealthFindings(hang=HangReport("no step for 99s", 0))
    out = decide_failure(fresh(), view(spec(), [pod(0), pod(1)], findings=hung))
    assert out is not None and out.status.last_restart_reason == "Hung"
    assert {a.grace_seconds for a in out.actions if isinstance(a, DeletePod)} == {HUNG_POD_GRACE_SECONDS}
    assert decide_failure(fresh(), view(spec(), [pod(0), pod(1)], generation=1, findings=hung)) is None
    assert decide_failure(fresh(Phase.PENDING), view(spec(), [pod(0)], findings=hung)) is None


def test_the_budget_survives_in_the_status_or_falls_back_to_the_restarts() -> None:
    kept = TrainingJobStatus.model_validate({"restarts": 3, "restartBudget": {"used": 1, "windowStartStep": 5}})
    assert (budget_of(kept).used, budget_of(kept).window_start_step) == (1, 5)
    old = TrainingJobStatus.model_validate({"restarts": 3, "lastCheckpoint": {"step": 9}})
    assert (budget_of(old).used, budget_of(old).window_start_step) == (3, 9)
    assert TrainingJobStatus(restart_budget=RestartBudgetStatus()).has_restart_budget


def test_a_restart_request_is_served_once() -> None:
    out = requested_restart(fresh(), view(spec(), [pod(0)], restart_requested_at="t1"))
    assert out is not None and out.status.restart_request_handled == "t1" and out.status.restarts == 1
    assert requested_restart(out, view(spec(), [pod(0)], generation=1, restart_requested_at="t1")) is None


def test_a_worker_s_own_failure_reason_is_in_the_condition_and_the_event() -> None:
    said = ObservedProgress(failure_reason="ParallelismError: tp 2 does not divide 3 heads")
    s = spec(**{"faultTolerance.maxRestarts": 0})
    out = decide_failure(fresh(), view(s, [pod(0), pod(1, "Failed", exit_code=3)], progress=said))
    assert out is not None and out.status.phase is Phase.FAILED
    failed = next(c for c in out.status.conditions if c.type == ConditionType.FAILED)
    assert "tp 2 does not divide 3 heads" in failed.message
    assert any("tp 2 does not divide 3 heads" in e.message for e in out.events)


def test_an_earlier_attempt_s_exit_reason_is_not_given_for_a_new_failure() -> None:
    # Generation 1 restores (its group has not reported its start) when a pod is OOMKilled: the record's exit
    # reason is generation 0's crash, older than the restart, and says nothing of this failure.
    old = ObservedProgress(step=500, failure_reason="ValueError: bad shard 17", attempt=NOW - 600)
    restarted = dict(restarts=1, worker_generation=1, step=500, last_restart_time=rfc3339(NOW - 60))
    for failed in (pod(1, "Failed", generation=1, exit_code=137, reason="OOMKilled"),
                   pod(1, "Failed", generation=1, exit_code=143, reason="Error", disruption="PreemptionByScheduler")):
        out = decide_failure(fresh(**restarted), view(spec(), [pod(0, generation=1), failed], generation=1,
                                                       progress=old))
        assert out is not None
        assert not any("bad shard" in c.message for c in out.status.conditions)
        assert not any("bad shard" in e.message for e in out.events)
    # This generation's own attempt said it: the reason stands in for the empty termination message ...
    own = ObservedProgress(step=500, failure_reason="ValueError: bad shard 17", attempt=NOW - 30)
    crashed = pod(1, "Failed", generation=1, exit_code=1)
    out = decide_failure(fresh(**restarted), view(spec(), [pod(0, generation=1), crashed], generation=1,
                                                   progress=own))
    assert out is not None and any("bad shard 17" in e.message for e in out.events)
    # ... but never beside the pod's own termination message.
    worded = pod(1, "Failed", generation=1, exit_code=1, message="torch.OutOfMemoryError: CUDA out of memory")
    out = decide_failure(fresh(**restarted), view(spec(), [pod(0, generation=1), worded], generation=1,
                                                   progress=own))
    assert out is not None and not any("bad shard" in e.message for e in out.events)
    assert any("CUDA out of memory" in e.message for e in out.events)
