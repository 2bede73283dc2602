"""A hang while every worker's agent is alive restarts the ranks in place (policy/failure_decision.py): the pods
are relabelled, not recreated, and the agents are asked through etcd; a generation begun that way that hangs again
before a step, a dead agent, or a pod not running recreates the pods as before."""

from __future__ import annotations

from typing import Any

from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreatePod, DeletePod, Relabel, RestartRanks
from flywheel.policy.failure_decision import HUNG_POD_GRACE_SECONDS, decide_failure
from flywheel.policy.observed import HangReport, HealthFindings, ObservedProgress, PodView
from flywheel.policy.rank_restarts import SAME_RECOVERY_SECONDS
from flywheel.spec.status import ConditionType, Phase, RestartBudgetStatus
from tests.builders import NOW, fresh, pod, reconcile, spec, view

HUNG = "no training step for 5 s since the last step"
REQUESTED = "restart requested by the operator for generation 1"


def alive(index: int, generation: int = 0, **kw: Any) -> PodView:
    return pod(index, generation=generation, agent_alive=True, **kw)


def hung(generation: int = 0, stepped: bool = False) -> HealthFindings:
    return HealthFindings(hang=HangReport(HUNG, generation, stepped))


def test_a_hang_with_every_agent_alive_restarts_the_ranks_in_place() -> None:
    out = decide_failure(fresh(), view(spec(), [alive(0), alive(1)], findings=hung()))
    assert out is not None
    assert out.actions == [Relabel("j-worker-0", 1), Relabel("j-worker-1", 1), RestartRanks(1, HUNG)]
    status = out.status
    assert status.restarts == 1 and status.generation == 1 and status.last_restart_reason == R.RESTART_HUNG
    assert status.in_place_restart_generation == 1 and status.restart_budget.used == 1
    assert status.phase is Phase.RESTARTING
    answered = next(c for c in status.conditions if c.type == ConditionType.HUNG)
    assert (answered.status, answered.reason) == ("False", R.HANG_RESTARTED)
    assert [e.reason for e in out.events] == [R.HUNG, R.RESTARTING]
    assert R.RESTART_IN_PLACE in out.events[-1].message and "no pod is recreated" in out.events[-1].message


def test_worker_scope_and_an_elastic_job_restart_in_place_too() -> None:
    scoped = spec(**{"faultTolerance.restartScope": "worker"})
    out = decide_failure(fresh(), view(scoped, [alive(0), alive(1)], findings=hung()))
    assert out is not None and RestartRanks(1, HUNG) in out.actions
    elastic = spec(**{"replicas.min": 1, "replicas.max": 4, "trainer.training.globalBatch": 24})
    out = decide_failure(fresh(), view(elastic, [alive(0), alive(1)], findings=hung()))
    assert out is not None and RestartRanks(1, HUNG) in out.actions


def test_a_generation_restarted_in_place_that_hangs_again_before_a_step_recreates_the_pods() -> None:
    again = fresh(worker_generation=1, restarts=1, in_place_restart_generation=1,
                  restart_budget=RestartBudgetStatus(used=1))
    out = decide_failure(again, view(spec(), [alive(0, 1), alive(1, 1)], generation=1, findings=hung(1)))
    assert out is not None and not [a for a in out.actions if isinstance(a, RestartRanks | Relabel)]
    assert {(a.name, a.grace_seconds) for a in out.actions if isinstance(a, DeletePod)} == {
        ("j-worker-0", HUNG_POD_GRACE_SECONDS), ("j-worker-1", HUNG_POD_GRACE_SECONDS)}
    assert out.status.restarts == 2 and out.status.generation == 2 and out.status.in_place_restart_generation == 1
    assert "hung again before a step" in out.events[-1].message
    # It trained steps before it hung again: in place again.
    stepped = fresh(worker_generation=1, restarts=1, in_place_restart_generation=1,
                    restart_budget=RestartBudgetStatus(used=1))
    out = decide_failure(stepped, view(spec(), [alive(0, 1), alive(1, 1)], generation=1,
                                       findings=hung(1, stepped=True)))
    assert out is not None and RestartRanks(2, HUNG) in out.actions and out.status.in_place_restart_generation == 2
    # An older generation restarted in place says nothing about this one (recreated since).
    older = fresh(worker_generation=2, restarts=2, in_place_restart_generation=1,
                  restart_budget=RestartBudgetStatus(used=1))
    out = decide_failure(older, view(spec(), [alive(0, 2), alive(1, 2)], generation=2, findings=hung(2)))
    assert out is not None and RestartRanks(3, HUNG) in out.actions


