"""A spec edited while the job runs (pure): the workers created before the edit keep what was baked into their pods.

Every worker and spare pod carries the job's metadata.generation it was created at and a hash of the spec part
baked into it (`baked_spec_hash`: all of the spec but what the operator reads on every pass: `suspend`,
`replicas.target`, `replicas.spares`, `runPolicy`). A current pod whose generation is not the job's has the hash
compared (an edit of a live field only, such as a scale, changes the generation but not the hash); a pod whose hash
differs runs an older spec, and the `SpecChanged` condition (with a Warning event when it turns True) names them and
says how to apply the edit: suspend and resume, which creates every worker again. It turns False once every
current worker runs the job's spec.
"""

from __future__ import annotations

import hashlib
import json

from flywheel.policy import reasons as R
from flywheel.policy.conditions import holds, set_condition
from flywheel.policy.decisions import Event, Pass
from flywheel.policy.job_view import JobView
from flywheel.spec import TrainingJobSpec
from flywheel.spec_status import ConditionType

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


def stale_workers(job: JobView) -> list[str]:
    """The current workers created with another baked spec than the job's, by name."""
    older = [p for p in job.current if p.spec_hash and p.spec_generation is not None
             and p.spec_generation != job.spec_generation]
    if not older:
        return []
    now = baked_spec_hash(job.spec)
    return sorted(p.name for p in older if p.spec_hash != now)


def track_spec_change(out: Pass, job: JobView) -> None:
    stale = stale_workers(job)
    if stale:
        message = R.MSG_SPEC_CHANGED.format(pods=", ".join(stale))
        if not holds(out.status, ConditionType.SPEC_CHANGED):
            out.events.append(Event("Warning", R.SPEC_CHANGED, message))
        set_condition(out.status, ConditionType.SPEC_CHANGED, True, R.SPEC_CHANGED, message, job.now)
    elif holds(out.status, ConditionType.SPEC_CHANGED) and job.current:
        set_condition(out.status, ConditionType.SPEC_CHANGED, False, R.SPEC_APPLIED, R.MSG_SPEC_APPLIED, job.now)
