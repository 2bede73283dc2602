"""Recovery cost as a record: the pure parts (policy/recovery_cost.py), the operator's clock and its status fields
(operator/recovery_record.py), the trainer's restore report in its etcd progress record, the `recovery` event."""

from __future__ import annotations

from flywheel.etcd.progress import ProgressRecord, decode, encode
from flywheel.eventlog import Recovery, fold, parse_record
from flywheel.monitor.etcd_progress import ProgressLedger
from flywheel.operator.recovery_record import RecoveryClock, fault_time, recovered_message
from flywheel.policy.decisions import CreatePod, DeletePod, PromoteSpare, Relabel
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.recovery_cost import GroupStart, OperatorTimes, add_badput, recovery_cost
from flywheel.spec.status import TrainingJobStatus
from flywheel.trainer.progress_publisher import ProgressState


def test_the_parts_of_a_recovery_add_up_to_the_fault_to_first_step_time() -> None:
    op = OperatorTimes("PodDeleted", fault_at=100.0, decided_at=100.4, acted_at=100.5, ready_at=100.5)
    group = GroupStart(started_at=101.8, first_step_at=102.1, restore_seconds=0.3, restore_source="memory-peer",
                       restore_step=40, resumed_from=40, step_before=42)
    cost = recovery_cost(op, group)
    assert round(cost.detect_seconds, 3) == 0.4 and round(cost.decide_seconds, 3) == 0.1
    assert cost.pod_ready_seconds == 0.0  # a promoted spare waited ready
    assert round(cost.rendezvous_seconds, 3) == 1.0 and round(cost.restore_seconds, 3) == 0.3
    assert round(cost.first_step_seconds, 3) == 0.3 and round(cost.total_seconds, 3) == 2.1
    assert cost.replayed_steps == 2
    status = cost.to_status()
    assert status["restoreSource"] == "memory-peer" and status["totalSeconds"] == 2.1
    assert add_badput({"PodDeleted": 1.0}, cost) == {"PodDeleted": 3.1}


def test_parts_whose_ends_come_out_of_order_count_zero_and_the_sum_stays_the_total() -> None:
    # The trainer's start before the operator saw the pod ready (a poll's lag): rendezvous 0, not negative.
    op = OperatorTimes("NodeLost", fault_at=10.0, decided_at=16.0, acted_at=16.1, ready_at=19.0)
    cost = recovery_cost(op, GroupStart(started_at=18.0, first_step_at=19.5, restore_seconds=1.0))
    assert min(cost.parts().values()) >= 0.0 and round(cost.total_seconds, 3) == 9.5


def worker(name: str, index: int, generation: int, **kw: object) -> PodView:
    return PodView(name=name, uid=name, index=index, generation=generation, phase="Running", ready=True,
                   **kw)  # type: ignore[arg-type]


def test_the_fault_is_the_earliest_end_or_deletion_of_a_pod_left_behind_else_the_last_step_seen() -> None:
    pods = [worker("w-0", 0, 1, finished_at=50.0), worker("w-1", 1, 1, deleting_since=40.0)]
    assert fault_time(pods, 1, {"w-1"}, 30.0, 60.0) == 50.0  # w-1 survives (relabelled)
    assert fault_time([worker("w-0", 0, 1)], 1, set(), 30.0, 60.0) == 30.0  # a lost node: the last step seen
    assert fault_time([worker("w-0", 0, 1)], 1, set(), None, 60.0) == 60.0


def record(attempt: float, t: float, step: int, resumed: int = 0, **kw: object) -> ProgressRecord:
    return ProgressRecord(time=t, attempt=attempt, step=step, resumed_from=resumed, **kw)  # type: ignore[arg-type]


