"""The reconcile policy as a pure function: spec + status + observed pods -> status and actions (no I/O)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flywheel.policy.conditions import iso
from flywheel.policy.decisions import CreatePod, DeleteJob, DeletePod, Relabel, ResetRendezvous
from flywheel.policy.failure_decision import HUNG_POD_GRACE_SECONDS
from flywheel.policy.observed import HangReport, HealthFindings, StragglerReport
from flywheel.policy.observed import ObservedProgress as Progress
from tests.builders import NOW, pod, spec
from tests.operator.reconcile_json import condition, reconcile


def creates(result: Any) -> list[int]:
    return sorted(a.index for a in result.actions if isinstance(a, CreatePod))


def deletes(result: Any, force: bool = False) -> list[str]:
    return sorted(a.name for a in result.actions if isinstance(a, DeletePod) and a.force == force)


def test_new_job_creates_every_worker_once_and_names_hold() -> None:
    first = reconcile(spec(), None, {}, [], Progress(), NOW)
    assert creates(first) == [0, 1] and first.status["phase"] == "Pending"
    assert first.status["replicas"]["current"] == 2  # counted by the pass that creates them (the Job controller's way)
    assert [e.reason for e in first.events] == ["Created"]
    # Worker 1 exists (even terminating): only worker 0 is created; a second pass creates nothing new.
    again = reconcile(spec(), None, first.status, [pod(1, "Pending")], Progress(), NOW + 1)
    assert creates(again) == [0] and not [e for e in again.events if e.reason == "Created"]
    assert again.status["replicas"]["current"] == 2  # pod 1, and pod 0 created by this pass
    running = reconcile(spec(), None, again.status, [pod(0), pod(1)], Progress(step=3), NOW + 2)
    assert running.status["phase"] == "Running" and creates(running) == [] and running.status["step"] == 3
    assert running.status["replicas"] == {"desired": 2, "current": 2, "ready": 2}


def test_failure_restarts_the_job_once_then_only_cleans_up() -> None:
    status = reconcile(spec(), None, {}, [pod(0), pod(1)], Progress(), NOW).status
    failed = [pod(0), pod(1, "Failed", exit_code=137, reason="Error")]
    decided = reconcile(spec(), None, status, failed, Progress(checkpoint_step=10, checkpoint_path="/c/10"), NOW + 1)
    assert decided.status["restarts"] == 1 and decided.status["lastRestartReason"] == "Killed"
    assert decided.status["phase"] == "Restarting" and deletes(decided) == ["j-worker-0", "j-worker-1"]
    assert condition(decided.status, "Restarting")["status"] == "True"
    assert [e.reason for e in decided.events] == ["Restarting"]
    assert {a.grace_seconds for a in decided.actions if isinstance(a, DeletePod)} == {None}  # the pod's own grace
    # The same pods seen again (operator killed before it deleted them): no second decision, same cleanup.
    repeat = reconcile(spec(), None, decided.status, failed, Progress(), NOW + 2)
    assert repeat.status["restarts"] == 1 and deletes(repeat) == ["j-worker-0", "j-worker-1"] and not repeat.events
    assert creates(repeat) == []
    # Once they are gone the new generation is created, on a fresh rendezvous (no dead participants to wait for).
    fresh = reconcile(spec(), None, repeat.status, [], Progress(), NOW + 3)
    assert [(a.index, a.generation) for a in fresh.actions if isinstance(a, CreatePod)] == [(0, 1), (1, 1)]
    assert isinstance(fresh.actions[0], ResetRendezvous)
    # The new group starts only once the whole old group is gone (then on one fresh rendezvous).
    leftover = reconcile(spec(), None, repeat.status, [pod(1, "Failed", exit_code=137, reason="Error")], Progress(),
                         NOW + 3)
    assert creates(leftover) == [] and not [a for a in leftover.actions if isinstance(a, ResetRendezvous)]
    # Not while a pod of the current generation is left (it keeps its rendezvous), nor for a brand-new job.
    partial = reconcile(spec(), None, repeat.status, [pod(1, generation=1)], Progress(), NOW + 3)
    assert creates(partial) == [0] and not [a for a in partial.actions if isinstance(a, ResetRendezvous)]
    assert not [a for a in reconcile(spec(), None, {}, [], Progress(), NOW).actions if isinstance(a, ResetRendezvous)]


def test_worker_scope_replaces_only_the_failed_worker_and_relabels_survivors() -> None:
    s = spec(**{"faultTolerance.restartScope": "worker"})
    result = reconcile(s, None, {}, [pod(0), pod(1, "Failed", exit_code=1)], Progress(), NOW)
    assert deletes(result) == ["j-worker-1"] and result.status["lastRestartReason"] == "Crash"
    assert [a for a in result.actions if isinstance(a, Relabel)] == [Relabel("j-worker-0", 1)]


def test_permanent_failure_and_exhausted_budget_fail_the_job() -> None:
    user = reconcile(spec(), None, {}, [pod(0), pod(1, "Failed", exit_code=3)], Progress(), NOW)
    assert user.status["phase"] == "Failed" and condition(user.status, "Failed")["reason"] == "UserError"
    assert deletes(user) == ["j-worker-0"]  # running pods stop; the failed one stays for its logs
    spent = {"restarts": 2, "restartBudget": {"used": 2, "windowStartStep": 0}}
    out = reconcile(spec(), None, spent, [pod(0, generation=2), pod(1, "Failed", generation=2, exit_code=1)],
                    Progress(), NOW)
    assert out.status["phase"] == "Failed" and condition(out.status, "Failed")["reason"] == "RestartBudgetExhausted"


def test_budget_resets_after_committed_steps_and_external_failures_are_free() -> None:
    s = spec(**{"faultTolerance.budgetResetAfterSteps": 10})
    spent = {"restarts": 2, "restartBudget": {"used": 2, "windowStartStep": 0}, "lastCheckpoint": {"step": 20}}
    out = reconcile(s, None, spent, [pod(0, generation=2), pod(1, "Failed", generation=2, exit_code=1)],
                    Progress(), NOW)
    assert out.status["phase"] == "Restarting" and out.status["restartBudget"] == {"used": 1, "windowStartStep": 20}
    lost = reconcile(s, None, {}, [pod(0), pod(1, node_lost=True)], Progress(), NOW)
    assert lost.status["lastRestartReason"] == "NodeLost" and lost.status["restartBudget"]["used"] == 0


def test_liveness_loss_then_force_delete_after_the_grace() -> None:
    decided = reconcile(spec(), None, {}, [pod(0), pod(1, liveness_lost=True)], Progress(), NOW)
    assert decided.status["lastRestartReason"] == "NodeLost" and "j-worker-1" in deletes(decided)
    # The survivor's emergency checkpoint would wait on the lost peer: a short grace, not the pod's 30 s.
    assert {a.grace_seconds for a in decided.actions if isinstance(a, DeletePod) and not a.force} == {
        HUNG_POD_GRACE_SECONDS}
    stuck = [pod(0, deleting_since=NOW), pod(1, deleting_since=NOW, node_lost=True)]
    early = reconcile(spec(), None, decided.status, stuck, Progress(), NOW + 4)
    assert deletes(early, force=True) == [] and creates(early) == []
    late = reconcile(spec(), None, decided.status, stuck, Progress(), NOW + 5)
    assert deletes(late, force=True) == ["j-worker-1"] and [e.reason for e in late.events] == ["ForceDeleted"]


def test_a_pod_whose_container_ended_is_named_by_its_exit_though_its_liveness_key_lapsed_first() -> None:
    """A SIGKILLed agent's key lapses (1 s past its 3 s TTL) before a loaded kubelet reports the exit: once it has,
    the exit names the failure (Killed), not the key (NodeLost)."""
    killed = pod(1, "Failed", exit_code=137, liveness_lost=True)
    out = reconcile(spec(), None, {}, [pod(0), killed], Progress(), NOW)
    assert out.status["lastRestartReason"] == "Killed"
    still_running = pod(1, liveness_lost=True)  # the kubelet has said nothing yet: the key decides
    assert reconcile(spec(), None, {}, [pod(0), still_running], Progress(), NOW).status["lastRestartReason"] == \
        "NodeLost"


def test_a_not_ready_node_whose_worker_holds_its_liveness_key_loses_nothing() -> None:
    """Every node NotReady at once (a starved node controller, a kubelet that lost the API server) while the agents
    hold their etcd keys: nothing failed. Once a key lapses -- or for a pod whose agent has not registered, or has
    exited -- the node's word decides."""
    # The node controller marked their pods not Ready too; the job keeps training, and says so.
    alive = [replace(pod(i, node_lost=True, agent_alive=True), ready=False) for i in range(2)]
    out = reconcile(spec(), None, {"phase": "Running"}, alive, Progress(), NOW)
    assert out.status["restarts"] == 0 and out.status.get("lastRestartReason") in (None, "")
    assert deletes(out) == [] and out.status["phase"] == "Running" and out.status["replicas"]["ready"] == 2
    for gone in (pod(1, node_lost=True), pod(1, node_lost=True, agent_alive=True, liveness_lost=True)):
        lost = reconcile(spec(), None, {}, [alive[0], gone], Progress(), NOW)
        assert lost.status["lastRestartReason"] == "NodeLost" and "j-worker-1" in deletes(lost)


