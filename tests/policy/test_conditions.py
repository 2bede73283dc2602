from flywheel.policy.conditions import condition, holds, set_condition, set_phase
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus
from tests.builders import NOW


def test_set_condition_adds_only_true_and_moves_the_time_only_on_a_flip() -> None:
    status = TrainingJobStatus()
    set_condition(status, ConditionType.HUNG, False, "R", "m", NOW)
    assert status.conditions == [] and "conditions" not in status.to_json()
    set_condition(status, ConditionType.HUNG, True, "R", "m", NOW)
    set_condition(status, ConditionType.HUNG, True, "R2", "m2", NOW + 5)
    cond = condition(status, ConditionType.HUNG)
    assert cond is not None and cond.reason == "R2" and status.to_json()["conditions"][0]["lastTransitionTime"] \
        == "2027-01-15T08:00:00Z"


def test_set_phase_turns_off_what_the_phase_does_not_allow() -> None:
    status = TrainingJobStatus()
    set_phase(status, Phase.RUNNING, "Run", "", NOW)
    set_condition(status, ConditionType.DEGRADED, True, "FewerWorkers", "", NOW)
    set_phase(status, Phase.FAILED, "Boom", "why", NOW + 1)
    assert status.phase is Phase.FAILED and holds(status, ConditionType.FAILED)
    assert not holds(status, ConditionType.RUNNING) and not holds(status, ConditionType.DEGRADED)
    assert condition(status, ConditionType.DEGRADED).reason == "Boom"  # type: ignore[union-attr]
