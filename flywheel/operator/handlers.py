"""kopf handlers: small typed functions that wire kopf's events to the per-job `JobRunner` (executor.py).

All operator settings are set in `configure()`; the flywheel settings (`OperatorConfig`) arrive in kopf's memo
from `flywheel.operator.main.run`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from flywheel.contracts.labels import CHECKPOINT_LOCATION_ANNOTATION, FINALIZER
from flywheel.etcd.liveness import delete_run
from flywheel.kube.client import LIST_PAGE, KubeConfigError, load_credentials
from flywheel.monitor import FindingsInbox
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.operator import caches, watch_relist
from flywheel.operator import manifests as m
from flywheel.operator.api_slots import OperatorKube
from flywheel.operator.config import OperatorConfig, collect_cycles
from flywheel.operator.executor import JobRunner
from flywheel.operator.health_executor import BackgroundMonitor
from flywheel.operator.shared_etcd import SharedEtcd
from flywheel.spec import SpecError, parse_job
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from flywheel.spec.status import Phase

Logger = logging.Logger | logging.LoggerAdapter[Any]  # what kopf passes its handlers


# -- the watch-fed caches (caches.py): kopf fills them from its watches before any daemon starts --------------------
# The index and event handlers are coroutines: kopf runs a plain function in its thread pool, a hop per watch event
# and handler, and a runner's wake-up (an asyncio.Event) must be set from the event loop's thread.
@kopf.index(GROUP, VERSION, PLURAL)
async def training_jobs(body: kopf.Body, memo: Any, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Also each job's wake-up: kopf calls index handlers on every watch event but a deletion (the job's daemon
    is stopped then), and stores what one returns before its task next yields, so the pass this wakes reads the
    job as changed. One handler per event instead of an index and an event handler (kopf's per-handler cost is
    the operator's largest; docs/operator.md)."""
    entry = caches.job_entry(body)
    meta = body["metadata"]
    runner: JobRunner | None = memo.runners.get((meta["namespace"], meta["name"])) if "runners" in memo else None
    if runner is not None:
        runner.job_event(meta.get("resourceVersion"))
    elif meta.get("deletionTimestamp") and FINALIZER in (meta.get("finalizers") or []):
        forget_run_soon(memo, body)  # deleted while no daemon ran it (e.g. while the operator was down)
    for key, user in entry.items():  # where its checkpoints land (read once, by job_entry)
        if key[0] == caches.CHECKPOINT and user.finished:
            await wake_sharers(memo, key[1], (meta["namespace"], meta["name"]))
    return entry


