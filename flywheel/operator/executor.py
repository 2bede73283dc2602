"""Carries out reconcile passes for one TrainingJob: observe (the `Observer`, observe.py: one `Observed` value) ->
`policy.reconcile.reconcile(spec, invalid, status, observed, now)` -> write the status once (resourceVersion
precondition) -> act (the `Actuator`, job_actions.py) -> post events.

The job, its pods, its Service and the lost nodes are read from the operator's watch-fed caches (caches.py), with
the runner's own writes laid over them until the watch has delivered them (own_writes.py): a pass sends the API
server only the writes it decides, none when nothing changed.

One `JobRunner` per TrainingJob runs inside a kopf daemon. It runs a pass when something the pass reads changed (a
watch event on the job -- not its own status write -- or on its pods or Service, an etcd liveness or progress
change, a health finding) and when a time-based rule comes due: every rule is the policy's (`Pass.next_due`,
policy/due.py: the progress hang and the held-back checkpoint events included); besides it only what the observer
sees change by itself (a missing liveness key's grace, an own write the caches must show) and I/O retries; at the
latest every SAFETY_TICK_SECONDS. A job with nothing happening costs no pass. If the status write loses a race (409)
nothing is done in that pass: the next one starts over from fresh observations, so no action is ever taken twice
for one decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from flywheel.kube.client import Kube, KubeApiError
from flywheel.monitor.findings import FindingsInbox
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.operator import manifests as m
from flywheel.operator.caches import ApiReads, ClusterReads
from flywheel.operator.job_actions import Actuator
from flywheel.operator.observe import Observer
from flywheel.operator.own_writes import OwnWrites
from flywheel.operator.pass_records import PassRecords, kopf_settled
from flywheel.operator.shared_etcd import SharedEtcd
from flywheel.policy.decisions import Pass
from flywheel.policy.lost_agents import lost_agents
from flywheel.policy.observed import Observed, PodView
from flywheel.policy.reconcile import reconcile
from flywheel.spec import SpecError, TrainingJob, parse_cluster_job
from flywheel.spec.status import Phase, TrainingJobStatus

# A pass at least this often with nothing due: what a missed wake-up costs at most (every change wakes the runner).
SAFETY_TICK_SECONDS = 30.0
RETRY_SECONDS = 1.0  # after a pass that failed (an API error)
# A pass woken by a watch event waits this long first, so that the events of one change arriving together (a job's
# workers exiting, becoming ready, or deleted with their node) make one pass and one status write instead of one
# per pod: in a burst of 500 two-pod jobs, ~0.8 status writes per job showed a half-finished job.
COALESCE_SECONDS = 0.03
# The longest a new job's first pass waits for kopf's own patches (kopf_settled; their event ends the wait): in a
# burst of new jobs on a real API server the patch comes seconds after the runner starts.
KOPF_SETTLE_SECONDS = 10.0
# What a status write changes in the job's metadata: not read by the parsed job (its spec and name are).
_VOLATILE_METADATA = frozenset({"resourceVersion", "managedFields"})


class JobRunner:
    """The pass loop of one job, with three collaborators that each own their state: the `Observer` (observe.py),
    the `Actuator` (job_actions.py) and the `PassRecords` (the status write, events, metrics: pass_records.py)."""

    def __init__(self, kube: Kube, settings: m.OperatorSettings, namespace: str, name: str, uid: str,
                 logger: logging.Logger | logging.LoggerAdapter[Any], metrics: OperatorMetrics | None = None,
                 etcd: SharedEtcd | None = None, reads: ClusterReads | None = None, *,
                 under_kopf: bool = False) -> None:
        """`etcd`: the operator's shared session (none: no liveness watch or rendezvous reset). `reads`: the
        operator's watch-fed caches (none: every pass reads the API, for passes driven by hand). `under_kopf`: kopf
        handles the job too, so the first pass waits for kopf's own patches (kopf_settled)."""
        self.logger, self.metrics, self.namespace, self.name, self.uid = logger, metrics, namespace, name, uid
        self.wake = asyncio.Event()
        self.observer = Observer(settings, logger, namespace, name, uid, etcd,
                                 reads if reads is not None else ApiReads(kube), OwnWrites(), self.poke)
        self.actuator = Actuator(kube, settings, logger, (namespace, name, uid), self.observer)
        self.records = PassRecords(kube, logger, metrics, self.observer, self.actuator.event, self.poke)
        self.parsed: tuple[Any, TrainingJob | None, str | None] | None = None  # (parsed from, job, problems)
        # kopf_settled's wait ends then at the latest; a pass driven by hand has no kopf to wait for
        self.settle_until = time.monotonic() + KOPF_SETTLE_SECONDS if under_kopf else 0.0
        self.settling = False  # the last pass waited for kopf's patch
        self.pass_due: float | None = None  # the last pass's (Pass.next_due), or the end of kopf's wait

    # -- wiring -------------------------------------------------------------------------------------------------
    @property
    def findings(self) -> FindingsInbox:
        """Where the health monitor reports this job's findings (handlers.findings_inbox)."""
        return self.observer.findings

    @property
    def seen_pods(self) -> list[PodView]:
        """The pods of the last written pass (handlers.ranks_restarted)."""
        return self.observer.seen_pods

    def poke(self) -> None:
        self.wake.set()

    def job_event(self, resource_version: str | None) -> None:
        """A watch event of the job: a pass, unless it only shows this runner's own status write."""
        if resource_version is None or resource_version not in self.records.written_versions:
            self.poke()
        else:
            self.observer.own.cache_shows_job(resource_version)

    def pod_event(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A watch event of one of the job's pods: a pass, unless it only echoes this runner's own create."""
        if event_type == "DELETED" or not self.observer.own.echoes_create(pod):
            self.poke()

    def service_gone(self) -> None:
        """The headless Service was deleted: created again by the next pass, now."""
        self.actuator.service_gone()
        self.poke()

    def next_due(self) -> float | None:
        """When a pass is next due with nothing else changed (unix seconds; None: only on a change): the policy's
        (every time-based rule), or when an observation changes by itself or an I/O is retried."""
        times = [self.pass_due, self.observer.due(), self.actuator.create_retry_due]
        return min((t for t in times if t is not None), default=None)

    async def run(self, stopped: kopf.DaemonStopped) -> None:
        stopping = asyncio.ensure_future(self._wake_when_stopped(stopped))
        try:
            while not stopped:
                started, result = time.monotonic(), "error"
                # Cleared before the pass, not after: a poke that arrives during it (a pod event, a 409 redo) must
                # run another pass at once instead of waiting for the next one due.
                self.wake.clear()
                due: float | None = time.time() + RETRY_SECONDS
                try:
                    await self.reconcile_once()
                    result, due = "ok", self.next_due()
                except KubeApiError as err:
                    self.logger.warning(f"API error during reconcile (retrying): {err}")
                except Exception:
                    self.logger.exception("reconcile pass failed (retrying)")
                if self.metrics is not None:
                    self.metrics.reconcile_duration_seconds.labels(result).observe(time.monotonic() - started)
                await self._sleep(due)
                # Nothing to gather when kopf's patch ends a new job's wait: its pods come from the pass it wakes.
                if self.wake.is_set() and not stopped and not self.settling:
                    await asyncio.sleep(COALESCE_SECONDS)
        finally:
            stopping.cancel()
            if self.metrics is not None:
                self.metrics.forget_job(self.namespace, self.name)
            await self.observer.etcd.stop()

    async def _wake_when_stopped(self, stopped: kopf.DaemonStopped) -> None:
        await stopped.wait()
        self.wake.set()

    async def _sleep(self, due: float | None) -> None:
        """Until poked (stopping pokes too), or `due` (unix seconds), or SAFETY_TICK_SECONDS at the latest."""
        seconds = min(SAFETY_TICK_SECONDS, due - time.time()) if due is not None else SAFETY_TICK_SECONDS
        if seconds <= 0:
            return
        try:
            async with asyncio.timeout(seconds):
                await self.wake.wait()
        except TimeoutError:
            pass

    # -- one pass -----------------------------------------------------------------------------------------------
    async def reconcile_once(self) -> None:
        # Each set again by the part of the pass that decides it (a pass that ends early leaves them unset).
        self.pass_due = self.actuator.create_retry_due = None
        self.observer.new_pass()
        obj = self.observer.own.job(await self.observer.reads.job(self.namespace, self.name))
        if obj is None or obj["metadata"].get("deletionTimestamp") or obj["metadata"]["uid"] != self.uid:
            return
        self.settling = not self.records.written_versions and not kopf_settled(obj) \
            and time.monotonic() < self.settle_until
        if self.settling:
            # kopf patches a new job's finalizer: a status written before would lose to it (409) and its pass be
            # redone. The patch's event wakes this runner; the bound is the backstop.
            self.pass_due = time.time() + (self.settle_until - time.monotonic())
            return
        job, invalid = self._parse(obj)
        status_in = TrainingJobStatus.model_validate(obj.get("status") or {})
        observed = await self.observer.observe(obj, job, status_in)
        status_in.selector = f"{m.JOB_LABEL}={self.name}"
        result = reconcile(job.spec if job else None, invalid, status_in, observed, time.time())
        written = result.status.to_json()
        changed = written != (obj.get("status") or {})
        if not await self.records.write_status(obj, written):
            return
        self.pass_due = result.next_due
        # Everything below only after the status that decided it is written: a lost race (409) does nothing.
        self.observer.written(observed)
        self._remember_hang(result)
        try:
            await self._carry_out(obj, job, result, status_in, observed, written if changed else None)
        finally:  # the status already tells of them: a failed action must not lose its pass's events
            for ev in result.events:
                await self.actuator.event(obj, ev.type, ev.reason, ev.message)
        if result.checkpoints is not None:
            self.observer.checkpoint_events = result.checkpoints.memory
            await self.records.post_checkpoints(obj, result.checkpoints)

    def _remember_hang(self, result: Pass) -> None:
        """The progress hang this pass found (policy/progress_hang.py): one report per generation."""
        self.observer.hang_reported = result.hang_reported
        hang = result.hang
        if hang is None:
            return
        self.logger.warning(f"job is hung: {hang.message}")
        if self.metrics is not None:
            self.metrics.time_to_detect_seconds.labels("Hang").observe(hang.idle_seconds)

    async def _carry_out(self, obj: dict[str, Any], job: TrainingJob | None, result: Pass,
                         status_in: TrainingJobStatus, observed: Observed, written: dict[str, Any] | None) -> None:
        """What a written pass does: the etcd watches, the Service, metrics, its actions, the recovery record.
        `written`: the status written (None: unchanged). The Service and budget go while the pods are created (no
        pod needs them first; they report their own failures): a new job's pods start two round trips sooner."""
        views, seen = self.observer.views, observed.pods  # the pods, and with them those vanished unseen
        service: asyncio.Future[None] | None = None
        if job is not None and result.status.phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
            await self.observer.etcd.start(job, bool(job.spec.replicas.spares or result.status.drain.replacements
                                                     or any(v.is_spare for v in views)))
            service = asyncio.ensure_future(self.actuator.ensure_service(obj, job))
        try:
            if self.metrics is not None:
                self.records.record_metrics(written, status_in, views, observed.progress)
            agents = self.observer.agents
            lost = agents.of(lost_agents(seen, status_in.generation, result.status.generation, result.actions))
            agents.keep({v.name for v in seen})
            self.observer.recovery.decided(status_in, result.status, seen, result.actions,
                                           self.observer.etcd.progress.last_step_seen, time.time())
            await self.actuator.act(obj, job, result)
        finally:
            if service is not None:
                await service
        if lost:
            self.actuator.expire_in_background(job, lost)
        await self.records.record_recovery(obj, result)

    def _parse(self, obj: dict[str, Any]) -> tuple[TrainingJob | None, str | None]:
        """The job as parsed (None and the problems when invalid), parsed again only when what it is parsed from
        changed: most passes follow a pod event or a status write, not a change of the spec."""
        meta = {k: v for k, v in obj["metadata"].items() if k not in _VOLATILE_METADATA}
        source = (obj.get("apiVersion"), obj.get("kind"), meta, obj.get("spec"))
        if self.parsed is None or self.parsed[0] != source:
            try:
                self.parsed = (source, parse_cluster_job(obj), None)
            except SpecError as err:
                self.parsed = (source, None, "; ".join(err.problems))
        return self.parsed[1], self.parsed[2]
