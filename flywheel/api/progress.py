"""The REST API's live training progress: the workers' etcd progress records (flywheel/etcd/progress.py), the source
the operator fills the status from, read here too when the API runs with etcd endpoints.

`ProgressFollower` follows the progress prefix of every job in the API's cache that is not finished (one
`ProgressWatch` each, on one etcd session) and folds the records into the operator's ledger
(monitor/etcd_progress.py); `live_view` (progress_view.py, pure) turns a job's ledger and its status into what
the API shows. A
finished job's status is final (the operator wrote it from the same records): it is shown as it is. Without etcd
(no endpoints, a job not followed yet) the API shows the status alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from flywheel.api.progress_view import FINISHED, FollowedJob, LiveProgress, live_view
from flywheel.etcd.progress import ProgressRecord
from flywheel.etcd.progress_watch import ProgressWatch, watch_progress
from flywheel.etcd.session import EtcdSession
from flywheel.monitor.etcd_progress import GoodputSeed, ProgressLedger
from flywheel.spec import SpecError, parse_job
from flywheel.spec.status import TrainingJobStatus
from flywheel.worker_plan import run_id

log = logging.getLogger(__name__)
Obj = dict[str, Any]
JobKey = tuple[str, str, str]  # (namespace, name, uid): a re-created job is another run
SYNC_SECONDS = 1.0


def run_id_of(obj: Obj) -> str | None:
    """The job's etcd run id, as the operator names it; None for an invalid job."""
    try:
        return run_id(parse_job(obj), str(obj["metadata"].get("uid", "")))
    except SpecError:
        return None


def job_key(obj: Obj) -> JobKey:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "default", meta.get("name") or "", meta.get("uid") or ""


class ProgressFollower:
    """Follows the jobs `jobs()` lists (the API's cache) on a thread, every SYNC_SECONDS; `live(obj)` is a job's
    view. Watch callbacks run on the etcd session's thread: state is under a lock."""

    def __init__(self, endpoints: str, jobs: Callable[[], list[Obj]], clock: Callable[[], float]) -> None:
        self.session = EtcdSession(endpoints, retry_seconds=10.0, name="flywheel-api-etcd")
        self.jobs, self.clock = jobs, clock
        self._lock = threading.Lock()
        self._followed: dict[JobKey, FollowedJob] = {}
        self._watches: dict[JobKey, ProgressWatch] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flywheel-api-progress", daemon=True)

    def start(self) -> ProgressFollower:
        self._thread.start()
        return self

    def live(self, obj: Obj) -> LiveProgress:
        status = TrainingJobStatus.model_validate(obj.get("status") or {})
        with self._lock:
            followed = self._followed.get(job_key(obj))
            return live_view(status, followed)

    def live_step(self, obj: Obj) -> int | None:
        """The step of a followed, unfinished job's newest record (cheap: for lists); None otherwise."""
        if (obj.get("status") or {}).get("phase") in FINISHED:
            return None
        with self._lock:
            followed = self._followed.get(job_key(obj))
            return followed.latest.step if followed is not None and followed.latest is not None else None

    def sync(self) -> None:
        """Follow every unfinished job, forget the others."""
        wanted = {job_key(o): o for o in self.jobs()
                  if (o.get("status") or {}).get("phase") not in FINISHED}
        for key in [k for k in self._watches if k not in wanted]:
            self._watches.pop(key).stop()
            with self._lock:
                self._followed.pop(key, None)
        for key, obj in wanted.items():
            if key not in self._watches and (run_id := run_id_of(obj)) is not None:
                self._follow(key, obj, run_id)

    def _follow(self, key: JobKey, obj: Obj, run_id: str) -> None:
        goodput = TrainingJobStatus.model_validate(obj.get("status") or {}).goodput
        followed = FollowedJob(ProgressLedger(), GoodputSeed(goodput.productive_seconds, goodput.ratio,
                                                             goodput.lost_steps,
                                                             goodput.mean_time_to_recover_seconds, self.clock()))

        def changed(records: dict[str, ProgressRecord]) -> None:
            with self._lock:
                for record in records.values():
                    followed.add(record)

        with self._lock:
            self._followed[key] = followed
        self._watches[key] = watch_progress(self.session, run_id, changed, shared=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as err:  # noqa: BLE001 (etcd or a bad object: the status still shows; retried)
                log.warning("api progress follower: %s", err)
            self._stop.wait(SYNC_SECONDS)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for watch in self._watches.values():
            watch.stop()
        self._watches.clear()
        self.session.close()
