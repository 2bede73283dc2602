"""What a job's observer (observe.py) reads from etcd: the workers' liveness keys, the spares' keys, the drain
answers and the training progress, followed by watches that wake the runner, and how a pod's view is judged from
them (its agent lost, its rank restarts in place, a spare ready). `EtcdViews` owns the watches and what they said."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from flywheel.etcd import spares as etcd_spares
from flywheel.etcd.liveness import WorkerWatch, watch_workers
from flywheel.operator import manifests as m
from flywheel.operator.drain import DrainFollower
from flywheel.operator.progress_follower import JobProgress
from flywheel.operator.shared_etcd import SharedEtcd
from flywheel.policy.observed import PodView
from flywheel.policy.reconcile import LIVENESS_GRACE_SECONDS
from flywheel.spec import TrainingJob

ETCD_RETRY_SECONDS = 5.0  # after the etcd liveness or progress watch could not start
KEY_CLOCK_SLACK_S = 1.0  # a key written this long before its pod's creation still counts as its own (clock skew)


def key_owners(workers: Sequence[tuple[PodView, float]], live: dict[str, Any] | None) -> dict[int, str]:
    """The uid of the pod each replica's liveness key belongs to, from (view, created or promoted at) of the
    worker pods: of those with the key's index, the newest one that existed when the key was written. Two pods
    share an index while a lost one is still being deleted and its replacement (a new pod, a promoted spare)
    already runs: the key is the replacement's then, never the lost pod's."""
    newest: dict[int, tuple[float, str]] = {}
    for view, created in workers:
        key = live.get(str(view.index)) if live is not None else None
        if key is None or key.since < created - KEY_CLOCK_SLACK_S:
            continue  # written before this pod existed: a predecessor's
        if created > newest.get(view.index, (float("-inf"), ""))[0]:
            newest[view.index] = (created, view.uid)
    return {index: uid for index, (_, uid) in newest.items()}


class EtcdViews:
    def __init__(self, settings: m.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any],
                 etcd: SharedEtcd | None, uid: str, poke: Callable[[], None]) -> None:
        """`etcd`: the operator's shared session (none: nothing is watched); `poke` wakes the job's runner."""
        self.settings, self.logger, self.etcd, self.uid, self.poke = settings, logger, etcd, uid, poke
        self.progress = JobProgress(poke)  # the etcd progress record (step, checkpoint, goodput, hangs)
        self.drain = DrainFollower(poke, logger)  # drain ahead: the checkpoint request and answers
        self.watch: WorkerWatch | None = None
        self.spare_watch: Any = None  # the spare agents' keys (flywheel/etcd/spares.py watch_spares)
        self.live: dict[str, Any] | None = None  # replica id -> LiveWorker, None until the watch reported
        self.live_spares: dict[str, Any] = {}  # spare pod name -> its LiveSpare key
        self.seen_live: dict[str, float | None] = {}  # pod uid -> since when its key is missing (None: present)
        self.exited_agents: set[str] = set()  # pod uids whose agent marked its key exited
        # Pods judged dead by their lease stay so while Terminating: the force delete after nodeFailureGraceSeconds
        # must not wait for the node monitor (40 s) to confirm what etcd already said.
        self.dead_by_lease: set[str] = set()
        self.key_owner: dict[int, str] = {}  # replica index -> uid of the pod its liveness key belongs to
        self.has_pods = False  # a pass saw pods of the job: the first report of the keys then matters
        # When a missing liveness key's grace ends, and when a watch that could not start is tried again (unix
        # seconds; None: not due). Set again by each pass.
        self.liveness_due: float | None = None
        self.retry_due: float | None = None

    def due(self) -> float | None:
        return min((t for t in (self.liveness_due, self.retry_due) if t is not None), default=None)

    def forget(self, alive: set[str]) -> None:
        """Drop what is remembered of pods no longer seen (`alive`: the uids of those seen)."""
        self.seen_live = {k: v for k, v in self.seen_live.items() if k in alive}
        self.dead_by_lease &= alive
        self.exited_agents &= alive

    async def stop(self) -> None:
        loop = asyncio.get_running_loop()
        for watch in (self.watch, self.spare_watch):
            if watch is not None:
                await loop.run_in_executor(None, watch.stop)
        await loop.run_in_executor(None, self.progress.stop)
        await loop.run_in_executor(None, self.drain.stop)

    async def start(self, job: TrainingJob, spares: bool) -> None:
        """The job's etcd watches; `spares`: the job has or wants spare pods (spec.replicas.spares, a drain's)."""
        if self.etcd is not None and self.progress.watch is None:
            try:
                self.progress.start(await self.etcd.session(), m.run_id(job, self.uid))
            except Exception as err:  # noqa: BLE001 (etcd down: retried next pass; the event log may still say)
                self.logger.warning(f"etcd progress watch unavailable: {err}")
                self.retry_due = time.time() + ETCD_RETRY_SECONDS
        await self._start_drain_watch(job)
        if spares:
            await self._start_spare_watch(job)
        if self.watch is not None or self.etcd is None or not self.settings.worker_liveness:
            return
        loop = asyncio.get_running_loop()

        def changed(workers: dict[str, Any]) -> None:
            def apply() -> None:
                # The first report of a job with no pod yet (no keys either) changes no decision: no pass for it
                # (one per new job in a burst).
                first_and_empty = self.live is None and not workers and not self.has_pods
                self.live = workers
                if not first_and_empty:
                    self.poke()
            loop.call_soon_threadsafe(apply)

        try:
            self.watch = watch_workers(await self.etcd.session(), m.run_id(job, self.uid), changed, shared=True)
        except Exception as err:  # noqa: BLE001 (etcd down, any client error: pod status still works; retried)
            self.logger.warning(f"etcd liveness watch unavailable: {err}")
            self.retry_due = time.time() + ETCD_RETRY_SECONDS

    async def _start_spare_watch(self, job: TrainingJob) -> None:
        """Follow the spare agents' keys (which spares wait, warm, to be promoted)."""
        if self.spare_watch is not None or self.etcd is None:
            return
        loop = asyncio.get_running_loop()

        def changed(spares: dict[str, Any]) -> None:
            def apply() -> None:
                if spares != self.live_spares:
                    self.live_spares = dict(spares)
                    self.poke()
            loop.call_soon_threadsafe(apply)

        try:
            self.spare_watch = etcd_spares.watch_spares(await self.etcd.session(), m.run_id(job, self.uid), changed,
                                                        shared=True)
        except Exception as err:  # noqa: BLE001 (etcd down: no spare is seen ready, lost workers get new pods)
            self.logger.warning(f"etcd spare watch unavailable: {err}")

    async def _start_drain_watch(self, job: TrainingJob) -> None:
        """Follow the run's checkpoint request and the ranks' answers (drain ahead, operator/drain.py)."""
        if self.etcd is None or self.drain.watch is not None:
            return
        try:
            self.drain.start(await self.etcd.session(), m.run_id(job, self.uid))
        except Exception as err:  # noqa: BLE001 (etcd down: no answers seen; a drain then moves after its bound)
            self.logger.warning(f"etcd checkpoint-request watch unavailable: {err}")
            self.retry_due = time.time() + ETCD_RETRY_SECONDS

    def own_key(self, view: PodView) -> Any:
        """The pod's own liveness key (key_owners), None when the replica's key is another pod's or there is none."""
        if self.live is None or self.key_owner.get(view.index) != view.uid:
            return None
        return self.live.get(str(view.index))

    def liveness_lost(self, view: PodView, now: float) -> bool:
        if view.uid in self.dead_by_lease:
            return True
        if self.live is None or view.phase != "Running" or view.deleting_since is not None:
            return False
        key = self.own_key(view)
        if key is not None:
            self.seen_live[view.uid] = None
            if key.exited:  # its agent ended by itself: the pod's own status decides, not the key's expiry
                self.exited_agents.add(view.uid)
            else:  # a live agent of this pod (registered after any exited marker): its expiry counts again
                self.exited_agents.discard(view.uid)
            return False
        if view.uid in self.exited_agents:
            return False
        if view.uid not in self.seen_live:
            return False  # never registered yet (starting up)
        since = self.seen_live[view.uid] or now
        self.seen_live[view.uid] = since
        if now - since < LIVENESS_GRACE_SECONDS:
            self.liveness_due = min(since + LIVENESS_GRACE_SECONDS, self.liveness_due or float("inf"))
            return False
        self.dead_by_lease.add(view.uid)
        return True

    def agent_alive(self, view: PodView) -> bool:
        """Its agent holds the pod's own liveness key now, not marked exited: it can be asked to restart its ranks in
        place (policy/failure_decision.py)."""
        key = self.own_key(view)
        return key is not None and not key.exited

    def rank_restarts(self, view: PodView) -> dict[str, Any]:
        """What this pod's agent reported of its rank restarts in place (policy/rank_restarts.py): from its own key
        only, not a predecessor's or a replacement's of the same index."""
        key = self.own_key(view)
        if key is None:
            return {}
        return {"rank_restarts": key.rank_restarts, "rank_restart_reason": key.rank_restart_reason,
                "rank_restart_at": key.rank_restart_at}

    def spare_ready(self, view: PodView) -> bool:
        """Its agent holds a ready spare key: a spare waiting to be promoted (or, on a worker-labelled pod, one whose
        promotion has not reached it yet: policy/spares.py repeats it)."""
        key = self.live_spares.get(view.name)
        return key is not None and bool(getattr(key, "ready", False))
