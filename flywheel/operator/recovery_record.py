"""The operator's record of each recovery it decides (policy/recovery_cost.py computes the parts): the times it
sees itself (the fault, its decision, its actions, the replacement ready) are kept here; the trainer's progress
records (monitor/etcd_progress.py's ledger) give the new group's restore, start and first step. Once the first
step is in, the recovery is recorded: in status.goodput.lastRecovery / badputSeconds (through the observed
progress the pass reads), as a `recovery` event-log record, as metrics, and as a Recovered event naming the restore
source. status.lastRestore follows the newest attempt's restore report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from flywheel.eventlog import EventLog
from flywheel.monitor.etcd_progress import ProgressLedger
from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition
from flywheel.policy.decisions import CreatePod, JobAction, PromoteSpare, Relabel, RestartRanks
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.recovery_cost import GroupStart, OperatorTimes, RecoveryCost, add_badput, recovery_cost
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus


def fault_time(pods: Sequence[PodView], generation_before: int, relabelled: set[str], last_step_seen: float | None,
               now: float) -> float:
    """When the fault happened, as well as the operator can tell: the earliest end or deletion of a pod the
    restart left behind; else (a lost node, a vanished pod) the last step seen before it; else now."""
    seen = [t for p in pods if not p.is_spare and p.generation <= generation_before and p.name not in relabelled
            for t in (p.finished_at, p.deleting_since) if t is not None]
    if seen:
        return min(seen)
    return last_step_seen if last_step_seen is not None and last_step_seen <= now else now


def group_after(ledger: ProgressLedger, fault_at: float) -> GroupStart | None:
    """The first group started after the fault that has trained a step, with the step the one before reached."""
    ordered = [ledger.attempts[k] for k in sorted(ledger.attempts)]
    for before, after in zip(ordered, ordered[1:]):
        if after.first.attempt > fault_at and after.first_step_time is not None:
            first = after.first
            return GroupStart(first.attempt, after.first_step_time, first.restore_seconds, first.restore_source,
                              first.restore_step, first.resumed_from, before.max_step)
    return None


class RecoveryClock:
    def __init__(self) -> None:
        self.pending: OperatorTimes | None = None
        self.last: RecoveryCost | None = None
        self.badput: dict[str, float] = {}

    def decided(self, status_in: TrainingJobStatus, status_out: TrainingJobStatus, pods: Sequence[PodView],
                actions: Sequence[JobAction], last_step_seen: float | None, now: float) -> None:
        """After a written pass: a new generation starts a recovery to time. One begun by a resume, or by a regroup
        for an edited spec (policy/spec_change.py), is none: nothing failed (a recovery pending goes on)."""
        if status_out.generation <= status_in.generation or status_in.phase is Phase.SUSPENDED:
            return
        restarting = condition(status_out, ConditionType.RESTARTING)
        if restarting is not None and restarting.reason == R.SPEC_REGROUP:
            return
        relabelled = {a.name for a in actions if isinstance(a, Relabel)}
        fault = fault_time(pods, status_in.generation, relabelled, last_step_seen, now)
        self.pending = OperatorTimes(status_out.last_restart_reason or "Unknown", min(fault, now), now, now)

    def acted(self, actions: Sequence[JobAction], now: float) -> None:
        """The decision's actions are carried out; a promoted spare, or the pods whose ranks restart in place, are
        the replacement, ready at once."""
        if self.pending is None or self.pending.acted_at != self.pending.decided_at:
            return
        kept = any(isinstance(a, PromoteSpare | RestartRanks) for a in actions)
        created = any(isinstance(a, CreatePod) for a in actions)
        ready = now if kept and not created else None
        self.pending = replace(self.pending, acted_at=now, ready_at=ready)

    def observe_pods(self, pods: Sequence[PodView], generation: int, now: float) -> None:
        """The replacement is ready when every active worker of the generation is."""
        p = self.pending
        if p is None or p.ready_at is not None or p.acted_at == p.decided_at:
            return
        current = [v for v in pods if not v.is_spare and v.active and v.generation == generation]
        if current and all(v.ready and v.phase == "Running" for v in current):
            self.pending = replace(p, ready_at=now)

    def finish(self, ledger: ProgressLedger) -> RecoveryCost | None:
        """The pending recovery's record once its group trained a step (None until then)."""
        p = self.pending
        group = group_after(ledger, p.fault_at) if p is not None else None
        if p is None or group is None:
            return None
        self.pending, self.last = None, recovery_cost(p, group)
        self.badput = add_badput(self.badput, self.last)
        return self.last

    def progress(self, progress: ObservedProgress, ledger: ProgressLedger) -> ObservedProgress:
        """The observed progress with the recovery record and the newest restore report in it."""
        goodput = dict(progress.goodput)
        if self.last is not None and goodput:
            goodput.update(lastRecovery=self.last.to_status(), badputSeconds=dict(self.badput))
        latest = max(ledger.attempts.items())[1].first if ledger.attempts else None
        restore = (latest.restore_source, latest.restore_step) if latest and latest.restore_source else None
        return replace(progress, goodput=goodput, last_restore=restore or progress.last_restore)


def recovered_message(cost: RecoveryCost) -> str:
    """The Recovered event's message: the parts, and which restore source the recovery used."""
    status = cost.to_status()
    restored = (R.MSG_RESTORED_FROM.format(step=cost.restore_step, source=cost.restore_source)
                if cost.restore_source else R.MSG_RESTORED_NOTHING)
    return R.MSG_RECOVERED.format(total=status["totalSeconds"], cause=cost.cause, detect=cost.detect_seconds,
                                  decide=cost.decide_seconds, ready=cost.pod_ready_seconds,
                                  rendezvous=cost.rendezvous_seconds, restore=cost.restore_seconds,
                                  first=cost.first_step_seconds, restored=restored, replayed=cost.replayed_steps)


def record_recovery(path: str | None, cost: RecoveryCost) -> None:
    """The `recovery` event-log record (readers that do not know it skip it)."""
    if not path:
        return
    log = EventLog(path)
    try:
        log.emit("recovery", **_fields(cost))
    finally:
        log.close()


def _fields(cost: RecoveryCost) -> dict[str, Any]:
    status = cost.to_status()
    return {"restore_step": cost.restore_step, "cause": status["cause"], "total_seconds": status["totalSeconds"],
            "detect_seconds": status["detectSeconds"], "decide_seconds": status["decideSeconds"],
            "pod_ready_seconds": status["podReadySeconds"], "rendezvous_seconds": status["rendezvousSeconds"],
            "restore_seconds": status["restoreSeconds"], "first_step_seconds": status["firstStepSeconds"],
            "restore_source": status["restoreSource"], "replayed_steps": status["replayedSteps"]}