def test_success_suspend_deadline_ttl_and_scale_down() -> None:
    done = reconcile(spec(), None, {}, [pod(0, "Succeeded"), pod(1, "Succeeded")], Progress(step=30, done=True), NOW)
    assert done.status["phase"] == "Succeeded" and [e.reason for e in done.events] == ["Created", "TrainingSucceeded"]
    assert reconcile(spec(), None, done.status, [], Progress(), NOW + 100).actions == []
    ttl = spec(**{"runPolicy.ttlSecondsAfterFinished": 60})
    assert reconcile(ttl, None, done.status, [], Progress(), NOW + 59).actions == []
    assert reconcile(ttl, None, done.status, [], Progress(), NOW + 61).actions == [DeleteJob()]

    suspended = reconcile(spec(suspend=True), None, {}, [pod(0), pod(1)], Progress(), NOW)
    assert suspended.status["phase"] == "Suspended" and deletes(suspended) == ["j-worker-0", "j-worker-1"]
    resumed = reconcile(spec(), None, suspended.status, [], Progress(), NOW + 1)
    assert creates(resumed) == [0, 1] and condition(resumed.status, "Suspended")["status"] == "False"
    assert "Resumed" in [e.reason for e in resumed.events]

    started = {"conditions": [{"type": "Created", "status": "True", "lastTransitionTime": iso(NOW - 100)}]}
    late = reconcile(spec(**{"runPolicy.activeDeadlineSeconds": 50}), None, started, [pod(0)], Progress(), NOW)
    assert late.status["phase"] == "Failed" and condition(late.status, "Failed")["reason"] == "DeadlineExceeded"

    elastic = spec(**{"replicas.min": 1, "replicas.max": 2, "replicas.target": 1})
    down = reconcile(elastic, None, {}, [pod(0), pod(1)], Progress(), NOW)
    assert deletes(down) == ["j-worker-1"] and down.status["replicas"]["desired"] == 1
    up = reconcile(spec(**{"replicas.min": 1, "replicas.max": 2}), None, down.status, [pod(0)], Progress(), NOW)
    assert creates(up) == [1]


