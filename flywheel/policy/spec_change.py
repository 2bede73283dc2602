"""A spec edited while the job runs (pure): the workers created before the edit keep what was baked into their pods.

Every worker and spare pod carries the job's metadata.generation it was created at and a hash of the spec part
baked into it (`baked_spec_hash`: all of the spec but what the operator reads on every pass: `suspend`,
`replicas.target`, `replicas.spares`, `runPolicy`). A current pod whose generation is not the job's has the hash
compared (an edit of a live field only, such as a scale, changes the generation but not the hash); a pod whose hash
differs runs an older spec, and the `SpecChanged` condition (with a Warning event when it turns True) names them and
says how to apply the edit: suspend and resume, which creates every worker again. It turns False once every
current worker runs the job's spec.

A worker never joins a group that runs another spec (its trainer would disagree with theirs on the steps, the
model or the data: a collective that hangs or a silent mix). Where a pass would add a worker to the current group
(a replacement, a scale up, a promoted spare) while a worker it keeps runs an older spec, `regroup_if_mixed`
deletes the kept workers instead and starts a new generation: the whole group is created again with the job's
spec, from the last checkpoint, once they are gone -- the edit is applied at the next moment the group re-forms
anyway. A new generation begun so is no restart (nothing failed). Pods of an older generation on an older spec are
always deleted (`clean_up`), so a pass repeated after an operator crash finishes the same regroup; spares on an
older spec are replaced (policy/spares.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from flywheel.policy import reasons as R
from flywheel.policy.conditions import holds, set_condition, set_phase
from flywheel.policy.decisions import CreatePod, DeletePod, Event, Pass, PromoteSpare, Relabel
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import PodView
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import ConditionType, Phase

LIVE_FIELDS = ("suspend", "runPolicy")  # read by the operator on every pass; replicas' target and spares below
LIVE_REPLICA_FIELDS = ("target", "spares")


def baked_spec_hash(spec: TrainingJobSpec) -> str:
    """A short hash of the spec part a pod is created with (stable across processes: canonical JSON)."""
    doc = spec.model_dump(mode="json", by_alias=True)
    for key in LIVE_FIELDS:
        doc.pop(key, None)
    for key in LIVE_REPLICA_FIELDS:
        (doc.get("replicas") or {}).pop(key, None)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def on_older_spec(job: JobView, pods: Iterable[PodView]) -> list[PodView]:
    """Those of `pods` created with another baked spec than the job's (a pod without the annotations: never). The
    hash is compared only for pods created at another spec generation (a scale alone changes the generation)."""
    older = [p for p in pods if p.spec_hash and p.spec_generation != job.spec_generation]
    if not older:
        return []
    now = baked_spec_hash(job.spec)
    return [p for p in older if p.spec_hash != now]


def stale_workers(job: JobView) -> list[str]:
    """The current workers created with another baked spec than the job's, by name."""
    return sorted(p.name for p in on_older_spec(job, job.current))


def regroup_if_mixed(out: Pass, job: JobView) -> None:
    """Where this pass adds workers (CreatePod, PromoteSpare) to the group it keeps and a kept worker runs an older
    spec: delete every kept worker instead, and begin a new generation (not a restart) whose workers are created
    with the job's spec once the kept ones are gone (policy/scale_create.py: a whole new group)."""
    generation = out.status.generation
    joining = sorted({a.index for a in out.actions if isinstance(a, CreatePod | PromoteSpare)
                      and a.generation == generation})
    if not joining:
        return
    going = {a.uid for a in out.actions if isinstance(a, DeletePod)}
    relabelled = {a.name for a in out.actions if isinstance(a, Relabel) and a.generation == generation}
    kept = [p for p in job.pods if p.active and p.deleting_since is None and p.uid not in going
            and (p.generation == generation or p.name in relabelled)]
    older = on_older_spec(job, kept)
    if not older:
        return
    message = R.MSG_SPEC_REGROUP.format(joining=", ".join(map(str, joining)),
                                        pods=", ".join(sorted(p.name for p in older)))
    out.actions = [a for a in out.actions if not isinstance(a, CreatePod | PromoteSpare | Relabel)
                   or (isinstance(a, Relabel) and a.name not in relabelled)]
    out.actions += [DeletePod(p.name, p.uid) for p in kept]
    out.status.worker_generation = generation + 1
    out.status.replicas.current = sum(1 for p in job.pods if p.active)
    set_phase(out.status, Phase.RESTARTING, R.SPEC_REGROUP, message, job.now)
    out.events.append(Event("Normal", R.SPEC_REGROUP, message))


def track_spec_change(out: Pass, job: JobView) -> None:
    stale = stale_workers(job)
    if stale:
        message = R.MSG_SPEC_CHANGED.format(pods=", ".join(stale))
        if not holds(out.status, ConditionType.SPEC_CHANGED):
            out.events.append(Event("Warning", R.SPEC_CHANGED, message))
        set_condition(out.status, ConditionType.SPEC_CHANGED, True, R.SPEC_CHANGED, message, job.now)
    elif holds(out.status, ConditionType.SPEC_CHANGED) and job.current:
        set_condition(out.status, ConditionType.SPEC_CHANGED, False, R.SPEC_APPLIED, R.MSG_SPEC_APPLIED, job.now)
