"""Pure: raw Kubernetes objects (dicts) -> the API's response models. No I/O, so tests need no cluster."""

from __future__ import annotations

import math
import re
from typing import Any

from flywheel.api.progress_view import LiveProgress, from_status
from flywheel.api.schemas import (
    CheckpointRecord,
    Evaluation,
    JobDetail,
    JobEvent,
    JobSummary,
    RestartRecord,
    Restarts,
    SpecSummary,
    Timeline,
    TimelineEntry,
    Worker,
)
from flywheel.contracts.labels import GENERATION_LABEL, INDEX_LABEL, RESTART_ANNOTATION, ROLE_LABEL, ROLE_SPARE
from flywheel.contracts.timefmt import parse_rfc3339, rfc3339
from flywheel.kube.pod_state import container_outcome
from flywheel.policy import reasons as R
from flywheel.spec.status import CheckpointStatus, TrainingJobStatus

Obj = dict[str, Any]
# Checkpoint events: one per checkpoint on local runs; on a cluster the operator's, at most one per job every 30 s
# with the checkpoints in between coalesced into it (flywheel/policy/checkpoint_events.py).
CHECKPOINT_REASON = R.CHECKPOINT_COMMITTED
MAX_LOG_PERPLEXITY = 700.0  # exp() of more overflows a float
_STEP = re.compile(r"step (\d+)")
_FAILED_KIND = re.compile(r"failed: ([A-Za-z]+)")
_LIFECYCLE = {R.CREATED, R.SUSPENDED, R.RESUMED, R.RUNNING, R.SUCCEEDED, R.DEADLINE, R.DEGRADED}


def _status(obj: Obj) -> TrainingJobStatus:
    try:
        return TrainingJobStatus.model_validate(obj.get("status") or {})
    except ValueError:  # a status this version cannot read: show the defaults rather than fail the request
        return TrainingJobStatus()


def _ts(value: Any) -> str | None:
    """RFC 3339 in UTC with a Z, whatever offset form the API server used, so times sort as strings."""
    if not value:
        return None
    try:
        return rfc3339(parse_rfc3339(str(value)))
    except ValueError:
        return str(value)


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def summary(obj: Obj) -> JobSummary:
    status, meta, spec = _status(obj), _meta(obj), obj.get("spec") or {}
    return JobSummary(namespace=meta.get("namespace", "default"), name=meta.get("name", ""), phase=status.phase,
                      replicas=status.replicas, step=status.step, eval_loss=status.eval_loss, restarts=status.restarts,
                      suspended=bool(spec.get("suspend")), created=_ts(meta.get("creationTimestamp")))


def with_live_step(s: JobSummary, step: int | None) -> JobSummary:
    """A (memoized) summary with the step of the job's etcd progress (None: not followed, or no record yet)."""
    return s if step is None or step == s.step else s.model_copy(update={"step": step})


def spec_summary(spec: Obj) -> SpecSummary:
    replicas, trainer = spec.get("replicas") or {}, spec.get("trainer") or {}
    command = spec.get("command") or []
    ckpt, ft = spec.get("checkpoint") or {}, spec.get("faultTolerance") or {}
    model = " ".join(command) if command else str((trainer.get("model") or {}).get("preset") or "custom")
    return SpecSummary(image=spec.get("image") or "", replicas_min=int(replicas.get("min", 1)),
                       replicas_max=int(replicas.get("max", replicas.get("min", 1))),
                       replicas_target=replicas.get("target"), procs_per_replica=int(spec.get("procsPerReplica", 1)),
                       suspend=bool(spec.get("suspend")), workload="command" if command else "trainer",
                       model=model, steps=int((trainer.get("training") or {}).get("steps", 0)),
                       checkpoint_dir=ckpt.get("dir") or "", checkpoint_every_steps=int(ckpt.get("everySteps", 0)),
                       max_restarts=int(ft.get("maxRestarts", 0)), restart_scope=ft.get("restartScope") or "job")


def worker(pod: Obj, procs: int) -> Worker:
    meta, status = _meta(pod), pod.get("status") or {}
    labels = meta.get("labels") or {}
    index = int(labels.get(INDEX_LABEL, "0") or 0)
    outcome = container_outcome(pod)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    generation = labels.get(GENERATION_LABEL)
    return Worker(index=index, pod=meta.get("name", ""), first_rank=index * procs,
                  last_rank=index * procs + procs - 1, phase=status.get("phase") or "Unknown", ready=ready,
                  node=(pod.get("spec") or {}).get("nodeName") or "",
                  generation=int(generation) if generation and generation.isdigit() else None,
                  exit_code=outcome.exit_code, reason=outcome.reason or "", message=outcome.message or "")


