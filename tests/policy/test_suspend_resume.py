from flywheel.policy.decisions import CreatePod, DeletePod, ResetRendezvous
from flywheel.policy.observed import ObservedProgress
from flywheel.policy.suspend_resume import resume, suspend
from flywheel.spec.status import Phase
from tests.builders import NOW, fresh, pod, reconcile, spec, view


def test_suspend_deletes_the_workers_once_and_serves_a_restart_request() -> None:
    out = suspend(fresh(), view(spec(suspend=True), [pod(0), pod(1, "Succeeded")], restart_requested_at="t1"))
    assert out.actions == [DeletePod("j-worker-0", "u0-0")] and out.status.phase is Phase.SUSPENDED
    assert [e.reason for e in out.events] == ["Suspended"] and out.status.restart_request_handled == "t1"
    again = suspend(fresh(Phase.SUSPENDED), view(spec(suspend=True), []))
    assert again.events == []


def test_resume_starts_from_pending_and_says_so() -> None:
    out = suspend(fresh(), view(spec(suspend=True), []))
    assert resume(out, view(spec(), [])) is Phase.PENDING and out.events[-1].reason == "Resumed"
    running = fresh()
    assert resume(running, view(spec(), [])) is Phase.RUNNING and running.events == []


def test_resume_starts_a_new_generation_without_counting_a_restart() -> None:
    out = suspend(fresh(restarts=1, worker_generation=1), view(spec(suspend=True), [pod(0, generation=1)], 1))
    assert resume(out, view(spec(), [], 1)) is Phase.PENDING
    assert out.status.generation == 2 and out.status.restarts == 1


def test_a_quick_resume_waits_for_the_suspended_workers_and_counts_nothing() -> None:
    """Resumed while the suspend's deletions are still under way: those pods are the old generation's leftovers, not
    workers deleted by someone else (which would be a PodDeleted restart); the new generation starts, on a fresh
    rendezvous, once they are gone."""
    terminating = [pod(0, deleting_since=NOW - 1), pod(1, deleting_since=NOW - 1)]
    suspended = suspend(fresh(), view(spec(suspend=True), [pod(0), pod(1)])).status
    resumed = reconcile(spec(), None, suspended, terminating, ObservedProgress(), NOW)
    assert resumed.status.restarts == 0 and resumed.status.last_restart_reason in ("", None)
    assert resumed.status.generation == 1 and resumed.status.phase is Phase.PENDING
    assert not any(isinstance(a, CreatePod) for a in resumed.actions)  # the old group first goes
    assert not any(e.reason == "Restarting" for e in resumed.events)
    gone = reconcile(spec(), None, resumed.status, [], ObservedProgress(), NOW + 2)
    assert gone.status.restarts == 0 and gone.status.generation == 1
    assert [a for a in gone.actions if isinstance(a, CreatePod)] == [CreatePod(0, 1), CreatePod(1, 1)]
    assert any(isinstance(a, ResetRendezvous) for a in gone.actions)