@kopf.index("", "v1", "pods", labels={m.JOB_LABEL: kopf.PRESENT})
async def worker_pods(body: kopf.Body, memo: Any, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Also each pod's wake-up on every event but a deletion (`pod_deleted` has those), as the job's index handler
    is (training_jobs: the pass it wakes reads the pod as changed). One handler call per pod event instead of two:
    ~20% less of the operator's CPU per pod event, and a wide job's creates share the event loop with their pods'."""
    entry = caches.pod_entry(body)
    await pod_changed(None, body, memo)
    return entry


@kopf.index("", "v1", "services", labels={m.JOB_LABEL: kopf.PRESENT})
async def worker_services(body: kopf.Body, **_: Any) -> dict[tuple[str, str], bool]:
    return caches.service_entry(body)


@kopf.index("", "v1", "nodes")
async def lost_nodes(body: kopf.Body, **_: Any) -> dict[str, Any]:
    return caches.node_entry(body)  # lost nodes, and the cordoned or tainted ones (drain ahead)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf deep-copies every watched object (each pod too) on each of its watch events into an "essence" to diff
    against the last handled one, for changing handlers (on.create/update/delete) and timers' idling only. This
    operator has neither (tests/operator/test_handlers_wiring.py holds it to that), so none is built: that copy was
    ~10% of its CPU in a burst of jobs."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """`kwargs` holds kopf's indices, each by its handler's name (training_jobs, worker_pods, ...)."""
    config: OperatorConfig = memo.config
    settings.posting.level = logging.WARNING  # our own events go out after each status write (executor.py)
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 60
    # kopf's lists (at start and after a 410) in pages, as client-go's and kubectl's: one response of every worker
    # pod of a large cluster is what API priority and fairness charges most and what spikes the server's memory.
    settings.watching.chunk_size = LIST_PAGE
    # A stopped runner exits within a pass (the etcd cleanup of a deleted job included): kopf waits for that inline,
    # so it lets a deleted job go at once, not after a polling patch and the daemon's cancellation backoff.
    settings.background.instant_exit_timeout = 1.0
    settings.watching.reconnect_backoff = 0.5
    settings.watching.connect_timeout = 10
    # A relist after 410 Gone drops what was deleted during the gap from kopf's indices (kopf does not): installed
    # here, before kopf starts its watchers (after the startup handlers). TrainingJobs are remembered whole.
    watch_relist.install(whole_groups=(GROUP,))
    settings.networking.request_timeout = 30
    try:  # kopf's login (below) shares these credentials
        memo.kube = OperatorKube(await load_credentials(config.kubeconfig))
    except KubeConfigError as err:
        raise kopf.PermanentError(str(err)) from err  # stops the operator with the message, no retries
    memo.runners = {}
    memo.collector = asyncio.ensure_future(collect_cycles())  # bounds the garbage of relaxed gc thresholds
    memo.forgotten = {}  # job uid -> (when its run's etcd keys were deleted, the run id) (forget_run)
    memo.background = set()  # tasks started from handlers, kept until done
    # kopf's indices are the same objects for the operator's life, updated in place: kept once for every reader.
    memo.caches = caches.WatchCaches(kwargs["training_jobs"], kwargs["worker_pods"], kwargs["worker_services"],
                                     kwargs["lost_nodes"])
    memo.etcd = SharedEtcd(config.settings.etcd_endpoints) if config.settings.etcd_endpoints else None
    memo.metrics = OperatorMetrics()
    if config.metrics_port:
        memo.metrics.serve(config.metrics_port)
    memo.health = None
    if config.monitor is not None:
        memo.health = BackgroundMonitor(memo.kube, config.monitor, config.namespaces, memo.metrics,
                                        lambda namespace, name: findings_inbox(memo, namespace, name), memo.caches,
                                        lambda namespace, name: ranks_restarted(memo, namespace, name))


def findings_inbox(memo: kopf.Memo, namespace: str, name: str) -> FindingsInbox | None:
    """Where the health monitor reports this job's findings: its runner's inbox (reporting wakes the runner)."""
    runner: JobRunner | None = memo.runners.get((namespace, name))
    return runner.findings if runner is not None else None


def ranks_restarted(memo: kopf.Memo, namespace: str, name: str) -> dict[str, float]:
    """When each pod's agent last restarted its ranks in place, as the job's runner last saw it (etcd liveness)."""
    runner: JobRunner | None = memo.runners.get((namespace, name))
    return {p.name: p.rank_restart_at for p in runner.seen_pods if p.rank_restart_at} if runner is not None else {}


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("collector") is not None:
        memo.collector.cancel()
    if memo.get("health") is not None:
        await memo.health.close()
    if memo.get("etcd") is not None:
        await asyncio.get_running_loop().run_in_executor(None, memo.etcd.close)
    await memo.kube.close()


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf logs in again after a 401 or once `expiration` passes: every login after the first renews the shared
    credentials (token file re-read, exec plugin run again)."""
    credentials = memo.kube.credentials
    if memo.get("logged_in"):
        await credentials.renew()
    memo.logged_in = True
    conn = await credentials.current()
    return kopf.ConnectionInfo(server=conn.server, token=conn.token, ca_path=conn.ca_file, insecure=conn.insecure,
                               certificate_path=conn.cert_file, private_key_path=conn.key_file,
                               proxy_url=conn.proxy, expiration=conn.expiration)


# Stopped (the job deleted, the operator exiting), a runner finishes its pass and exits within the backoff; kopf
# cancels it only after that (without a backoff kopf cancels a daemon at once).
@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_backoff=5.0, cancellation_timeout=10.0)
async def run_job(name: str, namespace: str | None, uid: str, body: kopf.Body, stopped: kopf.DaemonStopped,
                  memo: Any, logger: Logger, **_: Any) -> None:
    assert namespace is not None, "TrainingJobs are namespaced"
    runner = JobRunner(memo.kube, memo.config.settings, namespace, name, uid, logger, memo.metrics, memo.etcd,
                       memo.caches, under_kopf=True)
    memo.runners[(namespace, name)] = runner
    try:
        await runner.run(stopped)
    finally:
        if memo.runners.get((namespace, name)) is runner:
            del memo.runners[(namespace, name)]
    if stopped.reason is not None and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
        await forget_run(memo, body, logger)  # before kopf lets the job go (its finalizer waits for this daemon)


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event("", "v1", "pods", labels={m.JOB_LABEL: kopf.PRESENT}, when=_deleted)
async def pod_deleted(body: kopf.Body, memo: Any, **_: Any) -> None:
    """A deleted pod (kopf calls no index handler for a deletion; it has dropped the pod from its index before)."""
    await pod_changed("DELETED", body, memo)


