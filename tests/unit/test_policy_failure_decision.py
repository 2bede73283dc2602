from flywheel.policy.decisions import DeletePod, Relabel
from flywheel.policy.failure_decision import HUNG_POD_GRACE_SECONDS, budget_of, decide_failure, requested_restart
from flywheel.policy.observed import HangReport, HealthFindings, ObservedProgress
from flywheel.spec_status import ConditionType, Phase, RestartBudgetStatus, TrainingJobStatus
from tests.unit.policy_helpers import fresh, pod, spec, view


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
