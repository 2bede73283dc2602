"""Synthetic cluster objects for the REST API: TrainingJobs in every phase across namespaces, their worker pods
and the events the operator and kubelet post, as the Kubernetes API would return them (camelCase dicts).

Shared by bench/api_latency.py (500 jobs behind a real server) and tests/api/test_schemathesis.py (a handful,
so schemathesis meets every response shape). Deterministic for a given seed, so runs are comparable.
"""

from __future__ import annotations

import random
from typing import Any

from flywheel.contracts.labels import RESTART_ANNOTATION
from flywheel.spec.crd.generate import GROUP, VERSION

Obj = dict[str, Any]
NAMESPACES = ("default", "ml", "team-a", "team-b", "research")
PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
BASE = "2026-01-01T"


def _t(seconds: int) -> str:
    seconds %= 86_400
    return f"{BASE}{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"


def key(i: int) -> tuple[str, str]:
    """(namespace, name) of job number i."""
    return NAMESPACES[i % len(NAMESPACES)], f"job-{i:04d}"


def job(i: int, rng: random.Random) -> tuple[Obj, list[Obj], list[Obj]]:
    """Job number i with its pods and events."""
    (ns, name), phase = key(i), PHASES[i % len(PHASES)]
    rmin, rmax, procs = 1 + i % 2, 2 + i % 4, 1 + i % 4
    running = phase in ("Running", "Restarting")
    current = rmax if running else (0 if phase in ("Pending", "Suspended") else rmin)
    ready = current - (1 if phase == "Restarting" else 0)
    step, restarts = (0 if phase == "Pending" else 100 + rng.randrange(10_000)), i % 5
    t0 = rng.randrange(3600)
    annotations = {RESTART_ANNOTATION: _t(t0 + 900)} if i % 7 == 0 else {}
    conditions = [{"type": "Running", "status": "True" if running else "False", "reason": "WorkersRunning",
                   "message": f"{ready} workers running", "lastTransitionTime": _t(t0 + 60)}]
    if phase == "Restarting":
        conditions.append({"type": "Restarting", "status": "True", "reason": "Restarting",
                           "message": f"worker {name}-worker-1 failed: Killed (exit code 137, reason )",
                           "lastTransitionTime": _t(t0 + 600)})
    status = {"phase": phase, "replicas": {"desired": rmax, "current": current, "ready": max(ready, 0)},
              "worldSize": max(ready, 0) * procs, "step": step, "restarts": restarts,
              "lastRestartReason": "Killed" if restarts else "", "observedGeneration": 1 + i % 3,
              "conditions": conditions,
              "lastCheckpoint": {"step": step - step % 50, "time": _t(t0 + 500), "path": f"/ckpt/{name}/s"}
              if step >= 50 else {},
              "goodput": {"ratio": round(0.5 + rng.random() / 2, 3), "productiveSeconds": float(step),
                          "lostSteps": restarts * 7, "meanTimeToRecoverSeconds": 3.5 * bool(restarts)},
              "restartRequestHandled": annotations.get(RESTART_ANNOTATION, "") if i % 14 == 0 else ""}
    spec: Obj = {"image": "flywheel:latest", "replicas": {"min": rmin, "max": rmax}, "procsPerReplica": procs,
                 "suspend": phase == "Suspended",
                 "checkpoint": {"dir": f"/ckpt/{name}", "everySteps": 50, "ephemeral": True},
                 "faultTolerance": {"maxRestarts": 10, "restartScope": "job"}}
    if i % 3 == 0:
        spec["command"] = ["python", "train.py", "--lr", "3e-4"]
    else:
        spec["trainer"] = {"model": {"preset": "gpt-tiny"}, "training": {"steps": 20_000}}
    obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
           "metadata": {"name": name, "namespace": ns, "uid": f"uid-{i}", "generation": 1 + i % 3,
                        "creationTimestamp": _t(t0), "annotations": annotations},
           "spec": spec, "status": status}
    pods = [_pod(name, ns, k, phase, procs, k < ready) for k in range(current)]
    return obj, pods, _events(name, ns, t0, restarts, step, pods)


def _pod(job_name: str, ns: str, index: int, phase: str, procs: int, ready: bool) -> Obj:
    failed = phase in ("Failed", "Restarting") and not ready
    state = ({"terminated": {"exitCode": 137, "reason": "OOMKilled"}} if failed
             else {"running": {"startedAt": _t(index)}})
    return {"metadata": {"name": f"{job_name}-worker-{index}", "namespace": ns,
                         "labels": {"flywheel.dev/job": job_name, "flywheel.dev/replica-index": str(index),
                                    "flywheel.dev/generation": "1"}},
            "spec": {"nodeName": f"node-{index % 8}"},
            "status": {"phase": "Failed" if failed else ("Succeeded" if phase == "Succeeded" else "Running"),
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "worker", "state": state}]}}


def _events(name: str, ns: str, t0: int, restarts: int, step: int, pods: list[Obj]) -> list[Obj]:
    def ev(n: int, kind: str, target: str, reason: str, message: str, etype: str = "Normal", at: int = 0) -> Obj:
        return {"metadata": {"name": f"{target}.{n:04x}", "namespace": ns},
                "involvedObject": {"kind": kind, "name": target, "namespace": ns},
                "type": etype, "reason": reason, "message": message, "count": 1,
                "firstTimestamp": _t(t0 + at), "lastTimestamp": _t(t0 + at)}

    out = [ev(0, "TrainingJob", name, "Created", "TrainingJob accepted; creating the workers")]
    for r in range(restarts):
        out.append(ev(1 + r, "TrainingJob", name, "Restarting",
                      f"worker {name}-worker-0 failed: Killed (exit code 137, reason ); restart {r + 1} of 10",
                      "Warning", 100 + 60 * r))
    for c in range(0, min(step, 400), 100):
        out.append(ev(100 + c // 100, "TrainingJob", name, "CheckpointCommitted", f"checkpoint at step {c}",
                      at=50 + c))
    for k, pod in enumerate(pods):
        out.append(ev(200 + k, "Pod", pod["metadata"]["name"], "Started", "Started container worker", at=5))
    return out


def populate(source: Any, jobs: int, seed: int = 0) -> int:
    """Put `jobs` jobs with their pods and events into a MemorySource; returns the number of objects."""
    rng, count = random.Random(seed), 0
    for i in range(jobs):
        obj, pods, events = job(i, rng)
        source.put("job", obj)
        for p in pods:
            source.put("pod", p)
        for e in events:
            source.put("event", e)
        count += 1 + len(pods) + len(events)
    return count