def event(ev: Obj) -> JobEvent:
    inv = ev.get("involvedObject") or {}
    first = _ts(ev.get("firstTimestamp") or ev.get("eventTime") or _meta(ev).get("creationTimestamp"))
    return JobEvent(type=ev.get("type") or "Normal", reason=ev.get("reason") or "", message=ev.get("message") or "",
                    object=f"{inv.get('kind', '')}/{inv.get('name', '')}", count=int(ev.get("count") or 1),
                    first_time=first, last_time=_ts(ev.get("lastTimestamp")) or first)


def events(raw: list[Obj]) -> list[JobEvent]:
    out = [event(e) for e in raw]
    return sorted(out, key=lambda e: (e.last_time or "", e.first_time or ""))


def restarts(status: TrainingJobStatus, evs: list[JobEvent]) -> Restarts:
    history = []
    for e in evs:
        if e.reason == R.RESTARTING and e.object.startswith("TrainingJob/"):
            kind = _FAILED_KIND.search(e.message)
            history.append(RestartRecord(time=e.last_time, reason=kind.group(1) if kind else e.reason,
                                         message=e.message))
    return Restarts(count=status.restarts, last_reason=status.last_restart_reason, history=history)


def evaluation(status: TrainingJobStatus) -> Evaluation | None:
    if not status.eval_step:
        return None
    loss = status.eval_loss
    return Evaluation(step=status.eval_step, loss=loss,
                      perplexity=math.exp(loss) if loss is not None and loss <= MAX_LOG_PERPLEXITY else None)


def detail(obj: Obj, pods: list[Obj], raw_events: list[Obj], live: LiveProgress | None = None) -> JobDetail:
    """`live`: the job's etcd progress (api/progress.py); None: the status's."""
    status, meta, spec = _status(obj), _meta(obj), obj.get("spec") or {}
    live = live or from_status(status)
    procs = int(spec.get("procsPerReplica", 1))
    # Warm spares (role=spare) hold no replica index or ranks: not workers until promoted.
    workers = sorted((worker(p, procs) for p in pods
                      if (_meta(p).get("labels") or {}).get(ROLE_LABEL) != ROLE_SPARE), key=lambda w: w.index)
    return JobDetail(namespace=meta.get("namespace", "default"), name=meta.get("name", ""), uid=meta.get("uid", ""),
                     created=_ts(meta.get("creationTimestamp")), generation=int(meta.get("generation") or 0),
                     observed_generation=status.observed_generation, phase=status.phase, spec=spec_summary(spec),
                     conditions=status.conditions, replicas=status.replicas, world_size=live.world_size,
                     step=live.step, workers=workers, restarts=restarts(status, events(raw_events)),
                     last_checkpoint=live.last_checkpoint, loss=live.loss, tokens_per_second=live.tokens_per_second,
                     progress_source="etcd" if live.source == "etcd" else "status",
                     checkpoints=[CheckpointRecord(time=i.time, step=i.step, message=i.message)
                                  for i in timeline(obj, raw_events).items if i.kind == "checkpoint"],
                     goodput=live.goodput, evaluation=evaluation(status),
                     restart_requested_at=_pending_restart(meta, obj.get("status") or {}))


def _pending_restart(meta: Obj, raw_status: Obj) -> str | None:
    """The restart request the operator has not acted on yet (it records the value it served in the status)."""
    requested = (meta.get("annotations") or {}).get(RESTART_ANNOTATION)
    return requested if requested and requested != raw_status.get("restartRequestHandled") else None


def timeline(obj: Obj, raw_events: list[Obj]) -> Timeline:
    """Failures, restarts, lifecycle changes and checkpoints (from CheckpointCommitted events, and the status's
    last checkpoint when no event names it yet), oldest first."""
    status = _status(obj)
    items: list[TimelineEntry] = []
    for e in events(raw_events):
        step = None
        if e.reason == R.RESTARTING:
            kind = "restart"
        elif e.reason == CHECKPOINT_REASON:
            kind, found = "checkpoint", _STEP.search(e.message)
            step = int(found.group(1)) if found else None
        elif e.type == "Warning":
            kind = "failure"
        elif e.reason in _LIFECYCLE:
            kind = "lifecycle"
        else:
            continue
        items.append(TimelineEntry(time=e.last_time, kind=kind, reason=e.reason, message=e.message, step=step))
    for c in status.conditions:
        if c.status == "True" and c.last_transition_time:
            items.append(TimelineEntry(time=_ts(c.last_transition_time), kind="condition", reason=c.reason or c.type,
                                       message=c.message))
    ckpt: CheckpointStatus = status.last_checkpoint
    if ckpt.step and not any(i.kind == "checkpoint" and i.step == ckpt.step for i in items):
        items.append(TimelineEntry(time=_ts(ckpt.time), kind="checkpoint", reason="Checkpoint", message=ckpt.path,
                                   step=ckpt.step))
    return Timeline(items=sorted(items, key=lambda i: i.time or ""))

