"""The local job (`flywheel run --api-port`) as a JobSource: the TrainingJob document plus a status, events and
worker entries folded from the run's event log (docs/contracts.md, "Event log"), so the API serves it with the
same schema as a cluster job. Read-only: the actions need the supervisor's cooperation (not built)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flywheel.api.views import CHECKPOINT_REASON
from flywheel.contracts.labels import INDEX_LABEL, JOB_LABEL
from flywheel.contracts.timefmt import rfc3339
from flywheel.eventlog import EventTail, FailureEntry, RunFold
from flywheel.policy import reasons as R
from flywheel.spec import TrainingJob

Obj = dict[str, Any]
_FAILURE_KIND = {"kill": "Killed", "hang": R.RESTART_HUNG, "collective-timeout": "CollectiveTimeout",
                 "user-error": "UserError"}


def _failure_reason(f: FailureEntry) -> str:
    """A rank failure's kind as a reason; a worker exit carries its failure kind (Killed, UserError, ...) already."""
    return _FAILURE_KIND.get(f.record.kind, f.record.kind or R.RESTART_HUNG)


def _failure_message(f: FailureEntry) -> str:
    r = f.record
    who = f"rank {r.rank}" if r.replica is None else f"worker {r.replica}"
    return f"{who} failed: {_failure_reason(f)} ({f.detail})"


class EventLogSource:
    """Re-reads only the new lines of the event log on each request (a file the workers append to), with the one
    tailer and the one fold (flywheel/eventlog): a log truncated by a new run is folded from scratch."""

    def __init__(self, job: TrainingJob, events_file: str | Path, namespace: str = "local") -> None:
        self.tj, self.path, self.namespace = job, Path(events_file), namespace
        self._lock = threading.Lock()
        self._tail, self._log = EventTail(self.path), RunFold(keep_attempts=False)

    def _read(self) -> None:
        self._log.add_all(self._tail.read_new())

    def _phase(self) -> str:
        log = self._log
        if log.done:
            return "Succeeded"
        if log.open_incident is not None:
            return "Restarting"
        return "Running" if log.starts or log.last else "Pending"

    def _status(self) -> Obj:
        spec, log = self.tj.spec, self._log
        phase = self._phase()
        mean = log.mean_time_to_recover
        status: Obj = {"phase": phase, "step": log.last_step, "restarts": log.restarts,
                       "worldSize": (log.last.world_size if log.last else 0)
                       or spec.replicas.desired * spec.procs_per_replica,
                       "replicas": {"desired": spec.replicas.desired, "current": spec.replicas.desired,
                                    "ready": spec.replicas.desired if phase == "Running" else 0},
                       "goodput": {"ratio": round(min(1.0, log.productive_seconds / log.log_wall_seconds), 4)
                                   if log.log_wall_seconds else 0.0,
                                   "productiveSeconds": round(log.productive_seconds, 3),
                                   "lostSteps": log.lost_steps,
                                   "meanTimeToRecoverSeconds": round(mean, 3) if mean is not None else 0.0}}
        if log.failures:
            status["lastRestartReason"] = _failure_reason(log.failures[-1])
        if log.last_eval is not None:
            status["evalStep"], status["evalLoss"] = log.last_eval.step, log.last_eval.loss
        if log.checkpoints:
            c = log.checkpoints[-1]
            status["lastCheckpoint"] = {"step": c.step, "path": c.path, "time": rfc3339(c.time)}
        if log.starts or log.last:
            status["conditions"] = [{"type": phase, "status": "True", "reason": phase,
                                     "lastTransitionTime": rfc3339(log.last_time or 0.0)}]
            if log.failure_reason:
                status["conditions"][0]["message"] = log.failure_reason
        return status

    def _job_obj(self) -> Obj:
        meta = {"name": self.tj.name, "namespace": self.namespace, "uid": f"local-{self.tj.name}",
                "generation": 1}
        if self._log.first_time is not None:
            meta["creationTimestamp"] = rfc3339(self._log.first_time)
        return {"apiVersion": self.tj.api_version, "kind": self.tj.kind, "metadata": meta,
                "spec": self.tj.spec.model_dump(by_alias=True, mode="json"), "status": self._status()}

    # --- JobSource --------------------------------------------------------------------------------------------
    def ready(self) -> bool:
        return True

    def jobs(self) -> list[Obj]:
        with self._lock:
            self._read()
            return [self._job_obj()]

    def job(self, namespace: str, name: str) -> Obj | None:
        if (namespace, name) != (self.namespace, self.tj.name):
            return None
        return self.jobs()[0]

    def pods(self, namespace: str, job: str) -> list[Obj]:
        """One entry per worker (a process group here, not a pod); its phase follows the job's."""
        obj = self.job(namespace, job)
        if obj is None:
            return []
        phase = {"Succeeded": "Succeeded", "Pending": "Pending"}.get(obj["status"]["phase"], "Running")
        return [{"metadata": {"name": f"{job}-worker-{i}", "namespace": namespace,
                              "labels": {JOB_LABEL: job, INDEX_LABEL: str(i)}},
                 "spec": {"nodeName": "localhost"},
                 "status": {"phase": phase, "conditions": [{"type": "Ready",
                                                            "status": str(phase == "Running")}]}}
                for i in range(self.tj.spec.replicas.desired)]

    def events(self, namespace: str, names: Iterable[str]) -> list[Obj]:
        if self.tj.name not in set(names) or namespace != self.namespace:
            return []
        with self._lock:
            self._read()
            log = self._log
            out = [self._event("Warning", R.RESTARTING, f.record.time, _failure_message(f)) for f in log.failures]
            out += [self._event("Normal", CHECKPOINT_REASON, c.time, f"step {c.step} committed to {c.path}")
                    for c in log.checkpoints]
            if log.done:
                out.append(self._event("Normal", R.SUCCEEDED, log.done.time,
                                       R.MSG_SUCCEEDED.format(step=log.done.step)))
        return out

    def _event(self, kind: str, reason: str, t: float, message: str) -> Obj:
        return {"type": kind, "reason": reason, "message": message, "count": 1, "firstTimestamp": rfc3339(t),
                "lastTimestamp": rfc3339(t), "involvedObject": {"kind": "TrainingJob", "name": self.tj.name,
                                                             "namespace": self.namespace}}
