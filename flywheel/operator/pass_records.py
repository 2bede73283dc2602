"""What a job's pass (executor.py) writes and records besides its actions: the status write itself (one writer per
job, the resourceVersion read as precondition; a new job's first write waits for kopf's own patch), the checkpoint
events the pass decided (policy/checkpoint_events.py), the operator's metrics of a written status and the recovery
record. `PassRecords` owns what they remember."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from flywheel.contracts.labels import FINALIZER
from flywheel.kube.client import Kube, KubeApiError
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.operator.observe import Observer
from flywheel.operator.recovery_record import record_recovery, recovered_message
from flywheel.policy import reasons as R
from flywheel.policy.checkpoint_events import CheckpointPosts
from flywheel.policy.decisions import Pass
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from flywheel.spec.status import TrainingJobStatus

WRITES_REMEMBERED = 8  # own status writes whose watch events are recognised as such (the runner's job_event)


def kopf_settled(obj: dict[str, Any]) -> bool:
    """Whether kopf has made its patch of a new job (its finalizer, which holds the job until its daemon exits):
    from then on the runner is the job's only writer, so a status write with the version read does not lose."""
    return FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or [])


class PassRecords:
    def __init__(self, kube: Kube, logger: logging.Logger | logging.LoggerAdapter[Any], metrics: OperatorMetrics | None,
                 observer: Observer, event: Callable[[dict[str, Any], str, str, str], Awaitable[None]],
                 poke: Callable[[], None]) -> None:
        """`observer`: the job's (its own writes, progress and recovery clock); `event` posts one event."""
        self.kube, self.logger, self.metrics, self.event, self.poke = kube, logger, metrics, event, poke
        self.namespace, self.name = observer.namespace, observer.name
        self.path = Kube.custom(GROUP, VERSION, self.namespace, PLURAL, self.name)
        self.own, self.events_path = observer.own, observer.events_path
        self.progress, self.recovery = observer.etcd.progress, observer.recovery
        # The resourceVersions of the last status writes: their watch events wake no pass (two writes in quick
        # succession see the first one's event after the second is written).
        self.written_versions: deque[str] = deque(maxlen=WRITES_REMEMBERED)
        self.recovering_reason = ""  # the last restart's reason, for the time-to-recover histogram
        self.recoveries_seen_until = time.time()  # recoveries before this process started were measured before

    async def write_status(self, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        """Write `status` if it changed, with the resourceVersion read (one writer per job: this runner). False
        when the object changed under us: the pass is redone from fresh observations."""
        if status == (obj.get("status") or {}):
            return True
        try:
            answer = await self.kube.merge_patch(self.path + "/status", {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "status": status})
            self.own.wrote_job(obj, answer)
            self.written_versions.append(str(answer["metadata"].get("resourceVersion")))
        except KubeApiError as err:
            if err.status == 409:
                # Not redone at once: the cache still shows the version that lost, and a pass on it would lose again.
                # The change that won reaches the cache and wakes the runner (handlers.training_jobs); the tick is
                # the backstop.
                self.logger.info("status changed under us; redoing the pass when the cache has the change")
                return False
            raise
        return True

    async def post_checkpoints(self, obj: dict[str, Any], posts: CheckpointPosts) -> None:
        """The checkpoint notices' Warning events, then the CheckpointCommitted event the pass decided (at most one
        per interval; a finished job's at once). Not retried: a lost event is lost."""
        for reason, message in posts.notices:
            await self.event(obj, "Warning", reason, message)
        event = posts.event
        if event is None:
            return
        try:
            await self.kube.post_event(obj, "Normal", R.CHECKPOINT_COMMITTED, event.message, count=event.count,
                                       first_time=event.first_time, last_time=event.last_time)
        except KubeApiError as err:
            self.logger.warning(f"could not post event {R.CHECKPOINT_COMMITTED}: {err}")

    def record_metrics(self, status: dict[str, Any] | None, previous: TrainingJobStatus, views: list[PodView],
                        progress: ObservedProgress) -> None:
        """Metrics of a written status (None: the pass changed nothing): phase, restarts, goodput; time to detect a
        pod failure (its container's end -> the restart decision; a hang's is the monitor's); time to recover (the
        last step before a restart -> the first step after it, from the progress; only recoveries seen by this
        operator process)."""
        assert self.metrics is not None
        self._record_recoveries(progress)
        if status is None:
            return
        previous_restarts = previous.restarts
        self.metrics.observe_job(self.namespace, self.name, status, previous_restarts)
        reason = str(status.get("lastRestartReason", ""))
        now = time.time()
        if int(status.get("restarts", 0)) > previous_restarts:
            self.recovering_reason = reason
            ended = [v.finished_at for v in views if v.finished_at is not None and v.generation == previous.generation]
            if ended and reason != R.RESTART_HUNG:
                self.metrics.time_to_detect_seconds.labels(reason).observe(max(0.0, now - min(ended)))

    def _record_recoveries(self, progress: ObservedProgress) -> None:
        assert self.metrics is not None
        for at, seconds in progress.recoveries:
            if at > self.recoveries_seen_until:
                self.recoveries_seen_until = at
                self.metrics.time_to_recover_seconds.labels(self.recovering_reason or "Unknown").observe(seconds)

    async def record_recovery(self, obj: dict[str, Any], result: Pass) -> None:
        """Time the recovery this pass acted on; once its group trained a step, record it (recovery_record.py):
        the next pass writes it into status.goodput."""
        self.recovery.acted(result.actions, time.time())
        cost = self.recovery.finish(self.progress.ledger)
        if cost is None:
            return
        self.poke()  # the next pass writes the record
        record_recovery(self.events_path, cost)
        if self.metrics is not None:
            self.metrics.observe_recovery(self.namespace, self.name, cost.cause, cost.parts(), cost.replayed_steps)
        await self.event(obj, "Normal", R.RECOVERED, recovered_message(cost))
