"""The acting half of a job's pass (executor.py): the `Actuator` carries out each JobAction against the Kubernetes
API or etcd, with the side effects around them (the headless Service, PodGroup and PodDisruptionBudget, events, the
rendezvous reset and the lost agents' expiry), and owns what they need remembered. Its action table is exhaustive:
the type checker fails a new kind of action without its branch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, assert_never, cast

import aiohttp
import kopf

from flywheel.etcd import rank_restart
from flywheel.etcd import spares as etcd_spares
from flywheel.etcd.liveness import reset_rendezvous
from flywheel.kube.client import Kube, KubeApiError
from flywheel.operator import manifests as m
from flywheel.operator import spare_pods
from flywheel.operator.observe import Observer
from flywheel.operator.rendezvous_expiry import expire_pods
from flywheel.policy import reasons as R
from flywheel.policy.decisions import (
    ClearCheckpointRequest,
    CreatePod,
    CreateSpare,
    DeleteJob,
    DeletePod,
    JobAction,
    Pass,
    PromoteSpare,
    Relabel,
    RequestCheckpoint,
    ResetRendezvous,
    RestartRanks,
)
from flywheel.policy.lost_agents import AgentId
from flywheel.spec import TrainingJob
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from flywheel.worker_plan import WorkerPlan

SERVICE_RECHECK_SECONDS = 10.0  # how soon a deleted headless Service is created again
# What an API call can fail with besides a refusal: the connection, a timeout.
API_ERRORS = (KubeApiError, aiohttp.ClientError, TimeoutError)
CREATE_RETRY_SECONDS = 2.0  # how soon a pod whose create failed is tried again (quota, a webhook, the API)
CREATES_IN_FLIGHT = 16  # pod creates at once, after the slow start (the API server's default limit is 400)


class Actuator:
    def __init__(self, kube: Kube, settings: m.OperatorSettings, logger: logging.Logger | logging.LoggerAdapter[Any],
                 job: tuple[str, str, str], observer: Observer) -> None:
        """`job`: (namespace, name, uid); `observer`: its reads, own writes, etcd and the records of what was done
        to pods (`Acted`), which the observer reads back."""
        self.kube, self.settings, self.logger = kube, settings, logger
        self.namespace, self.name, self.uid = job
        self.path = Kube.custom(GROUP, VERSION, self.namespace, PLURAL, self.name)
        self.reads, self.own, self.acted = observer.reads, observer.own, observer.acted
        self.etcd, self.drain = observer.etcd.etcd, observer.etcd.drain
        self.events_path = observer.events_path
        self.create_failures = observer.create_failures  # every refused create, until it goes through
        self.service_checked_at: float | None = None  # monotonic time the headless Service was last seen
        self.service_failure = ""  # the Service create's last failure, reported once ("" when none)
        self.pod_group_tried = False
        self.budget_min: int | None = None  # the PodDisruptionBudget's minAvailable as last written (None: not yet)
        self.budget_failure = ""  # its write's last failure, reported once ("" when none)
        self.create_retry_due: float | None = None  # a failed create's retry (unix seconds); set again each pass
        self.expiring: set[asyncio.Future[None]] = set()  # expiries of lost agents under way (background tasks)

    def service_gone(self) -> None:
        """The headless Service was deleted: created again by the next pass."""
        self.service_checked_at = None

    def expire_in_background(self, job: TrainingJob | None, agents: list[AgentId]) -> None:
        """Its first use imports torch (seconds), which must not hold up the pass."""
        task = asyncio.ensure_future(self._expire_lost_agents(job, agents))
        self.expiring.add(task)
        task.add_done_callback(self.expiring.discard)

    async def event(self, obj: dict[str, Any], etype: str, reason: str, message: str) -> None:
        try:
            await self.kube.post_event(obj, etype, reason, message)
        except API_ERRORS as err:
            self.logger.warning(f"could not post event {reason}: {err!r}")

    def _retry_create_at(self, due: float) -> None:
        self.create_retry_due = due if self.create_retry_due is None else min(self.create_retry_due, due)

    async def _create_service(self, obj: dict[str, Any], job: TrainingJob) -> None:
        """The headless Service, if missing. A refusal (a quota, an admission policy) or an API failure does not
        hold up the pass's pods: a CreateFailed event, once per cause, and another try in CREATE_RETRY_SECONDS."""
        body = m.service(job)
        try:
            if not await self.reads.service_exists(self.namespace, body["metadata"]["name"]):
                _adopt(body, obj)
                await self.kube.create(Kube.core(self.namespace, "services"), body)
        except API_ERRORS as err:
            cause, name = str(err) or type(err).__name__, body["metadata"]["name"]
            self.logger.warning(f"could not create Service {name}: {cause}")
            message = R.MSG_CREATE_FAILED.format(kind="Service", name=name, error=cause)
            self.create_failures.failed(name, message, time.time())
            if cause != self.service_failure:
                self.service_failure = cause
                await self.event(obj, "Warning", R.CREATE_FAILED, message)
            self._retry_create_at(time.time() + CREATE_RETRY_SECONDS)
            return
        self.service_failure = ""
        self.create_failures.created(body["metadata"]["name"])
        self.service_checked_at = time.monotonic()

    async def ensure_service(self, obj: dict[str, Any], job: TrainingJob) -> None:
        """The headless Service (created again when someone deleted it: looked at every SERVICE_RECHECK_SECONDS),
        and the PodGroup once (a failure to create it is reported, and the job runs without a gang)."""
        now = time.monotonic()
        if self.service_checked_at is None or now - self.service_checked_at >= SERVICE_RECHECK_SECONDS:
            await self._create_service(obj, job)
            await self._write_budget(obj, job)
        if self.pod_group_tried:
            return
        group = m.pod_group(job, self.settings)
        if group is not None:
            _adopt(group, obj)
            try:
                await self.kube.create(f"/apis/{group['apiVersion']}/namespaces/{self.namespace}/podgroups", group)
            except KubeApiError as err:  # e.g. the scheduler's CRDs are not installed: run without a gang
                await self.event(obj, "Warning", R.CREATE_FAILED,
                                  R.MSG_CREATE_FAILED.format(kind="PodGroup", name=job.name, error=err))
        self.pod_group_tried = True

    async def _write_budget(self, obj: dict[str, Any], job: TrainingJob) -> None:
        """The job's PodDisruptionBudget (manifests.disruption_budget): created once, patched when `replicas.max`
        moved (or an earlier operator made it). A refusal (RBAC of an older chart, a policy) leaves the job
        running without one: a CreateFailed event once per cause, another try at the next Service check."""
        wanted = job.spec.replicas.max
        if not self.settings.disruption_budgets or self.budget_min == wanted:
            return
        body, path = m.disruption_budget(job), f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets"
        _adopt(body, obj)
        try:
            if await self.kube.create(path, body) is None:  # there already
                await self.kube.merge_patch(f"{path}/{job.name}", {"spec": {"minAvailable": wanted}})
        except API_ERRORS as err:
            cause = str(err) or type(err).__name__
            self.logger.warning(f"could not write PodDisruptionBudget {job.name}: {cause}")
            if cause != self.budget_failure:
                self.budget_failure = cause
                await self.event(obj, "Warning", R.CREATE_FAILED, R.MSG_CREATE_FAILED.format(
                    kind="PodDisruptionBudget", name=job.name, error=cause))
            return
        self.budget_min, self.budget_failure = wanted, ""

    async def _reset_rendezvous(self, job: TrainingJob) -> None:
        run_id = m.run_id(job, self.uid)
        if self.etcd is None:  # the rendezvous is not in etcd (no --etcd-endpoints): nothing to forget
            self.logger.debug(f"new workers: no etcd rendezvous to reset for run {run_id}")
            return
        try:
            session = await self.etcd.session()
            deleted = await asyncio.get_running_loop().run_in_executor(None, reset_rendezvous, session, run_id)
            self.logger.info(f"new workers: reset the rendezvous of run {run_id} ({deleted} keys)")
        except Exception as err:  # noqa: BLE001 (etcd down: the group still forms once old heartbeats expire)
            self.logger.warning(f"could not reset the rendezvous of run {run_id}: {err}")

    async def _expire_lost_agents(self, job: TrainingJob | None, agents: list[AgentId]) -> None:
        """Drop the agents this pass gave up on from the rendezvous at once (operator/rendezvous_expiry.py); on any
        error their heartbeats expire by themselves."""
        if not agents or job is None or self.etcd is None:
            return
        pods = [a.pod for a in agents]
        try:
            session, run_id = await self.etcd.session(), m.run_id(job, self.uid)
            expired = await asyncio.get_running_loop().run_in_executor(None, expire_pods, session, run_id, agents)
            self.logger.info(f"expired the rendezvous heartbeats of {expired} lost agent(s) of {', '.join(pods)}")
        except Exception as err:  # noqa: BLE001 (etcd down, torch missing: the heartbeats then time out)
            self.logger.warning(f"could not expire the rendezvous heartbeats of {', '.join(pods)}: {err}")

    async def _drain_act(self, job: TrainingJob | None, action: RequestCheckpoint | ClearCheckpointRequest) -> None:
        if job is None or self.etcd is None:
            self.logger.warning(f"drain ahead: no etcd to carry out {action} (the drain moves after its bound)")
            return
        try:
            await self.drain.act(await self.etcd.session(), m.run_id(job, self.uid), action)
        except Exception as err:  # noqa: BLE001 (etcd down: a request is sent again next pass, else bounded)
            self.logger.warning(f"drain ahead: {type(action).__name__} failed: {err}")

    async def _restart_ranks(self, job: TrainingJob | None, action: RestartRanks) -> None:
        """Ask every agent of the run to restart its ranks in place (flywheel/etcd/rank_restart.py). Not raised on
        failure: the status already says the generation restarted; if the ranks stay hung, the hang is found again
        for that generation before any step, and the pods are recreated then (policy/failure_decision.py)."""
        if job is None or self.etcd is None:
            self.logger.warning(f"no etcd to ask the agents to restart their ranks ({action}); the hang will be "
                                f"found again and the pods recreated")
            return
        request = rank_restart.RankRestartRequest(action.generation, action.reason)
        try:
            session, run_id = await self.etcd.session(), m.run_id(job, self.uid)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: session.run(rank_restart.put_request(session, run_id, request)))
            self.logger.info(f"asked every agent to restart its ranks in place for generation {action.generation}")
        except Exception as err:  # noqa: BLE001 (etcd down: as above)
            self.logger.warning(f"could not ask the agents to restart their ranks in place: {err}")

    async def act(self, obj: dict[str, Any], job: TrainingJob | None, result: Pass) -> None:
        creates = job is not None and any(isinstance(a, CreatePod | CreateSpare | PromoteSpare)
                                          for a in result.actions)
        # Planned only when a pod is to be created: the plan serializes the spec for every worker's env.
        workers = {w.index: w for w in m.plan(job, self.uid, self.settings, self.events_path)} \
            if creates and job is not None else {}
        failed: list[Exception] = []

        async def one(action: JobAction) -> None:
            # One failure does not drop the others (each is re-decided from fresh observations if still needed);
            # the pass fails after them, so it is retried soon.
            try:
                await self._act_one(obj, job, workers, action)
            except Exception as err:  # noqa: BLE001 (re-raised below)
                self.logger.warning(f"{type(action).__name__} failed: {err!r}")
                failed.append(err)

        for run in _in_order(result.actions):
            if isinstance(run, list):
                await self._create_concurrently(run, one, failed)
            else:
                await one(run)
        if failed:
            raise failed[0]

    async def _create_concurrently(self, creates: list[JobAction], one: Callable[[JobAction], Awaitable[None]],
                                   failed: list[Exception]) -> None:
        """Pod creates after a slow start, as the Job controller's: batches of 1, 2, 4, 8, each awaited whole, so a
        create the API server refuses for all of them (a quota, an admission webhook) is tried once, not 64 times,
        each pass; then the rest CREATES_IN_FLIGHT at once, the next started as soon as one ends (a batch would
        wait for its slowest). One at a time, 64 pods took ~1.5 s on a real API server. A failure starts no
        further create: its retry re-decides the rest (its pass counts them missing)."""
        before = self.create_failures.recorded + len(failed)

        def refused() -> bool:
            return self.create_failures.recorded + len(failed) > before

        done, size = 0, 1
        while done < len(creates) and size < CREATES_IN_FLIGHT:
            batch = creates[done:done + size]
            await asyncio.gather(*(one(action) for action in batch))
            done, size = done + len(batch), 2 * size
            if refused():
                return
        in_flight: set[asyncio.Future[None]] = set()
        try:
            for action in creates[done:]:
                if len(in_flight) >= CREATES_IN_FLIGHT:
                    _, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                if refused():
                    break
                in_flight.add(asyncio.ensure_future(one(action)))
            if in_flight:
                await asyncio.wait(in_flight)
        except asyncio.CancelledError:  # as gather would: the creates under way go with the pass
            for future in in_flight:
                future.cancel()
            raise

    async def _act_one(self, obj: dict[str, Any], job: TrainingJob | None, workers: dict[int, WorkerPlan],
                       action: JobAction) -> None:
        """Carry out one action; every kind of action has its branch (a new one fails the type check here)."""
        match action:
            case DeletePod(name=name, uid=uid, force=force, grace_seconds=grace):
                self.acted.deleted.add(uid)
                await self.kube.delete(Kube.core(self.namespace, "pods", name), uid, 0 if force else grace)
                self.own.deleted_pod(uid, time.time())
            case Relabel(name=name, generation=generation):
                labels = {m.GENERATION_LABEL: str(generation)}
                answer = await self.kube.merge_patch(Kube.core(self.namespace, "pods", name),
                                                     {"metadata": {"labels": labels}})
                self.own.relabelled_pod(str(answer["metadata"]["uid"]), labels, time.time())
            case CreatePod(index=index, generation=generation):
                if job is None or index not in workers:
                    raise RuntimeError(f"reconcile decided to create worker {index} of {self.namespace}/{self.name} "
                                       f"but it has no plan for it (spec valid: {job is not None}): a policy bug")
                await self._create_pod(obj, m.pod(job, workers[index], generation, self.settings))
            case CreateSpare(number=number, generation=generation, nodes=nodes):
                if job is None or not workers:
                    raise RuntimeError(f"reconcile decided to create a spare of {self.namespace}/{self.name} but it "
                                       f"has no plan (spec valid: {job is not None}): a policy bug")
                plan = next(iter(workers.values()))
                await self._create_pod(obj, spare_pods.spare_pod(job, plan, number, generation, self.settings, nodes))
            case PromoteSpare():
                if job is None or action.index not in workers:
                    raise RuntimeError(f"reconcile decided to promote {action.name} to replica {action.index} of "
                                       f"{self.namespace}/{self.name} but it has no plan for it: a policy bug")
                await self._promote(job, action, workers[action.index])
            case RequestCheckpoint() | ClearCheckpointRequest():
                await self._drain_act(job, action)
            case RestartRanks():
                await self._restart_ranks(job, action)
            case ResetRendezvous():
                if job is None:
                    raise RuntimeError(f"reconcile decided to reset the rendezvous of the invalid job "
                                       f"{self.namespace}/{self.name}: a policy bug")
                await self._reset_rendezvous(job)
            case DeleteJob():
                self.logger.info("ttlSecondsAfterFinished passed: deleting the TrainingJob")
                await self.kube.delete(self.path, self.uid)
            case _:
                assert_never(action)

    async def _promote(self, job: TrainingJob, action: PromoteSpare, worker: WorkerPlan) -> None:
        """Relabel the spare pod as the worker of its new index, then tell its agent (etcd). In this order: a pod
        relabelled but not told (the operator stopped between) still holds its spare key, and the next pass sees
        a worker with a spare key and promotes it again (promotion is idempotent). Told first, a pod not yet
        relabelled would still read as a spare with its index missing, and another spare could take the index:
        two agents for one replica."""
        labels = spare_pods.promoted_labels(action.index, action.generation)
        answer = await self.kube.merge_patch(Kube.core(self.namespace, "pods", action.name),
                                             {"metadata": {"labels": labels}})
        uid = str(answer["metadata"]["uid"])
        self.own.relabelled_pod(uid, labels, time.time())
        self.acted.promoted_at.setdefault(uid, time.time())
        if self.etcd is None:
            raise RuntimeError(f"cannot promote {action.name}: the operator has no etcd spare support")
        session, run_id = await self.etcd.session(), m.run_id(job, self.uid)
        env = spare_pods.promotion_env(worker)
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: session.run(etcd_spares.promote(session, run_id, action.name, action.index, env)))

    async def _create_pod(self, obj: dict[str, Any], body: dict[str, Any]) -> None:
        _adopt(body, obj)
        name = body["metadata"]["name"]
        try:
            created = await self.kube.create(Kube.core(self.namespace, "pods"), body)
            if created is not None:  # None: 409 AlreadyExists, the pod is there (the cache shows it soon)
                self.own.wrote_pod(created, time.time())
            self.create_failures.created(name)
        except KubeApiError as err:
            message = R.MSG_CREATE_FAILED.format(kind="pod", name=name, error=err)
            self.create_failures.failed(name, message, time.time())
            await self.event(obj, "Warning", R.CREATE_FAILED, message)
            # Its pass counted it in status.replicas.current: the next pass, soon, sees it missing and tries again.
            self._retry_create_at(time.time() + CREATE_RETRY_SECONDS)


def _in_order(actions: list[JobAction]) -> list[JobAction | list[JobAction]]:
    """The actions in their order, each run of consecutive pod creates as one list (they may go concurrently; the
    others keep their order: a delete before a create of the same name)."""
    out: list[JobAction | list[JobAction]] = []
    for action in actions:
        if isinstance(action, CreatePod | CreateSpare):
            if out and isinstance(out[-1], list):
                out[-1].append(action)
            else:
                out.append([action])
        else:
            out.append(action)
    return out


def _adopt(body: dict[str, Any], owner: dict[str, Any]) -> None:
    """Make `owner` (the TrainingJob as read) the controller of `body`: garbage-collected with it."""
    kopf.adopt(body, owner=cast(kopf.Body, owner))
