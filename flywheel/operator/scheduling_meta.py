"""Kueue's pod-group metadata on the worker pods (pure): with a queue, every worker of a job carries Kueue's queue
label, the pod-group label and the group's total count, and is created behind Kueue's scheduling gate, so Kueue
admits the job's workers as one workload and the scheduler sees none of them before it does
(kueue.sigs.k8s.io "Run Plain Pods": a group of Pods admitted together).

The queue is `spec.scheduling.queue`, or the job's own `kueue.x-k8s.io/queue-name` label (which the pods keep).
The group is named after the job and counts the workers the job runs now (`replicas.desired`) and its warm spares
(`replicas.spares`, admitted with the workers: their resources are part of the request): the same group
across restarts, since a restarted worker replaces a failed one of the group and survivors keep their labels.
With Volcano as the operator's gang scheduler the queue is Volcano's (the PodGroup's `spec.queue`), not Kueue's:
no Kueue metadata then. A gated pod is Pending with PodScheduled=False reason `SchedulingGated`, which the
operator neither counts as a failure nor as Unschedulable (observe.pod_view); `spec.suspend` still holds a job.
"""

from __future__ import annotations

import copy
from typing import Any

from flywheel.contracts.labels import POD_GROUP_LABEL, POD_GROUP_TOTAL_ANNOTATION, QUEUE_LABEL
from flywheel.spec import TrainingJob

ADMISSION_GATE = "kueue.x-k8s.io/admission"  # Kueue removes it once the workload is admitted
GATED_REASON = "SchedulingGated"  # PodScheduled=False while a pod has scheduling gates


def kueue_queue(job: TrainingJob, gang_scheduler: str) -> str:
    """The Kueue LocalQueue the job's pods go to, or "" (none, or the queue is Volcano's)."""
    if gang_scheduler == "volcano" and job.spec.scheduling.gang:
        return ""
    job_labels = (job.metadata.model_extra or {}).get("labels") or {}
    return str(job_labels.get(QUEUE_LABEL) or job.spec.scheduling.queue)


def kueue_metadata(job: TrainingJob, gang_scheduler: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(labels, annotations, scheduling gates) that put a worker pod in the job's Kueue pod group."""
    queue = kueue_queue(job, gang_scheduler)
    if not queue:
        return {}, {}, []
    return ({QUEUE_LABEL: queue, POD_GROUP_LABEL: job.name},
            {POD_GROUP_TOTAL_ANNOTATION: str(job.spec.replicas.desired + job.spec.replicas.spares)}, [ADMISSION_GATE])


def with_scheduling_meta(job: TrainingJob, gang_scheduler: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of the worker pod with the job's Kueue metadata added (gates already in the pod are kept)."""
    labels, annotations, gates = kueue_metadata(job, gang_scheduler)
    if not (labels or annotations or gates):
        return pod
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    spec = out.setdefault("spec", {})
    present = [g.get("name") for g in spec.get("schedulingGates") or []]
    spec["schedulingGates"] = [*(spec.get("schedulingGates") or []),
                               *({"name": g} for g in gates if g not in present)]
    return out
