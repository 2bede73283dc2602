from flywheel.policy.conditions import condition
from flywheel.policy.observed import HealthFindings, StragglerReport
from flywheel.policy.running_state import settle
from flywheel.spec.status import ConditionType, Phase, ReplicaStatus
from tests.builders import fresh, pod, spec, view


def test_settle_runs_with_enough_ready_workers_and_waits_otherwise() -> None:
    out = settle(fresh(Phase.PENDING, replicas=ReplicaStatus(desired=2, ready=2)), view(spec(), [pod(0), pod(1)]),
                 Phase.PENDING)
    assert out.status.phase is Phase.RUNNING and [e.reason for e in out.events] == ["WorkersRunning"]
    waiting = settle(fresh(Phase.PENDING, replicas=ReplicaStatus(desired=2, ready=1)), view(spec(), [pod(0)]),
                     Phase.PENDING)
    assert waiting.status.phase is Phase.PENDING
    after_restart = settle(fresh(Phase.RESTARTING), view(spec(), [], generation=1), Phase.RESTARTING)
    assert after_restart.status.phase is Phase.RESTARTING


def test_straggler_verdict_of_this_generation_sets_degraded() -> None:
    ready = ReplicaStatus(desired=2, ready=2)
    slow = HealthFindings(straggler=StragglerReport(True, "rank 1 slow", generation=0))
    out = settle(fresh(replicas=ready), view(spec(), [pod(0), pod(1)], findings=slow), Phase.RUNNING)
    cond = condition(out.status, ConditionType.DEGRADED)
    assert cond is not None and cond.reason == "Straggler" and [e.reason for e in out.events] == ["Straggler"]
    stale = settle(fresh(replicas=ready), view(spec(), [pod(0), pod(1)], generation=1, findings=slow),
                   Phase.RUNNING)
    assert condition(stale.status, ConditionType.DEGRADED) is None
