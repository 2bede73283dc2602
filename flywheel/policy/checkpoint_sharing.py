"""One unfinished job per checkpoint location (pure).

Two jobs writing one checkpoint folder at once (a copied YAML that kept `checkpoint.dir`) would each resume the
other's steps after a restart, and each one's retention would delete the other's checkpoints: both runs silently
mixed. So among the unfinished jobs whose checkpoints land in one place, the oldest (creationTimestamp, then name)
has it; a newer one creates no worker while that one is unfinished: it waits Pending with `CheckpointDirInUse`
(a Warning event when it starts waiting), and runs -- resuming from what the other left, as a job naming another's
dir does -- once that job finishes or is deleted. A deleted job's pods that are still stopping (writing their
emergency checkpoint within their grace period) hold the place too, whatever the order, until they are gone. A job
whose workers already run is never stopped for it; it is held only when it would create its workers afresh (a
whole-job restart, a resume).

Where the checkpoints land (`checkpoint_location`): an object-store URL names one place whatever the namespace; a
path on a claim is that claim's folder in the job's namespace; a path without a claim is each pod's own emptyDir,
shared with no one.
"""

from __future__ import annotations

import posixpath

from flywheel.policy import reasons as R
from flywheel.policy.conditions import holds, set_condition, set_phase
from flywheel.policy.decisions import Event, Pass
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import DirUser
from flywheel.spec import storage as object_store
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus

RECHECK_SECONDS = 10.0  # a held job looks again this often (a deleted job wakes no other job's pass)
STOPPING_RECHECK_SECONDS = 2.0  # ... and this often while stopping pods hold it (gone within their grace period)


def checkpoint_location(namespace: str, directory: str, claim_name: str) -> str | None:
    """Where a job's checkpoints land, as a key two jobs share exactly when they write the same folder; None: in
    each pod's own volume (no claim), shared with no one."""
    if object_store.is_url(directory):
        return object_store.normalise(directory).rstrip("/")
    if not claim_name:
        return None
    return f"{namespace}/{claim_name}:{posixpath.normpath('/' + directory.lstrip('/'))}"


def dir_holder(job: JobView) -> DirUser | None:
    """What keeps this job's checkpoint location from it: a deleted job's pods still stopping there, else the
    unfinished job created before this one whose checkpoints land there; None: nothing."""
    sharing = job.sharing
    stopping = [u for u in sharing.others if u.stopping_pods]
    if stopping:
        return stopping[0]
    me = (sharing.created, sharing.name)
    older = [u for u in sharing.others if not u.finished and (u.created, u.name) < me]
    return min(older, key=lambda u: (u.created, u.name), default=None)


def wait_for_checkpoint_dir(out: Pass, job: JobView) -> Pass | None:
    """Holds the job Pending (no worker created) while `dir_holder` has its checkpoint location and none of its
    workers runs; None: it may go on (the condition, if it held, turned False)."""
    status, holder = out.status, dir_holder(job)
    if holder is None or any(p.active for p in job.pods):
        if holds(status, ConditionType.CHECKPOINT_DIR_IN_USE):
            set_condition(status, ConditionType.CHECKPOINT_DIR_IN_USE, False, R.CHECKPOINT_DIR_FREE,
                          R.MSG_CHECKPOINT_DIR_FREE, job.now)
        return None
    location = checkpoint_location(job.sharing.namespace, job.spec.checkpoint.dir, job.spec.checkpoint.claim_name)
    message = (R.MSG_CHECKPOINT_DIR_STOPPING if holder.stopping_pods else R.MSG_CHECKPOINT_DIR_IN_USE).format(
        location=location, holder=f"{holder.namespace}/{holder.name}", pods=", ".join(holder.stopping_pods))
    if not holds(status, ConditionType.CHECKPOINT_DIR_IN_USE):
        out.events.append(Event("Warning", R.CHECKPOINT_DIR_IN_USE, message))
    waiting = Phase.RESTARTING if status.phase is Phase.RESTARTING else Phase.PENDING
    set_phase(status, waiting, R.CHECKPOINT_DIR_IN_USE, message, job.now, refresh=False)
    set_condition(status, ConditionType.CHECKPOINT_DIR_IN_USE, True, R.CHECKPOINT_DIR_IN_USE, message, job.now)
    return out


def recheck_due(status: TrainingJobStatus, job: JobView) -> float | None:
    """While held: the next look (a holder that finishes or is deleted wakes no other job's pass)."""
    if not holds(status, ConditionType.CHECKPOINT_DIR_IN_USE):
        return None
    holder = dir_holder(job)
    return job.now + (STOPPING_RECHECK_SECONDS if holder is not None and holder.stopping_pods else RECHECK_SECONDS)
