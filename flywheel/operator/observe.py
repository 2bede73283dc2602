"""The observing half of a job's pass (executor.py): everything `policy.reconcile` reads besides the spec and the
remembered status, gathered in one `Observed` value (policy/observed.py) -- the pods from the watch-fed caches with
this runner's own writes laid over them (own_writes.py) and judged against etcd (etcd_views.py), the progress from
etcd and the event log, the health monitor's findings, the leaving nodes, the failed creates, the jobs sharing the
checkpoint location -- with the memory the pass hands back (the progress hang reported, the checkpoint events
posted). The `Observer` owns all of it; `pod_view` reads one Pod object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from flywheel.contracts.labels import (
    DELETED_FOR_ANNOTATION,
    GENERATION_LABEL,
    INDEX_LABEL,
    RESTART_ANNOTATION,
    ROLE_LABEL,
    ROLE_SPARE,
    ROLE_WORKER,
    SPEC_GENERATION_ANNOTATION,
    SPEC_HASH_ANNOTATION,
)
from flywheel.contracts.timefmt import parse_rfc3339
from flywheel.kube.pod_state import container_outcome
from flywheel.monitor.findings import FindingsInbox
from flywheel.operator import manifests as m
from flywheel.operator.caches import ClusterReads
from flywheel.operator.create_failures import CreateFailures
from flywheel.operator.drain import node_marks
from flywheel.operator.etcd_views import EtcdViews, key_owners
from flywheel.operator.event_log import EventLogTail, events_file
from flywheel.operator.own_writes import OwnWrites
from flywheel.operator.recovery_record import RecoveryClock
from flywheel.operator.rendezvous_expiry import AgentMemory
from flywheel.operator.shared_etcd import SharedEtcd
from flywheel.policy.checkpoint_events import CheckpointEventState
from flywheel.policy.checkpoint_sharing import checkpoint_location
from flywheel.policy.observed import (
    CheckpointSharing,
    DrainInput,
    HealthFindings,
    Observed,
    ObservedProgress,
    PodView,
    ProgressClock,
)
from flywheel.policy.vanished import vanished_pods
from flywheel.spec import TrainingJob
from flywheel.spec.status import Phase, TrainingJobStatus

# The phases whose progress is not followed for a hang (policy/progress_hang.py judges it).
_NO_HANG = (Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED)


def _spec_generation(annotations: dict[str, str]) -> int | None:
    try:
        return int(annotations[SPEC_GENERATION_ANNOTATION])
    except (KeyError, ValueError):
        return None


def pod_view(obj: dict[str, Any], lost_nodes: set[str], liveness_lost: bool = False) -> PodView | None:
    """What one Pod object of the job says (None: not one of its workers or spares, e.g. its labels were edited)."""
    meta, status = obj["metadata"], obj.get("status") or {}
    role = (meta.get("labels") or {}).get(ROLE_LABEL) or ROLE_WORKER  # a pod from before spares is a worker
    try:
        index = -1 if role == ROLE_SPARE else int(meta["labels"][INDEX_LABEL])
        generation = int(meta["labels"].get(GENERATION_LABEL, "0"))
    except (KeyError, ValueError):
        return None
    reason, code, finished, message, waiting_since, init_container = container_outcome(obj)
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conds.get("Ready", {}).get("status") == "True"
    sched = conds.get("PodScheduled", {})
    unsched = parse_rfc3339(sched.get("lastTransitionTime")) if sched.get("reason") == "Unschedulable" else None
    sched_message = (sched.get("message") or None) if unsched is not None else None
    gated = sched.get("reason") == "SchedulingGated" or bool((obj.get("spec") or {}).get("schedulingGates"))
    target = conds.get("DisruptionTarget", {})  # preempted or evicted (Kubernetes 1.26+)
    disruption = str(target.get("reason") or "DisruptionTarget") if target.get("status") == "True" else None
    node = (obj.get("spec") or {}).get("nodeName")
    annotations = meta.get("annotations") or {}
    deleted_for = annotations.get(DELETED_FOR_ANNOTATION)
    deleting = parse_rfc3339(meta.get("deletionTimestamp"))  # graceful deletes stamp the end of the grace period
    if deleting is not None:
        deleting -= float(meta.get("deletionGracePeriodSeconds") or 0)
    return PodView(name=meta["name"], uid=meta["uid"], index=index, generation=generation,
                   phase=status.get("phase", "Pending"), ready=ready, deleting_since=deleting,
                   node_lost=bool(node) and node in lost_nodes, reason=reason, exit_code=code,
                   unschedulable_since=unsched, liveness_lost=liveness_lost, finished_at=finished,
                   message=message, waiting_since=waiting_since, init_container=init_container,
                   disruption=disruption, deleted_for=deleted_for,
                   scheduler_message=sched_message, gated=gated, role=role, node=node or None,
                   spec_generation=_spec_generation(annotations), spec_hash=annotations.get(SPEC_HASH_ANNOTATION, ""))


@dataclass
class Acted:
    """What the runner did to pods that its next observations must account for (the actuator records it)."""

    # Pod uids deleted since the last written pass: a pod gone unseen by anyone else (force-deleted with grace 0)
    # is a PodDeleted interruption (policy/vanished.py).
    deleted: set[str] = field(default_factory=set)
    # Pod uid -> when this runner promoted it: a promoted spare's worker key is one written after that, not its
    # predecessor's (whose key may be newer than the spare pod itself).
    promoted_at: dict[str, float] = field(default_factory=dict)


class Observer:
    def __init__(self, settings: m.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any],
                 namespace: str, name: str, uid: str, etcd: SharedEtcd | None, reads: ClusterReads, own: OwnWrites,
                 poke: Callable[[], None]) -> None:
        """`reads`: the watch-fed caches; `own`: this runner's writes the caches may not show yet; `poke`: wakes
        the job's runner (a finding, an etcd change)."""
        self.settings, self.namespace, self.name, self.uid = settings, namespace, name, uid
        self.reads, self.own = reads, own
        self.etcd = EtcdViews(settings, logger, etcd, uid, poke)
        self.findings = FindingsInbox(poke)  # the health monitor's reports (monitor/findings.py)
        self.events_path = (str(events_file(settings.events_dir, namespace, name, uid))
                            if settings.events_dir else None)
        self.tail = EventLogTail(events_file(settings.events_dir, namespace, name, uid)) if self.events_path else None
        self.recovery = RecoveryClock()  # the recovery being timed, and the last one's record
        self.agents = AgentMemory()  # each worker pod's agent (host, pid), for the rendezvous expiry
        self.create_failures = CreateFailures()  # every refused create, until it goes through (the actuator's)
        self.acted = Acted()
        self.views: list[PodView] = []  # the pods of the last observation
        self.seen_pods: list[PodView] = []  # those of the last written pass
        # The memory the pass hands back (policy/observed.py), kept once its pass is written (and its events posted).
        self.hang_reported: int | None = None
        self.checkpoint_events: CheckpointEventState | None = None

    def new_pass(self) -> None:
        """The due times are set again by what each pass sees (one that ends early leaves them unset)."""
        self.etcd.liveness_due = self.etcd.retry_due = None

    def due(self) -> float | None:
        """When what is observed changes by itself: a missing liveness key's grace, a watch retried, an own write
        the caches must have shown by then."""
        return min((t for t in (self.etcd.due(), self.own.due()) if t is not None), default=None)

    async def observe(self, obj: dict[str, Any], job: TrainingJob | None, status_in: TrainingJobStatus) -> Observed:
        """One pass's observations of the job `obj` (as read), whose status is `status_in`."""
        views = await self._pods()
        progress = self._progress(views, status_in)
        clock = self._clock(job, views, status_in)
        findings = self.findings.snapshot()
        gone = vanished_pods(self.seen_pods, views, self.acted.deleted, status_in.generation, time.time())
        # Only a spare's placement reads the usable nodes (policy/spare_placement.py): no set built for the rest.
        usable = await self.reads.usable_nodes() if any(v.is_spare for v in views) else frozenset[str]()
        annotations = obj["metadata"].get("annotations") or {}
        return Observed(views + gone, progress, int(obj["metadata"].get("generation", 0)),
                        annotations.get(RESTART_ANNOTATION), findings, await self._drain_input(findings), usable,
                        self.create_failures.current({v.name for v in views}, time.time()),
                        await self._sharing(obj, job), clock, self.hang_reported, self.checkpoint_events)

    def written(self, seen: Observed) -> None:
        """The pass that read `seen` wrote its status: what it consumed is gone, its pods are the ones seen."""
        self.findings.consumed(seen.findings)
        self.seen_pods = self.views
        self.acted.deleted &= {v.uid for v in self.views}
        self.etcd.has_pods = bool(self.seen_pods)

    async def _pods(self) -> list[PodView]:
        """The job's pods, judged against their etcd keys (workers first, then spares, in the cache's order)."""
        now = time.time()
        pods = self.own.pods(await self.reads.pods(self.namespace, self.name), now)
        pods = [p for p in pods if any(o.get("uid") == self.uid for o in p["metadata"].get("ownerReferences", []))]
        lost = await self.reads.lost_nodes()
        keys = self.etcd
        views, workers = [], []
        for obj in pods:
            view = pod_view(obj, lost)
            if view is not None and view.is_spare:
                views.append(replace(view, spare_ready=keys.spare_ready(view)))
            elif view is not None:
                workers.append((view, max(parse_rfc3339(obj["metadata"].get("creationTimestamp")) or 0.0,
                                          self.acted.promoted_at.get(view.uid, 0.0))))
        keys.key_owner = key_owners(workers, keys.live)
        for view, _ in workers:
            self.agents.remember(view, keys.own_key(view))
            views.append(replace(view, liveness_lost=keys.liveness_lost(view, now), agent_alive=keys.agent_alive(view),
                                 spare_ready=keys.spare_ready(view), **keys.rank_restarts(view)))
        alive = {v.uid for v in views}
        keys.forget(alive)
        self.acted.promoted_at = {k: v for k, v in self.acted.promoted_at.items() if k in alive}
        self.views = views
        return views

    def _progress(self, views: list[PodView], status_in: TrainingJobStatus) -> ObservedProgress:
        """etcd's progress merged with the event log's, with the recovery being timed (recovery_record.py)."""
        progress = self.etcd.progress.observe(self.tail.poll() if self.tail is not None else None, status_in.goodput)
        self.recovery.observe_pods(views, status_in.generation, time.time())
        return self.recovery.progress(progress, self.etcd.progress.ledger)

    def _clock(self, job: TrainingJob | None, views: list[PodView],
               status_in: TrainingJobStatus) -> ProgressClock | None:
        """The progress as a clock, for the pass to judge a hang by (policy/progress_hang.py)."""
        if job is None or not self.settings.hang_detection or status_in.phase in _NO_HANG:
            return None
        return self.etcd.progress.clock(job.spec, views, status_in.generation, time.time())

    async def _drain_input(self, findings: HealthFindings) -> DrainInput:
        """The nodes that are leaving (cordoned, a --drain-taint-keys taint, a fatal XID) and the request's answers."""
        return self.etcd.drain.observe(node_marks(await self.reads.node_marks(), self.settings.drain_taint_keys,
                                                  dict(findings.node_faults)))

    async def _sharing(self, obj: dict[str, Any], job: TrainingJob | None) -> CheckpointSharing:
        """This job and the other jobs whose checkpoints land where its do (policy/checkpoint_sharing.py)."""
        me = CheckpointSharing(self.namespace, self.name, str(obj["metadata"].get("creationTimestamp") or ""))
        location = job and checkpoint_location(self.namespace, job.spec.checkpoint.dir, job.spec.checkpoint.claim_name)
        if not location:
            return me
        users = await self.reads.checkpoint_users(location)
        return replace(me, others=tuple(u for u in users if (u.namespace, u.name) != (self.namespace, self.name)))
