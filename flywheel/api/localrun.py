"""The local job (`flywheel run --api-port`) as a JobSource: the TrainingJob document plus a status, events and
worker entries folded from the run's event log (docs/contracts.md, "Event log"), so the API serves it with the
same schema as a cluster job. Read-only: the actions need the supervisor's cooperation (not built)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flywheel.api.views import CHECKPOINT_REASON
from flywheel.labels import INDEX_LABEL, JOB_LABEL
from flywheel.policy import reasons as R
from flywheel.spec import TrainingJob
from flywheel.timefmt import rfc3339

Obj = dict[str, Any]
_FAILURE_KIND = {"kill": "Killed", "hang": "Hang"}


class EventLogSource:
    """Re-reads only the new lines of the event log on each request (a file the workers append to)."""

    def __init__(self, job: TrainingJob, events_file: str | Path, namespace: str = "local") -> None:
        self.tj, self.path, self.namespace = job, Path(events_file), namespace
        self._lock = threading.Lock()
        self._offset, self._partial = 0, b""
        self._reset()

    def _reset(self) -> None:
        self._starts: list[Obj] = []
        self._steps: dict[int, Obj] = {}
        self._attempts = 0
        self._checkpoints: list[Obj] = []
        self._failures: list[Obj] = []
        self._done: Obj | None = None
        self._first_time: float | None = None
        self._last_time = 0.0

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, 2)
                if size < self._offset:  # a new run truncated the log: fold from scratch
                    self._offset, self._partial = 0, b""
                    self._reset()
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a fragment left by a killed writer
            if isinstance(ev, dict) and "event" in ev:
                self._fold(ev)

    def _fold(self, ev: Obj) -> None:
        kind, t = ev["event"], float(ev.get("time", 0.0))
        self._first_time = t if self._first_time is None else min(self._first_time, t)
        self._last_time = max(self._last_time, t)
        if kind == "start":
            self._starts.append(ev)
        elif kind == "step":
            self._steps[int(ev["step"])] = ev
            self._attempts += 1
        elif kind == "checkpoint":
            self._checkpoints.append(ev)
        elif kind in ("fault", "hang"):
            # one failure per incarnation: every blocked rank's watchdog may fire after one hang
            if not self._failures or self._failures[-1]["incarnation"] != len(self._starts):
                self._failures.append({**ev, "incarnation": len(self._starts)})
        elif kind == "done":
            self._done = ev

    def _status(self) -> Obj:
        spec = self.tj.spec
        step = max(self._steps, default=0)
        last_step = self._steps.get(step, {})
        restarts = max(len(self._starts) - 1, 0)
        failed_since = self._failures and (not self._steps or self._failures[-1]["time"] > last_step.get("time", 0))
        phase = ("Succeeded" if self._done else "Restarting" if failed_since else
                 "Running" if self._starts else "Pending")
        wall = max(self._last_time - (self._first_time or self._last_time), 0.0)
        productive = sum(float(s.get("step_seconds", 0.0)) for s in self._steps.values())
        status: Obj = {"phase": phase, "step": step, "restarts": restarts,
                       "worldSize": int(last_step.get("world_size") or spec.replicas.desired * spec.procs_per_replica),
                       "replicas": {"desired": spec.replicas.desired, "current": spec.replicas.desired,
                                    "ready": spec.replicas.desired if phase == "Running" else 0},
                       "goodput": {"ratio": round(productive / wall, 4) if wall else 0.0,
                                   "productiveSeconds": round(productive, 3),
                                   "lostSteps": self._attempts - len(self._steps)}}
        if self._failures:
            status["lastRestartReason"] = _FAILURE_KIND.get(str(self._failures[-1].get("kind", "hang")), "Hang")
        if self._checkpoints:
            c = self._checkpoints[-1]
            status["lastCheckpoint"] = {"step": int(c["step"]), "path": c.get("path", ""), "time": rfc3339(c["time"])}
        if self._starts:
            status["conditions"] = [{"type": phase, "status": "True", "reason": phase,
                                     "lastTransitionTime": rfc3339(self._last_time)}]
        return status

    def _job_obj(self) -> Obj:
        meta = {"name": self.tj.name, "namespace": self.namespace, "uid": f"local-{self.tj.name}",
                "generation": 1}
        if self._first_time is not None:
            meta["creationTimestamp"] = rfc3339(self._first_time)
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
            out = [self._event("Warning", R.RESTARTING, f["time"],
                               f"rank {f.get('rank')} failed: {_FAILURE_KIND.get(str(f.get('kind')), 'Hang')} "
                               f"(at step {f.get('step', '?')})") for f in self._failures]
            out += [self._event("Normal", CHECKPOINT_REASON, c["time"], f"step {c['step']} committed to "
                                f"{c.get('path', '')}") for c in self._checkpoints]
            if self._done:
                out.append(self._event("Normal", R.SUCCEEDED, self._done["time"],
                                       R.MSG_SUCCEEDED.format(step=self._done.get("step"))))
        return out

    def _event(self, kind: str, reason: str, t: float, message: str) -> Obj:
        return {"type": kind, "reason": reason, "message": message, "count": 1, "firstTimestamp": rfc3339(t),
                "lastTimestamp": rfc3339(t), "involvedObject": {"kind": "TrainingJob", "name": self.tj.name,
                                                             "namespace": self.namespace}}
