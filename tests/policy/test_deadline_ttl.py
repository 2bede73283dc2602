from flywheel.policy.conditions import iso, set_condition
from flywheel.policy.deadline_ttl import after_finish, deadline
from flywheel.policy.decisions import DeleteJob
from flywheel.spec.status import ConditionType, Phase
from tests.builders import NOW, fresh, pod, spec, view


def test_deadline_fails_the_job_counted_from_its_creation() -> None:
    s = spec(**{"runPolicy.activeDeadlineSeconds": 50})
    out = fresh()
    set_condition(out.status, ConditionType.CREATED, True, "Created", "", NOW - 60)
    decided = deadline(out, view(s, [pod(0)]))
    assert decided is not None and decided.status.phase is Phase.FAILED and decided.status.conditions[-1].reason \
        == "DeadlineExceeded"
    assert deadline(fresh(), view(s, [pod(0)])) is None  # no Created condition yet: created now
    assert deadline(fresh(), view(spec(), [pod(0)])) is None


def test_ttl_deletes_the_finished_job() -> None:
    s = spec(**{"runPolicy.ttlSecondsAfterFinished": 60})
    out = fresh(Phase.SUCCEEDED)
    set_condition(out.status, ConditionType.SUCCEEDED, True, "Done", "", NOW - 59)
    assert after_finish(out, view(s, [])).actions == []
    assert after_finish(out, view(s, [], now=NOW + 1)).actions == [DeleteJob()]
    assert iso(NOW)  # the condition times are whole seconds
