from flywheel.policy.finish import invalid_job, success
from flywheel.policy.observed import ObservedProgress
from flywheel.spec.status import Phase, ReplicaStatus
from tests.builders import NOW, fresh, pod, spec, view


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


def test_workers_lingering_past_the_finish_grace_after_done_are_stopped() -> None:
    """The trainer reported done (its final checkpoint committed) and a worker still runs (a rank stuck, or restarted
    in place, in its teardown): the job stays Running for finishGraceSeconds, then Succeeds and deletes it."""
    from flywheel.policy.due import next_due

    done = ObservedProgress(done=True, done_time=NOW - 30, step=9)
    pods = [pod(0, "Succeeded"), pod(1)]
    out = fresh(replicas=ReplicaStatus(desired=2, current=2, ready=1))
    waiting = success(out, view(spec(), pods, progress=done))
    assert waiting is not None and waiting.status.phase is Phase.RUNNING and waiting.actions == []
    assert next_due(waiting.status, view(spec(), pods, progress=done)) == NOW + 30
    over = success(fresh(step=9), view(spec(), pods, progress=done, now=NOW + 30))
    assert over is not None and over.status.phase is Phase.SUCCEEDED
    assert [a.name for a in over.actions] == ["j-worker-1"]
    assert "worker(s) 1 still running 60 s after training finished were stopped" in over.events[0].message
    shorter = success(fresh(), view(spec(**{"faultTolerance.finishGraceSeconds": 10}), pods, progress=done))
    assert shorter is not None and shorter.status.phase is Phase.SUCCEEDED
    # No done report (a user script): a worker that succeeded first never stops the others.
    script = success(fresh(), view(spec(), pods, now=NOW + 3600))
    assert script is not None and script.status.phase is Phase.RUNNING and script.actions == []