async def pod_changed(type: str | None, body: Mapping[str, Any], memo: Any) -> None:
    """A pod's event (None: any but a deletion): its runner's wake-up, the sweep of a deleted pod of a forgotten run,
    the checkpoint location's other jobs once it stops writing there."""
    meta = body["metadata"]
    namespace, job = meta.get("namespace"), meta["labels"][m.JOB_LABEL]
    runner: JobRunner | None = memo.runners.get((namespace, job)) if "runners" in memo else None
    if runner is not None:
        runner.pod_event(type, body)
    elif type == "DELETED":
        sweep_after_pod(memo, body)
    location = (meta.get("annotations") or {}).get(CHECKPOINT_LOCATION_ANNOTATION)
    ended = type == "DELETED" or (body.get("status") or {}).get("phase") in (Phase.SUCCEEDED, Phase.FAILED)
    if location and ended:
        await wake_sharers(memo, location, (namespace, job))


async def wake_sharers(memo: Any, location: str, but: tuple[str | None, str]) -> None:
    """A job or pod stopped writing at a checkpoint location: the other jobs there (one may wait for it:
    policy/checkpoint_sharing.py) look again now rather than at their next recheck."""
    if "caches" not in memo:
        return
    for user in await memo.caches.checkpoint_users(location):
        runner: JobRunner | None = memo.runners.get((user.namespace, user.name))
        if runner is not None and (user.namespace, user.name) != but:
            runner.poke()


@kopf.on.event("", "v1", "services", labels={m.JOB_LABEL: kopf.PRESENT})
async def service_changed(type: str | None, namespace: str | None, labels: Mapping[str, str], memo: Any,
                    **_: Any) -> None:
    """A deleted headless Service is created again by the job's next pass, run now."""
    runner: JobRunner | None = memo.runners.get((namespace, labels[m.JOB_LABEL])) if namespace is not None else None
    if runner is not None and type == "DELETED":
        runner.service_gone()


# -- a deleted job's etcd keys ---------------------------------------------------------------------------------------
# No @kopf.on.delete: a changing handler makes kopf keep a diffbase annotation and work out a diff on every watch
# event of every job, for one action at deletion. kopf holds its finalizer until the job's daemon has exited, so the
# daemon deletes the keys on its way out; a job deleted while no daemon ran it is seen by its index handler.
FORGET_MEMORY_SECONDS = 600.0  # how long a forgotten run's uid is remembered (its last watch events come soon after)


async def forget_run(memo: Any, body: Mapping[str, Any], logger: Logger) -> None:
    """Delete this run's rendezvous, liveness, progress and request keys (pods and Service go by garbage
    collection); once per job uid. Its agents may still run (their pods go after the job), and one may write a
    rendezvous key again before it stops: each of the run's pods, once deleted, sweeps the keys again
    (sweep_after_pod)."""
    uid = str(body["metadata"].get("uid", ""))
    now = asyncio.get_running_loop().time()
    forgotten: dict[str, tuple[float, str]] = memo.forgotten
    for old in [u for u, (at, _) in forgotten.items() if now - at > FORGET_MEMORY_SECONDS]:
        del forgotten[old]
    if memo.etcd is None or uid in forgotten:
        return
    try:
        job = parse_job(dict(body))
    except SpecError:
        forgotten[uid] = (now, "")
        return  # never ran
    run = m.run_id(job, uid)
    forgotten[uid] = (now, run)
    await _delete_run_keys(memo, run, logger)


async def _delete_run_keys(memo: Any, run: str, logger: Logger) -> None:
    try:
        session = await memo.etcd.session()
        deleted = await asyncio.get_running_loop().run_in_executor(None, delete_run, session, run)
    except Exception as err:  # noqa: BLE001 - reported; a pod of the run going later tries again
        logger.warning(f"could not delete the etcd keys of run {run}: {err}")
        return
    if deleted:
        logger.info(f"deleted {deleted} etcd keys of run {run}")


def sweep_after_pod(memo: Any, pod: Mapping[str, Any]) -> None:
    """A deleted pod of a forgotten run (its job gone): its agent has stopped, so what it wrote after forget_run
    is deleted now (the last pod's sweep leaves nothing)."""
    uid = m.owner_job_uid(pod)
    run = memo.forgotten.get(uid, (0.0, ""))[1] if memo.etcd is not None else ""
    if run:
        task = asyncio.ensure_future(_delete_run_keys(memo, run, logging.getLogger("flywheel.operator")))
        memo.background.add(task)
        task.add_done_callback(memo.background.discard)


def forget_run_soon(memo: Any, body: Mapping[str, Any]) -> None:
    task = asyncio.ensure_future(forget_run(memo, dict(body), logging.getLogger("flywheel.operator")))
    memo.background.add(task)
    task.add_done_callback(memo.background.discard)