def test_elastic_job_runs_degraded_with_fewer_workers() -> None:
    s = spec(**{"replicas.min": 1, "replicas.max": 2})
    out = reconcile(s, None, {}, [pod(0), pod(1, "Pending")], Progress(), NOW)
    assert out.status["phase"] == "Running" and condition(out.status, "Degraded")["status"] == "True"
    lost = reconcile(s, None, out.status, [pod(0), pod(1, node_lost=True)], Progress(), NOW + 1)
    assert lost.status["lastRestartReason"] == "NodeLost" and deletes(lost) == ["j-worker-1"]
    assert [a for a in lost.actions if isinstance(a, Relabel)] == [Relabel("j-worker-0", 1)]  # Shrink keeps 0


def test_invalid_spec_fails_with_condition_and_event_once() -> None:
    out = reconcile(None, "spec.trainer.model.preset: unknown preset", {}, [], Progress(), NOW)
    assert out.status["phase"] == "Failed" and condition(out.status, "Invalid")["reason"] == "InvalidSpec"
    assert "InvalidSpec" in [e.reason for e in out.events]
    again = reconcile(None, "same", out.status, [], Progress(), NOW + 1)
    assert again.events == [] and again.actions == []


def test_unschedulable_condition_after_the_grace() -> None:
    stuck = [pod(0), pod(1, "Pending", unschedulable_since=NOW - 99)]  # the grace counts from first seen (NOW)
    seen = reconcile(spec(), None, {}, stuck, Progress(), NOW)
    early = reconcile(spec(), None, seen.status, stuck, Progress(), NOW + 4)
    assert condition(early.status, "Unschedulable") is None and early.status["phase"] == "Pending"
    late = reconcile(spec(), None, early.status, stuck, Progress(), NOW + 5)
    assert condition(late.status, "Unschedulable")["status"] == "True"
    assert creates(late) == [] and deletes(late) == []


