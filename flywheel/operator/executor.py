"""Carries out reconcile passes for one TrainingJob: observe (job, pods, nodes, etcd liveness and progress, the
event log) -> `policy.reconcile.reconcile` -> write the status once (resourceVersion precondition) -> act -> post
events.

The job, its pods, its Service and the lost nodes are read from the operator's watch-fed caches (caches.py), with
the runner's own writes laid over them until the watch has delivered them (own_writes.py): a pass sends the API
server only the writes it decides, none when nothing changed.

One `JobRunner` per TrainingJob runs inside a kopf daemon. It runs a pass when something the pass reads changed (a
watch event on the job -- not its own status write -- or on its pods or Service, an etcd liveness or progress
change, a health finding) and when a time-based rule comes due: the pass's own (`Pass.next_due`, policy/due.py)
and the runner's (a missing liveness key's grace, the hang timeouts, a held-back checkpoint event); at the latest
every SAFETY_TICK_SECONDS. A job with nothing happening costs no pass. Without Prometheus it also reports a hang
itself, from the etcd progress (progress_follower.py), into its findings inbox like the health monitor. If the
status write loses a race (409) nothing is done in that pass: the next one starts over from fresh observations, so
no action is ever taken twice for one decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import kopf

from flywheel.crd import GROUP, PLURAL, VERSION
from flywheel.etcd.liveness import WorkerWatch
from flywheel.kube.client import Kube, KubeApiError
from flywheel.labels import RESTART_ANNOTATION
from flywheel.monitor.findings import FindingsInbox
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.operator import manifests as m
from flywheel.operator.caches import ApiReads, ClusterReads
from flywheel.operator.create_failures import CreateFailures
from flywheel.operator.drain import DrainFollower, node_marks
from flywheel.operator.etcd_views import EtcdViews, key_owners
from flywheel.operator.event_log import EventLogTail, events_file
from flywheel.operator.job_actions import JobActions
from flywheel.operator.own_writes import OwnWrites
from flywheel.operator.pass_records import PassRecords, kopf_settled, last_checkpoint_time
from flywheel.operator.progress_follower import JobProgress
from flywheel.operator.recovery_record import RecoveryClock
from flywheel.operator.rendezvous_expiry import AgentMemory
from flywheel.operator.shared_etcd import SharedEtcd
from flywheel.policy.checkpoint_events import CheckpointEventState, seed
from flywheel.policy.checkpoint_sharing import checkpoint_location
from flywheel.policy.conditions import TERMINAL
from flywheel.policy.decisions import (
    Pass,
)
from flywheel.policy.drain import DrainInput
from flywheel.policy.lost_agents import lost_agents
from flywheel.policy.observed import CheckpointSharing, HealthFindings, ObservedProgress, PodView
from flywheel.policy.reconcile import reconcile
from flywheel.policy.vanished import vanished_pods
from flywheel.spec import SpecError, TrainingJob, parse_cluster_job
from flywheel.spec_status import Phase, TrainingJobStatus
from flywheel.timefmt import parse_rfc3339

# A pass at least this often with nothing due: what a missed wake-up costs at most (every change wakes the runner).
SAFETY_TICK_SECONDS = 30.0
RETRY_SECONDS = 1.0  # after a pass that failed (an API error)
# A pass woken by a watch event waits this long first, so that the events of one change arriving together (a job's
# workers exiting, becoming ready, or deleted with their node) make one pass and one status write instead of one
# per pod: in a burst of 500 two-pod jobs, ~0.8 status writes per job showed a half-finished job.
COALESCE_SECONDS = 0.03
WRITES_REMEMBERED = 8  # own status writes whose watch events are recognised as such (job_event)
# The longest a new job's first pass waits for kopf's own patches (kopf_settled; their event ends the wait): in a
# burst of new jobs on a real API server the patch comes seconds after the runner starts.
KOPF_SETTLE_SECONDS = 10.0
# What a status write changes in the job's metadata: not read by the parsed job (its spec and name are).
_VOLATILE_METADATA = frozenset({"resourceVersion", "managedFields"})


class JobRunner(EtcdViews, JobActions, PassRecords):
    def __init__(self, kube: Kube, settings: m.OperatorSettings, namespace: str, name: str, uid: str,
                 logger: logging.Logger | logging.LoggerAdapter[Any], metrics: OperatorMetrics | None = None,
                 etcd: SharedEtcd | None = None, reads: ClusterReads | None = None, *,
                 under_kopf: bool = False) -> None:
        """`etcd`: the operator's shared session (none: no liveness watch or rendezvous reset). `reads`: the
        operator's watch-fed caches (none: every pass reads the API, for passes driven by hand). `under_kopf`: kopf
        handles the job too, so the first pass waits for kopf's own patches (kopf_settled)."""
        self.kube, self.settings, self.logger, self.metrics = kube, settings, logger, metrics
        self.reads: ClusterReads = reads if reads is not None else ApiReads(kube)
        self.own = OwnWrites()  # this runner's writes the caches may not show yet
        self.etcd = etcd
        self.namespace, self.name, self.uid = namespace, name, uid
        self.path = Kube.custom(GROUP, VERSION, namespace, PLURAL, name)
        self.wake = asyncio.Event()
        self.events_path = (str(events_file(settings.events_dir, namespace, name, uid))
                            if settings.events_dir else None)
        self.tail = EventLogTail(events_file(settings.events_dir, namespace, name, uid)) if self.events_path else None
        self.live: dict[str, Any] | None = None  # replica id -> LiveWorker, None until the watch reported
        self.seen_live: dict[str, float | None] = {}  # pod uid -> since when its key is missing (None: present)
        self.exited_agents: set[str] = set()  # pod uids whose agent marked its key exited
        # Pods judged dead by their lease stay so while Terminating: the force delete after nodeFailureGraceSeconds
        # must not wait for the node monitor (40 s) to confirm what etcd already said.
        self.dead_by_lease: set[str] = set()
        self.key_owner: dict[int, str] = {}  # replica index -> uid of the pod its liveness key belongs to
        self.service_checked_at: float | None = None  # monotonic time the headless Service was last seen
        self.service_failure = ""  # why the headless Service could not be created (reported once per cause)
        self.create_failures = CreateFailures()
        self.pod_group_tried = False
        self.budget_min: int | None = None  # the PodDisruptionBudget's minAvailable as this runner wrote it
        self.budget_failure = ""
        self.findings = FindingsInbox(self.poke)  # the health monitor's reports (monitor/findings.py)
        self.watch: WorkerWatch | None = None
        self.spare_watch: Any = None  # the spare agents' keys (flywheel/etcd/spares.py watch_spares)
        self.live_spares: dict[str, Any] = {}  # spare pod name -> its LiveSpare key
        # Pod uid -> when this runner promoted it: a promoted spare's worker key is one written after that, not its
        # predecessor's (whose key may be newer than the spare pod itself).
        self.promoted_at: dict[str, float] = {}
        self.recovering_reason = ""  # the last restart's reason, for the time-to-recover histogram
        self.recoveries_seen_until = time.time()  # recoveries before this process started were measured before
        self.checkpoint_events: CheckpointEventState | None = None  # seeded by the first pass
        self.checkpoint_notices_posted: int | None = None  # the checkpoint notices posted (None: first pass)
        self.progress = JobProgress(self.poke)  # the etcd progress record (step, checkpoint, goodput, hangs)
        self.hang_reported: int | None = None  # the generation (restarts) whose hang was reported
        # The last written pass's pods and the uids this runner deleted since: a pod gone unseen by anyone else
        # (force-deleted with grace 0) is a PodDeleted interruption (policy/vanished.py).
        self.seen_pods: list[PodView] = []
        self.deleted_pods: set[str] = set()
        self.parsed: tuple[Any, TrainingJob | None, str | None] | None = None  # (parsed from, job, problems)
        # The resourceVersions of this runner's last status writes: their watch events wake no pass (two writes in
        # quick succession see the first one's event after the second is written).
        self.written_versions: deque[str] = deque(maxlen=WRITES_REMEMBERED)
        # kopf_settled's wait ends then at the latest; a pass driven by hand has no kopf to wait for
        self.settle_until = time.monotonic() + KOPF_SETTLE_SECONDS if under_kopf else 0.0
        self.settling = False  # the last pass waited for kopf's patch
        # When the last pass's time-based rules come due (unix seconds; None: none): the policy's, a missing
        # liveness key's grace, the hang timeouts', a held-back checkpoint event's, a failed etcd watch's retry, a
        # failed pod create's retry (an unseen own write's expiry is the overlay's: `own.due()`).
        self.pass_due: float | None = None
        self.liveness_due: float | None = None
        self.hang_due: float | None = None
        self.checkpoint_due: float | None = None
        self.etcd_retry_due: float | None = None
        self.create_retry_due: float | None = None
        self.drain = DrainFollower(self.poke, logger)  # drain ahead: the checkpoint request and answers (etcd)
        self.recovery = RecoveryClock()  # the recovery being timed, and the last one's record
        self.agents = AgentMemory()  # each worker pod's agent (host, pid), for the rendezvous expiry
        self.expiring: set[asyncio.Future[None]] = set()  # expiries of lost agents under way (background tasks)

    # -- wiring -------------------------------------------------------------------------------------------------
    def poke(self) -> None:
        self.wake.set()

    def job_event(self, resource_version: str | None) -> None:
        """A watch event of the job: a pass, unless it only shows this runner's own status write."""
        if resource_version is None or resource_version not in self.written_versions:
            self.poke()
        else:
            self.own.cache_shows_job(resource_version)

    def pod_event(self, event_type: str | None, pod: Mapping[str, Any]) -> None:
        """A watch event of one of the job's pods: a pass, unless it only echoes this runner's own create."""
        if event_type == "DELETED" or not self.own.echoes_create(pod):
            self.poke()

    def service_gone(self) -> None:
        """The headless Service was deleted: created again by the next pass, now."""
        self.service_checked_at = None
        self.poke()

    def next_due(self) -> float | None:
        """When a pass is next due with nothing else changed (unix seconds; None: only on a change)."""
        times = [self.pass_due, self.liveness_due, self.hang_due, self.checkpoint_due, self.etcd_retry_due,
                 self.create_retry_due, self.own.due()]
        return min((t for t in times if t is not None), default=None)

    async def _drain_input(self, findings: HealthFindings) -> DrainInput:
        """The nodes that are leaving (cordoned, a --drain-taint-keys taint, a fatal XID) and the request's answers."""
        return self.drain.observe(node_marks(await self.reads.node_marks(), self.settings.drain_taint_keys,
                                             dict(findings.node_faults)))

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
            for watch in (self.watch, self.spare_watch):
                if watch is not None:
                    await asyncio.get_running_loop().run_in_executor(None, watch.stop)
            await asyncio.get_running_loop().run_in_executor(None, self.progress.stop)
            await asyncio.get_running_loop().run_in_executor(None, self.drain.stop)

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
    async def _observe(self, status_in: TrainingJobStatus) -> tuple[list[PodView], ObservedProgress]:
        now = time.time()
        pods = self.own.pods(await self.reads.pods(self.namespace, self.name), now)
        pods = [p for p in pods if any(o.get("uid") == self.uid for o in p["metadata"].get("ownerReferences", []))]
        lost = await self.reads.lost_nodes()
        views, workers = [], []
        for obj in pods:
            view = m.pod_view(obj, lost)
            if view is not None and view.is_spare:
                views.append(replace(view, spare_ready=self._spare_ready(view)))
            elif view is not None:
                workers.append((view, max(parse_rfc3339(obj["metadata"].get("creationTimestamp")) or 0.0,
                                          self.promoted_at.get(view.uid, 0.0))))
        self.key_owner = key_owners(workers, self.live)
        for view, _ in workers:
            self.agents.remember(view, self._own_key(view))
            views.append(replace(view, liveness_lost=self._liveness_lost(view, now),
                                 agent_alive=self._agent_alive(view), spare_ready=self._spare_ready(view),
                                 **self._rank_restarts(view)))
        alive = {v.uid for v in views}
        self.seen_live = {k: v for k, v in self.seen_live.items() if k in alive}
        self.dead_by_lease &= alive
        self.exited_agents &= alive
        self.promoted_at = {k: v for k, v in self.promoted_at.items() if k in alive}
        progress = self.progress.observe(self.tail.poll() if self.tail is not None else None, status_in.goodput)
        return views, progress

    async def _sharing(self, obj: dict[str, Any], job: TrainingJob | None) -> CheckpointSharing:
        """This job and the other jobs whose checkpoints land where its do (policy/checkpoint_sharing.py)."""
        me = CheckpointSharing(self.namespace, self.name, str(obj["metadata"].get("creationTimestamp") or ""))
        location = job and checkpoint_location(self.namespace, job.spec.checkpoint.dir, job.spec.checkpoint.claim_name)
        if not location:
            return me
        users = await self.reads.checkpoint_users(location)
        return replace(me, others=tuple(u for u in users if (u.namespace, u.name) != (self.namespace, self.name)))

    async def reconcile_once(self) -> None:
        # Each set again by the part of the pass that decides it (a pass that ends early leaves them unset).
        self.pass_due = self.liveness_due = self.hang_due = self.checkpoint_due = self.etcd_retry_due = None
        self.create_retry_due = None
        obj = self.own.job(await self.reads.job(self.namespace, self.name))
        if obj is None or obj["metadata"].get("deletionTimestamp") or obj["metadata"]["uid"] != self.uid:
            return
        self.settling = not self.written_versions and not kopf_settled(obj) and time.monotonic() < self.settle_until
        if self.settling:
            # kopf patches a new job's finalizer: a status written before would lose to it (409) and its pass be
            # redone. The patch's event wakes this runner; the bound is the backstop.
            self.pass_due = time.time() + (self.settle_until - time.monotonic())
            return
        job, invalid = self._parse(obj)
        status_in = TrainingJobStatus.model_validate(obj.get("status") or {})
        views, progress = await self._observe(status_in)
        self.recovery.observe_pods(views, status_in.generation, time.time())
        progress = self.recovery.progress(progress, self.progress.ledger)
        if job is not None and self.settings.hang_detection:
            self._check_hang(job, views, status_in)
        if self.checkpoint_events is None:  # what the operator before this process had seen: not posted again
            self.checkpoint_events = seed(progress.checkpoints, last_checkpoint_time(status_in))
        status_in.selector = f"{m.JOB_LABEL}={self.name}"
        annotations = obj["metadata"].get("annotations") or {}
        findings = self.findings.snapshot()
        gone = vanished_pods(self.seen_pods, views, self.deleted_pods, status_in.generation, time.time())
        # Only a spare's placement reads the usable nodes (policy/spare_placement.py): no set built for the rest.
        usable = await self.reads.usable_nodes() if any(v.is_spare for v in views) else frozenset[str]()
        result = reconcile(job.spec if job else None, invalid, status_in, views + gone, progress, time.time(),
                           int(obj["metadata"].get("generation", 0)), annotations.get(RESTART_ANNOTATION), findings,
                           await self._drain_input(findings), usable,
                           self.create_failures.current({v.name for v in views}, time.time()),
                           await self._sharing(obj, job))
        written = result.status.to_json()
        changed = written != (obj.get("status") or {})
        if not await self._write_status(obj, written):
            return
        self.pass_due = result.next_due
        # Everything below only after the status that decided it is written: a lost race (409) does nothing.
        self.findings.consumed(findings)
        self.seen_pods, self.deleted_pods = views, self.deleted_pods & {v.uid for v in views}
        try:
            await self._carry_out(obj, job, result, status_in, views, gone, progress, written if changed else None)
        finally:  # the status already tells of them: a failed action must not lose its pass's events
            for ev in result.events:
                await self._event(obj, ev.type, ev.reason, ev.message)
        await self._checkpoint_event(obj, result.status.phase in TERMINAL, progress)

    async def _carry_out(self, obj: dict[str, Any], job: TrainingJob | None, result: Pass,
                         status_in: TrainingJobStatus, views: list[PodView], gone: list[PodView],
                         progress: ObservedProgress, written: dict[str, Any] | None) -> None:
        """What a written pass does: the liveness watch, the Service, metrics, its actions, the recovery record.
        `written`: the status written (None: unchanged). The Service and budget go while the pods are created (no
        pod needs them first; they report their own failures): a new job's pods start two round trips sooner."""
        service: asyncio.Future[None] | None = None
        if job is not None and result.status.phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
            await self._start_liveness(job, bool(job.spec.replicas.spares or result.status.drain.replacements
                                                 or any(v.is_spare for v in views)))
            service = asyncio.ensure_future(self._ensure_service(obj, job))
        try:
            if self.metrics is not None:
                self._record_metrics(written, status_in, views, progress)
            lost = self.agents.of(lost_agents(views + gone, status_in.generation, result.status.generation,
                                              result.actions))
            self.agents.keep({v.name for v in views + gone})
            self.recovery.decided(status_in, result.status, views + gone, result.actions,
                                  self.progress.last_step_seen, time.time())
            await self._act(obj, job, result)
        finally:
            if service is not None:
                await service
        if lost:  # in the background: its first use imports torch (seconds), which must not hold up the pass
            task = asyncio.ensure_future(self._expire_lost_agents(job, lost))
            self.expiring.add(task)
            task.add_done_callback(self.expiring.discard)
        await self._record_recovery(obj, result)

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

    def _check_hang(self, job: TrainingJob, views: list[PodView], status: TrainingJobStatus) -> None:
        """A job training no step (etcd progress, operator's clock) is reported like the monitor's hang: the
        pass reading it restarts the job (FailureKind.HANG); one report per generation."""
        if status.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED):
            return
        hang = self.progress.hang(job.spec, views, status.generation, time.time())
        if self.hang_reported == status.generation:
            return
        if hang is None:
            self.hang_due = self.progress.hang_due(job.spec)
        else:
            self.hang_reported = status.generation
            self.logger.warning(f"job is hung: {hang.message}")
            self.findings.report_hang(hang.message, status.generation, hang.stepped)
            if self.metrics is not None:
                self.metrics.time_to_detect_seconds.labels("Hang").observe(hang.idle_seconds)