def test_the_clock_records_a_decided_recovery_once_its_group_trained_a_step() -> None:
    clock, ledger = RecoveryClock(), ProgressLedger()
    ledger.add(record(1.0, 99.0, 42))
    before = TrainingJobStatus.model_validate({"workerGeneration": 1})
    after = TrainingJobStatus.model_validate({"workerGeneration": 2, "lastRestartReason": "PodDeleted"})
    pods = [worker("w-0", 0, 1), worker("w-1", 1, 1, deleting_since=100.0)]
    clock.decided(before, after, pods, [Relabel("w-0", 2)], 99.0, 100.4)
    clock.acted([PromoteSpare("s-0", 1, 2)], 100.5)
    assert clock.finish(ledger) is None  # no step of a new group yet
    ledger.add(record(101.8, 101.8, 40, 40, restore_source="memory-peer", restore_step=40, restore_seconds=0.3))
    ledger.add(record(101.8, 102.1, 41, 40))
    cost = clock.finish(ledger)
    assert cost is not None and round(cost.total_seconds, 3) == 2.1 and cost.replayed_steps == 2
    assert clock.finish(ledger) is None  # recorded once
    progress = clock.progress(ObservedProgress(goodput={"ratio": 0.9}), ledger)
    assert progress.goodput["lastRecovery"]["restoreSource"] == "memory-peer"
    assert progress.goodput["badputSeconds"] == {"PodDeleted": 2.1}
    assert progress.last_restore == ("memory-peer", 40)
    status = TrainingJobStatus.model_validate({"goodput": progress.goodput}).to_json()
    assert status["goodput"]["lastRecovery"]["podReadySeconds"] == 0.0
    assert "restored step 40 from memory-peer" in recovered_message(cost)


def test_a_new_pod_is_ready_when_every_worker_of_the_generation_is() -> None:
    clock = RecoveryClock()
    before = TrainingJobStatus.model_validate({"workerGeneration": 1})
    after = TrainingJobStatus.model_validate({"workerGeneration": 2, "lastRestartReason": "NodeLost"})
    clock.decided(before, after, [worker("w-1", 1, 1)], [DeletePod("w-1", "w-1")], 99.0, 105.0)
    clock.acted([CreatePod(1, 2)], 105.1)
    assert clock.pending is not None and clock.pending.ready_at is None
    clock.observe_pods([worker("w-0", 0, 2), PodView("w-1", "x", 1, 2, "Pending")], 2, 106.0)
    assert clock.pending.ready_at is None
    clock.observe_pods([worker("w-0", 0, 2), worker("w-1", 1, 2)], 2, 108.0)
    assert clock.pending.ready_at == 108.0


def test_a_regroup_for_an_edited_spec_times_no_recovery_and_keeps_the_pending_one() -> None:
    """policy/spec_change.py's new generation (a replacement would have joined workers on an older spec) is no
    failure: the failure that needed the replacement stays the one timed, to the new group's readiness."""
    clock = RecoveryClock()
    before = TrainingJobStatus.model_validate({"workerGeneration": 1})
    after = TrainingJobStatus.model_validate({"workerGeneration": 2, "lastRestartReason": "PodDeleted"})
    clock.decided(before, after, [worker("w-1", 1, 1, deleting_since=100.0)], [Relabel("w-0", 2)], 99.0, 100.4)
    pending = clock.pending
    regrouped = TrainingJobStatus.model_validate({
        "workerGeneration": 3, "lastRestartReason": "PodDeleted", "phase": "Restarting",
        "conditions": [{"type": "Restarting", "status": "True", "reason": "RecreatingWithNewSpec"}]})
    clock.decided(after, regrouped, [worker("w-0", 0, 2)], [DeletePod("w-0", "w-0")], 100.0, 101.0)
    assert clock.pending == pending and pending is not None and pending.cause == "PodDeleted"


def test_the_restore_report_travels_in_the_progress_record_and_an_old_record_reads_as_none() -> None:
    state = ProgressState()
    state.observe("restore", {"step": 40, "source": "memory-own"}, 1.0)
    assert state.observe("start", {"resumed_from": 40, "world_size": 4, "restore_seconds": 0.25}, 2.0)
    assert state.record is not None
    back = decode(encode(state.record))
    assert back is not None and (back.restore_source, back.restore_step, back.restore_seconds) == \
        ("memory-own", 40, 0.25)
    assert state.observe("step", {"step": 41}, 2.5)  # a group's first step is published at once
    assert not state.observe("step", {"step": 42}, 2.6)
    assert state.observe("start", {"resumed_from": 0}, 3.0) and state.record.restore_source == ""
    assert b"restore" not in encode(state.record)


def test_the_recovery_event_log_record_parses_and_the_fold_keeps_it_apart() -> None:
    raw = {"event": "recovery", "time": 5.0, "cause": "PodDeleted", "total_seconds": 2.1, "detect_seconds": 0.4,
           "restore_source": "disk", "restore_step": 3, "replayed_steps": 1}
    rec = parse_record(raw)
    assert isinstance(rec, Recovery) and rec.detect_seconds == 0.4 and rec.restore_source == "disk"
    run = fold([rec])
    assert run.recovery_records == [rec] and run.done is None
