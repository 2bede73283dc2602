"""The labels and annotations Flywheel puts on Kubernetes objects, defined once for the operator, the REST API and
the tests. The API group is the TrainingJob's (`flywheel.dev/v1alpha1`, spec.API_VERSION)."""

from __future__ import annotations

GROUP = "flywheel.dev"

# On every worker pod (and the job's Service and PodGroup): which TrainingJob it belongs to.
JOB_LABEL = f"{GROUP}/job"
# On every worker pod: its replica index (ranks index x procsPerReplica ...) and the restart generation it was
# created for (the policy decides failures only for pods of the current generation).
INDEX_LABEL = f"{GROUP}/replica-index"
GENERATION_LABEL = f"{GROUP}/generation"
# On every pod of a job: "worker", or "spare" for a warm spare (spec.replicas.spares), which has no replica index
# until the operator promotes it (then it is relabelled "worker" with the index it took).
ROLE_LABEL = f"{GROUP}/role"
ROLE_WORKER = "worker"
ROLE_SPARE = "spare"
# On a TrainingJob: set to an RFC 3339 time to restart the job once (the REST API's `restart`, or `kubectl annotate`).
RESTART_ANNOTATION = f"{GROUP}/restart-requested-at"
# On a worker pod the health monitor deletes (a GPU XID): why, for the job's status.lastRestartReason.
DELETED_FOR_ANNOTATION = f"{GROUP}/deleted-for"
# On a node: the fatal GPU XIDs the health monitor acted on ("<gpu>=<code>,..."), so that an operator restarted while
# the exporter still shows them does not cordon or replace again (policy/xid_memory.py). Remove it after a repair.
XID_HANDLED_ANNOTATION = f"{GROUP}/xid-handled"
# On a worker or spare pod: the spec it was created with, as the job's metadata.generation and a hash of the part
# baked into the pod (policy/spec_change.py), so that an edit the running workers do not see is reported.
SPEC_GENERATION_ANNOTATION = f"{GROUP}/spec-generation"
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
# On a worker or spare pod: where its checkpoints land (policy/checkpoint_sharing.checkpoint_location), so that the
# pods of a deleted job, still writing their emergency checkpoint while they stop, keep that place from another job.
CHECKPOINT_LOCATION_ANNOTATION = f"{GROUP}/checkpoint-location"
# On every worker and spare pod unless its template sets them: the node autoscalers' opt-outs from voluntary
# disruption (Karpenter's consolidation and drift of the node; Cluster Autoscaler's scale-down of it), since a worker
# moved away costs the job a restart and a spare moved away its warm start. The template's own value of either wins.
NO_VOLUNTARY_DISRUPTION_ANNOTATIONS = {"karpenter.sh/do-not-disrupt": "true",
                                       "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
# The operator's finalizer on a TrainingJob (kopf's persistence setting).
FINALIZER = f"{GROUP}/cleanup"
# Kueue's queue label: the job's own passes through to its pods.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kueue's pod-group metadata on the worker pods of a job with a queue (operator/scheduling_meta.py): the group's
# name (a label) and its total pod count (an annotation).
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