def hang(message: str, generation: int = 0) -> HealthFindings:
    return HealthFindings(hang=HangReport(message, generation))


def test_hang_finding_restarts_every_worker_once_and_counts_a_hang() -> None:
    s = spec(**{"faultTolerance.restartScope": "worker"})  # a hang restarts every worker whatever the scope
    running = reconcile(s, None, {}, [pod(0), pod(1)], Progress(), NOW).status
    stale = reconcile(s, None, running, [pod(0), pod(1)], Progress(), NOW, findings=hang("no step", generation=1))
    assert stale.status == running and stale.actions == []  # a report about another generation: ignored
    decided = reconcile(s, None, running, [pod(0), pod(1)], Progress(), NOW + 1,
                        findings=hang("no training step for 99s"))
    assert decided.status["restarts"] == 1 and decided.status["lastRestartReason"] == "Hung"
    assert deletes(decided) == ["j-worker-0", "j-worker-1"] and not [a for a in decided.actions
                                                                      if isinstance(a, Relabel)]
    # A hung rank cannot checkpoint and a stopped one would sit out the full termination grace.
    assert {a.grace_seconds for a in decided.actions if isinstance(a, DeletePod)} == {HUNG_POD_GRACE_SECONDS}
    assert condition(decided.status, "Hung")["status"] == "False"
    assert condition(decided.status, "Hung")["reason"] == "RestartedAfterHang"
    assert [e.reason for e in decided.events] == ["ProgressStalled", "Restarting"]
    assert "RestartJob" in decided.events[-1].message and "99s" in decided.events[-1].message
    # Repeated (operator killed before deleting) with the report still there: only cleanup, no second restart.
    repeat = reconcile(s, None, decided.status, [pod(0), pod(1)], Progress(), NOW + 2,
                       findings=hang("no training step for 99s"))
    assert repeat.status["restarts"] == 1 and deletes(repeat) == ["j-worker-0", "j-worker-1"]
    # A suspended job ignores a hang report: resuming does not restart the fresh workers.
    paused = reconcile(spec(suspend=True), None, running, [], Progress(), NOW, findings=hang("x"))
    resumed = reconcile(s, None, paused.status, [], Progress(), NOW + 1, findings=hang("x"))
    assert resumed.status.get("restarts", 0) == 0 and creates(resumed) == [0, 1]
    assert isinstance(resumed.actions[0], ResetRendezvous)  # the suspended workers' agents are gone


def straggler(degraded: bool, message: str, generation: int = 0) -> HealthFindings:
    return HealthFindings(straggler=StragglerReport(degraded, message, generation))


