from flywheel.policy.finish import invalid_job, success
from flywheel.policy.observed import ObservedProgress
from flywheel.spec_status import Phase, ReplicaStatus
from tests.unit.policy_helpers import NOW, fresh, pod, spec, view


def test_an_invalid_job_fails_once() -> None:
    out = invalid_job(fresh(Phase.PENDING), [pod(0)], "spec.x: bad", NOW)
    assert out.status.phase is Phase.FAILED and [e.reason for e in out.events] == ["InvalidSpec"]
    assert len(out.actions) == 1
    again = invalid_job(fresh(Phase.FAILED), [], "spec.x: bad", NOW)
    assert again.events == [] and again.actions == []


def test_success_waits_for_the_other_workers_then_finishes() -> None:
    out = fresh(replicas=ReplicaStatus(desired=2, current=2, ready=1))
    finishing = success(out, view(spec(), [pod(0, "Succeeded"), pod(1)]))
    assert finishing is not None and finishing.status.phase is Phase.RUNNING and finishing.actions == []
    done = success(fresh(step=7), view(spec(), [pod(0, "Succeeded"), pod(1, "Succeeded")]))
    assert done is not None and done.status.phase is Phase.SUCCEEDED and "step 7" in done.events[0].message
    assert success(fresh(), view(spec(), [pod(0), pod(1)])) is None
    logged = success(fresh(), view(spec(), [], progress=ObservedProgress(done=True)))
    assert logged is not None and logged.status.phase is Phase.SUCCEEDED