def test_a_dead_or_unknown_agent_or_a_pod_not_running_recreates_the_pods() -> None:
    for pods in ([alive(0), pod(1)],  # no live liveness key seen for worker 1 (no etcd, exited, not registered)
                 [alive(0), alive(1, phase="Pending")],
                 [alive(0)]):  # fewer than replicas.min
        out = decide_failure(fresh(), view(spec(), pods, findings=hung()))
        assert out is not None and not [a for a in out.actions if isinstance(a, RestartRanks)], pods
        assert out.status.in_place_restart_generation == 0
    lost = decide_failure(fresh(), view(spec(), [alive(0), alive(1, liveness_lost=True)], findings=hung()))
    assert lost is not None and lost.status.last_restart_reason == "NodeLost"  # a failed pod, not a hang
    assert not [a for a in lost.actions if isinstance(a, RestartRanks)]


def test_the_budget_is_spent_as_for_a_pod_restart_and_an_exhausted_one_fails_the_job() -> None:
    spent = fresh(restart_budget=RestartBudgetStatus(used=2))  # maxRestarts 2
    out = decide_failure(spent, view(spec(), [alive(0), alive(1)], findings=hung()))
    assert out is not None and out.status.phase is Phase.FAILED
    assert not [a for a in out.actions if isinstance(a, RestartRanks | Relabel)]


def test_the_agents_reports_of_the_restart_they_were_asked_for_do_not_count_again() -> None:
    """Each agent reports the restart as a rank restart in place (its liveness key's count); the operator
    already counted the decided one, and takes the reports within SAME_RECOVERY_SECONDS as that recovery."""
    s = spec()
    running = reconcile(s, None, fresh().status, [alive(0), alive(1)], ObservedProgress(step=20), NOW)
    decided = reconcile(s, None, running.status, [alive(0), alive(1)], ObservedProgress(step=20), NOW + 1,
                        findings=hung())
    assert decided.status.restarts == 1 and RestartRanks(1, HUNG) in decided.actions
    relabelled = [alive(i, 1, rank_restarts=1, rank_restart_reason=REQUESTED, rank_restart_at=NOW + 1.5 + i)
                  for i in range(2)]
    after = reconcile(s, None, decided.status, relabelled, ObservedProgress(step=21), NOW + 4)
    assert after.status.restarts == 1 and after.status.last_restart_reason == R.RESTART_HUNG
    assert after.status.rank_restarts == {"u0-1": 1, "u1-1": 1} and not [e for e in after.events
                                                                          if e.reason == R.RESTART_RANK]
    assert after.status.phase is Phase.RUNNING and not [a for a in after.actions
                                                         if isinstance(a, CreatePod | DeletePod | RestartRanks)]
    # A crash of a rank later on is a recovery of its own: counted once.
    crashed = [alive(0, 1, rank_restarts=2, rank_restart_reason="rank 0: exit code 1 (Crash)",
                     rank_restart_at=NOW + 1 + SAME_RECOVERY_SECONDS + 10), relabelled[1]]
    later = reconcile(s, None, after.status, crashed, ObservedProgress(step=90), NOW + SAME_RECOVERY_SECONDS + 12)
    assert later.status.restarts == 2 and later.status.last_restart_reason == R.RESTART_RANK