def test_straggler_verdict_sets_degraded_while_all_workers_run_and_a_restart_clears_it() -> None:
    running = reconcile(spec(), None, {}, [pod(0), pod(1)], Progress(), NOW).status
    slow_pass = reconcile(spec(), None, running, [pod(0), pod(1)], Progress(), NOW + 1,
                          findings=straggler(True, "replica 1 rank 1 slow"))
    slow = slow_pass.status
    assert condition(slow, "Degraded")["reason"] == "Straggler" and condition(slow, "Degraded")["status"] == "True"
    assert [(e.type, e.reason) for e in slow_pass.events] == [("Warning", "Straggler")]
    kept = reconcile(spec(), None, slow, [pod(0), pod(1)], Progress(), NOW + 2,
                     findings=straggler(True, "replica 1 rank 1 slow"))
    assert kept.status == {**slow, "conditions": kept.status["conditions"]} and kept.events == []  # unchanged
    assert reconcile(spec(), None, slow, [pod(0), pod(1)], Progress(), NOW + 2).status == slow  # no verdict: kept
    elastic = spec(**{"replicas.min": 1, "replicas.max": 2})
    fewer = reconcile(elastic, None, slow, [pod(0), pod(1, "Pending")], Progress(), NOW + 1,
                      findings=straggler(False, "ok")).status
    assert condition(fewer, "Degraded")["reason"] == "FewerWorkers"  # fewer workers take precedence
    restarted = reconcile(spec(), None, slow, [pod(0), pod(1, "Failed", exit_code=1)], Progress(), NOW + 1).status
    assert condition(restarted, "Degraded")["status"] == "False"
    stale = reconcile(spec(), None, restarted, [pod(0, generation=1), pod(1, generation=1)], Progress(), NOW + 2,
                      findings=straggler(True, "replica 1 rank 1 slow", generation=0)).status
    assert condition(stale, "Degraded")["status"] == "False"  # judged before the restart: ignored
    cleared = reconcile(spec(), None, slow, [pod(0), pod(1)], Progress(), NOW + 3,
                        findings=straggler(False, "no rank is slow"))
    assert condition(cleared.status, "Degraded")["status"] == "False"
    assert condition(cleared.status, "Degraded")["reason"] == "StragglerRecovered"
    assert [(e.type, e.reason) for e in cleared.events] == [("Normal", "StragglerRecovered")]


def test_restart_request_restarts_every_worker_once_without_spending_budget() -> None:
    s = spec(**{"faultTolerance.restartScope": "worker"})
    running = reconcile(s, None, {}, [pod(0), pod(1)], Progress(), NOW).status
    at = "2026-11-22T09:00:00Z"
    decided = reconcile(s, None, running, [pod(0), pod(1)], Progress(), NOW + 1, restart_requested_at=at)
    assert decided.status["restarts"] == 1 and decided.status["lastRestartReason"] == "RestartRequested"
    assert decided.status["restartRequestHandled"] == at and decided.status["phase"] == "Restarting"
    assert deletes(decided) == ["j-worker-0", "j-worker-1"]
    assert decided.status.get("restartBudget", {}).get("used", 0) == 0
    assert decided.events[-1].reason == "RestartRequested" and at in decided.events[-1].message
    # The same request again: old-generation pods are only cleaned up, then the new generation is created.
    again = reconcile(s, None, decided.status, [pod(0), pod(1)], Progress(), NOW + 2, restart_requested_at=at)
    assert again.status["restarts"] == 1 and deletes(again) == ["j-worker-0", "j-worker-1"]
    fresh = reconcile(s, None, again.status, [], Progress(), NOW + 3, restart_requested_at=at)
    assert fresh.status["restarts"] == 1 and creates(fresh) == [0, 1]
    # A newer request restarts again; a request made while suspended is served by the resume itself.
    later = reconcile(s, None, fresh.status, [pod(0, generation=1), pod(1, generation=1)], Progress(), NOW + 4,
                      restart_requested_at="2026-11-22T09:05:00Z")
    assert later.status["restarts"] == 2
    paused = reconcile(spec(suspend=True), None, running, [], Progress(), NOW, restart_requested_at=at)
    resumed = reconcile(s, None, paused.status, [], Progress(), NOW + 1, restart_requested_at=at)
    assert resumed.status.get("restarts", 0) == 0 and creates(resumed) == [0, 1]
    assert isinstance(resumed.actions[0], ResetRendezvous)  # the suspended workers' agents are gone
