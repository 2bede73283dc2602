from flywheel.policy.decisions import DeletePod
from flywheel.policy.suspend_resume import resume, suspend
from flywheel.spec_status import Phase
from tests.unit.policy_helpers import fresh, pod, spec, view


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
