"""The health monitor's executor side: what it watches (`KubeJobInventory`) and how its findings are carried out
(`KubeHealthActions`). A hang or a straggler verdict is never written here: it goes to the job's findings inbox
(monitor/findings.py), and the job's reconcile pass -- the one writer of its status -- decides the conditions, the
events and the restart (policy/failure_decision.py, policy/running_state.py). Node faults delete pods and cordon
nodes, which the reconcile pass then sees as failures to replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flywheel.contracts.labels import DELETED_FOR_ANNOTATION, RESTART_ANNOTATION
from flywheel.contracts.timefmt import parse_rfc3339
from flywheel.kube.client import Kube, KubeApiError
from flywheel.monitor import FindingsInbox, HealthMonitor, MonitorSettings, OperatorMetrics
from flywheel.operator import manifests as m
from flywheel.operator.caches import ApiReads, ClusterReads
from flywheel.operator.xid_memory import KubeXidMemory
from flywheel.policy import reasons as R
from flywheel.policy.conditions import iso
from flywheel.policy.health_checks import Degradation, HangFinding, WatchedJob
from flywheel.policy.xid import NodeFault, RankRestart, WatchedPod
from flywheel.spec import SpecError, parse_cluster_job
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

JobKey = tuple[str, str]
InboxOf = Callable[[str, str], FindingsInbox | None]  # (namespace, job) -> that job's runner's inbox, if it runs here
# (namespace, job) -> pod name -> when its agent last restarted its ranks in place, as that job's runner in this
# operator last saw its etcd liveness keys (empty: no runner here, or no restart).
RanksRestartedOf = Callable[[str, str], Mapping[str, float]]
# Where the trainer listens for dump requests, under <checkpointDir> (named here, not imported: the operator stays
# torch-free; tests/trainer/test_stackdump.py checks that the names agree):
DEBUG_SUBDIR = ".debug"
# trainer/distributed/collective_env.py: writing to nccl_pipe_rank_<rank>.pipe makes that rank dump its NCCL flight
# recorder.
NCCL_PIPES = "nccl_pipe_rank_*.pipe"
# trainer/ft/stackdump.py: a new token in this file makes every rank dump all its threads' stacks (gloo too) into its
# log and .debug/stacks_rank_<rank>.txt.
STACK_REQUEST = "dump-request"


@dataclass(frozen=True)
class DumpRequest:
    nccl_pipes: int  # flight-recorder pipes written (ranks with a reader)
    stack_request: Path | None  # the request file written, None when there is no debug directory


def watched_pod(obj: dict[str, Any]) -> WatchedPod | None:
    """A worker Pod as the monitor sees it; None for a pod without the job and replica labels."""
    meta, status = obj["metadata"], obj.get("status") or {}
    labels = meta.get("labels") or {}
    job, replica = labels.get(m.JOB_LABEL), labels.get(m.INDEX_LABEL)
    if not job or replica is None:
        return None
    # A terminating pod is not Running for the hang rule: the operator is already replacing it.
    phase = "Terminating" if meta.get("deletionTimestamp") else str(status.get("phase", "Pending"))
    started = None
    for cs in status.get("containerStatuses") or []:
        started = started or parse_rfc3339(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    if started is None and phase == "Running":
        started = parse_rfc3339(status.get("startTime"))
    node = str((obj.get("spec") or {}).get("nodeName") or "")
    return WatchedPod(meta["name"], meta["namespace"], job, replica, node, phase, started)


def request_dumps(debug_dir: Path, token: str | None = None) -> DumpRequest:
    """Ask every rank whose checkpoint directory holds `debug_dir` for a dump: a new token in the stack-dump request
    file (every rank of the embedded trainer, gloo or NCCL) and a byte to each NCCL flight-recorder pipe that has a
    reader. Nothing is created where no rank ever ran (no `debug_dir`)."""
    if not debug_dir.is_dir():
        return DumpRequest(0, None)
    request: Path | None = debug_dir / STACK_REQUEST
    try:
        tmp = debug_dir / f".{STACK_REQUEST}.{os.getpid()}"
        tmp.write_text((token or f"{time.time():.6f}-{os.getpid()}") + "\n")
        os.replace(tmp, debug_dir / STACK_REQUEST)  # atomic: a rank never reads half a token
    except OSError as err:
        log.warning("cannot write the stack-dump request %s: %s", request, err)
        request = None
    count = 0
    for pipe in sorted(debug_dir.glob(NCCL_PIPES)):
        try:
            if not stat.S_ISFIFO(pipe.stat().st_mode):
                continue
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO when no rank reads it: skip, never block
        except OSError:
            continue
        try:
            os.write(fd, b"1\n")
            count += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return DumpRequest(count, request)


class KubeJobInventory:
    """Every TrainingJob (in `namespaces`, default all) with its worker pods, each evaluation. `reads`: the
    operator's watch-fed caches, so an evaluation lists nothing (none: read from the API, for tests driving the
    monitor by hand). Remembers each job's `status.restarts` and checkpoint dir as seen, for the actions."""

    def __init__(self, kube: Kube, namespaces: Sequence[str] = (), reads: ClusterReads | None = None,
                 ranks_restarted: RanksRestartedOf | None = None) -> None:
        self.kube, self.namespaces = kube, tuple(namespaces)
        self.reads: ClusterReads = reads if reads is not None else ApiReads(kube)
        self.ranks_restarted = ranks_restarted
        self.restarts: dict[JobKey, int] = {}
        self.checkpoint_dirs: dict[JobKey, str] = {}
        self.phases: dict[JobKey, str] = {}

    async def jobs(self) -> Sequence[WatchedJob]:
        objs = await self.reads.jobs(self.namespaces)
        pod_objs = await self.reads.all_pods(self.namespaces)
        by_owner: dict[str, list[WatchedPod]] = {}
        for obj in pod_objs:
            pod = watched_pod(obj)
            if pod is None:
                continue
            for owner in obj["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(str(owner.get("uid")), []).append(pod)
        out: list[WatchedJob] = []
        restarts: dict[JobKey, int] = {}
        dirs: dict[JobKey, str] = {}
        phases: dict[JobKey, str] = {}
        for obj in objs:
            try:
                spec = parse_cluster_job(obj).spec
            except SpecError:
                continue  # marked Invalid by the reconcile pass; nothing runs
            meta, status = obj["metadata"], obj.get("status") or {}
            key = (meta["namespace"], meta["name"])
            # The worker generation a finding is about (before workerGeneration existed, restarts was it).
            generation = status.get("workerGeneration")
            restarts[key] = int(generation if generation is not None else status.get("restarts", 0))
            dirs[key] = spec.checkpoint.dir
            phases[key] = str(status.get("phase", "Pending"))
            pods = sorted(by_owner.get(meta["uid"], []), key=lambda p: (len(p.replica), p.replica))
            restarted = self.ranks_restarted(*key) if self.ranks_restarted is not None else {}
            pods = [replace(p, ranks_restarted_at=restarted.get(p.name, 0.0)) for p in pods]
            ft = spec.fault_tolerance
            out.append(WatchedJob(key[0], key[1], str(status.get("phase", "Pending")), ft.progress_timeout_seconds,
                                  ft.first_step_timeout_seconds, tuple(pods),
                                  parse_rfc3339(status.get("lastRestartTime")) or 0.0))
        self.restarts, self.checkpoint_dirs, self.phases = restarts, dirs, phases
        return out


class KubeHealthActions:
    """Carries the monitor's decisions out. `inbox(namespace, job)`: the findings inbox of that job's runner in this
    operator (None when it has none: a hang is then requested as a restart through the annotation the REST API
    uses, `flywheel.dev/restart-requested-at`)."""

    # How long a drain ahead handed to the job's runner may wait for the pass that starts it (status.drain written):
    # only then is the fault remembered as handled (health_loop.py); past it, the fault is raised again later.
    handover_timeout = 30.0

    def __init__(self, kube: Kube, inventory: KubeJobInventory, inbox: InboxOf | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube, self.inventory, self.inbox, self.clock = kube, inventory, inbox, clock

    @staticmethod
    def _path(namespace: str, job: str) -> str:
        return Kube.custom(GROUP, VERSION, namespace, PLURAL, job)

    def _inbox(self, key: JobKey) -> FindingsInbox | None:
        return self.inbox(*key) if self.inbox is not None else None

    async def _job_event(self, namespace: str, job: str, etype: str, reason: str, message: str,
                         obj: dict[str, Any] | None = None) -> None:
        obj = obj or await self.inventory.reads.job(namespace, job)
        if obj is not None:
            await self.kube.post_event(obj, etype, reason, message)

    async def _delete_pods(self, namespace: str, names: Sequence[str]) -> None:
        for name in names:  # the reconcile pass replaces each, counting a restart named by the annotation
            path = Kube.core(namespace, "pods", name)
            with contextlib.suppress(KubeApiError):  # gone already: nothing to replace, nothing to name
                await self.kube.merge_patch(path, {"metadata": {"annotations": {
                    DELETED_FOR_ANNOTATION: R.RESTART_XID}}})
            await self.kube.delete(path)

    async def _request_dumps(self, key: JobKey) -> None:
        directory = self.inventory.checkpoint_dirs.get(key)
        done = await asyncio.to_thread(request_dumps, Path(directory, DEBUG_SUBDIR)) if directory else None
        if done is not None and done.stack_request is not None:
            log.warning("job %s/%s: stack dumps requested in %s (each rank: its log and stacks_rank_<rank>.txt "
                        "there); %d NCCL flight-recorder pipe(s) written", *key, done.stack_request, done.nccl_pipes)
        else:
            log.info("job %s/%s: %s/%s is not reachable from the operator (it must mount the checkpoint volume at "
                     "the same path); no dump requested", *key, directory, DEBUG_SUBDIR)

    async def mark_hung(self, finding: HangFinding) -> None:
        key = (finding.namespace, finding.job)
        seen = self.inventory.restarts.get(key)
        if seen is None:
            return
        await self._request_dumps(key)  # first: the restart this report causes ends the hung processes
        inbox = self._inbox(key)
        if inbox is not None:
            inbox.report_hang(finding.message, seen)
            return
        log.warning("job %s/%s: no runner in this operator; requesting a restart through %s", *key,
                    RESTART_ANNOTATION)
        await self.kube.merge_patch(self._path(*key), {"metadata": {"annotations": {
            RESTART_ANNOTATION: iso(self.clock())}}})

    async def cordon_node(self, node: str, fault: NodeFault) -> None:
        obj = await self.kube.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
        await self.kube.post_event({"apiVersion": "v1", "kind": "Node", **obj}, "Warning", R.NODE_CORDONED,
                                   R.MSG_NODE_CORDONED.format(fault=fault.message))

    async def replace_pods(self, pods: Sequence[WatchedPod], fault: NodeFault) -> None:
        namespace, job = pods[0].namespace, pods[0].job
        inbox = self._inbox((namespace, job))
        if inbox is not None and self.inventory.phases.get((namespace, job)) == "Running":
            inbox.report_node_fault(fault.node, fault.message)  # drain ahead: checkpoint first (policy/drain.py)
            await self._handed_over(inbox, fault)
        else:
            await self._delete_pods(namespace, [p.name for p in pods])
        state = R.NODE_STATE_CORDONED if fault.cordon else R.NODE_STATE_KEPT
        await self._job_event(namespace, job, "Warning", R.GPU_FATAL_XID,
                              R.MSG_GPU_FATAL_XID.format(fault=fault.message, node_state=state))

    async def _handed_over(self, inbox: FindingsInbox, fault: NodeFault) -> None:
        """Wait until the runner's pass has taken the fault in (its status write holds the drain): the inbox is in
        memory, and an operator dying before that write must find the fault not yet handled. Raises TimeoutError."""
        deadline = time.monotonic() + self.handover_timeout
        while (fault.node, fault.message) in inbox.snapshot().node_faults:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the drain of node {fault.node} was not taken in by its job's runner within "
                                   f"{self.handover_timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def restart_ranks(self, restart: RankRestart) -> None:
        await self._delete_pods(restart.namespace, restart.pods)
        await self._job_event(restart.namespace, restart.job, "Warning", R.GPU_APP_XID, restart.message)

    async def mark_degraded(self, change: Degradation) -> None:
        key = (change.namespace, change.job)
        inbox, seen = self._inbox(key), self.inventory.restarts.get(key)
        if inbox is None or seen is None:
            log.info("job %s/%s: no runner in this operator; straggler verdict not recorded", *key)
            return
        inbox.report_straggler(change.degraded, change.message, seen)


class BackgroundMonitor:
    """The health monitor as a task of the operator's event loop; `close()` stops it (kopf's cleanup)."""

    def __init__(self, kube: Kube, settings: MonitorSettings, namespaces: Sequence[str],
                 metrics: OperatorMetrics | None, inbox: InboxOf | None, reads: ClusterReads | None = None,
                 ranks_restarted: RanksRestartedOf | None = None) -> None:
        """`metrics`: the operator's (one registry for every operator series); None = a private one. `inbox`: see
        `KubeHealthActions`. `reads`: the operator's watch-fed caches (none: the API). `ranks_restarted`: the job
        runners' view of their agents' rank restarts in place (the hang check's start-up allowance)."""
        inventory = KubeJobInventory(kube, namespaces, reads, ranks_restarted)
        metrics = metrics if metrics is not None else OperatorMetrics()
        self.monitor = HealthMonitor(settings, inventory, KubeHealthActions(kube, inventory, inbox), metrics,
                                     xid_memory=KubeXidMemory(kube))
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.monitor.run(self.stop), name="flywheel-health-monitor")

    async def close(self, timeout: float = 5.0) -> None:
        self.stop.set()
        done, _ = await asyncio.wait({self.task}, timeout=timeout)
        if not done:  # stuck in a slow API call: cancel it
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
