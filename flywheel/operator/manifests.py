"""Pure builders: a TrainingJob + operator settings -> the headless Service and the worker Pods (plain dicts). The
reverse, a worker Pod object -> the `PodView` the reconcile policy reads, is the observer's (observe.py)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flywheel.contracts.labels import (
    CHECKPOINT_LOCATION_ANNOTATION,
    NO_VOLUNTARY_DISRUPTION_ANNOTATIONS,
    ROLE_WORKER,
    SPEC_GENERATION_ANNOTATION,
    SPEC_HASH_ANNOTATION,
)
from flywheel.contracts.labels import (
    GENERATION_LABEL as GENERATION_LABEL,  # re-exported: m.JOB_LABEL etc. in the operator
)
from flywheel.contracts.labels import INDEX_LABEL as INDEX_LABEL
from flywheel.contracts.labels import JOB_LABEL as JOB_LABEL
from flywheel.contracts.labels import QUEUE_LABEL as QUEUE_LABEL
from flywheel.contracts.labels import ROLE_LABEL as ROLE_LABEL
from flywheel.operator.drain import DEFAULT_DRAIN_TAINT_KEYS
from flywheel.operator.scheduling_meta import with_scheduling_meta
from flywheel.policy.checkpoint_sharing import checkpoint_location
from flywheel.policy.spec_change import baked_spec_hash
from flywheel.spec import KIND, TrainingJob
from flywheel.spec import storage as object_store
from flywheel.spec.object_names import service_name as service_name  # re-exported: m.service_name in the operator
from flywheel.spec.pod import template_resources
from flywheel.spec.pod_merge import WORKER_UID as WORKER_UID
from flywheel.spec.pod_merge import container_security, merge_pod, merge_worker, pod_security, root_is_read_only
from flywheel.spec.pod_template import CACHE_HOME, METRICS_PORT, worker_container
from flywheel.worker_plan import Placement, WorkerPlan, plan_workers
from flywheel.worker_plan import run_id as run_id  # re-exported: m.run_id in the operator

RDZV_PORT = 29400  # MASTER_PORT hint; with etcd-v3 the rendezvous publishes the real one
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_ENV = "FLYWHEEL_TERMINATION_LOG"  # flywheel.contracts.termination_log.ENV
# With a read-only root filesystem, HOME and the caches go to the cache-home volume (the template's env overrides).
WORKER_ENV_DEFAULTS = {"HOME": CACHE_HOME, "XDG_CACHE_HOME": f"{CACHE_HOME}/.cache",
                       "TRITON_CACHE_DIR": f"{CACHE_HOME}/.triton/cache",
                       "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_HOME}/.cache/torchinductor"}
WORKER_LAUNCHER = ("python", "-m", "flywheel.cli", "launch")


@dataclass(frozen=True)
class OperatorSettings:
    etcd_endpoints: str
    events_dir: str = ""  # shared with the workers; "" = no event log (no step/checkpoint in status)
    events_claim: str = ""  # the PVC holding events_dir, mounted there in every worker ("" = nothing mounted)
    metrics_port_base: int = 9400
    worker_env: tuple[tuple[str, str], ...] = ()  # extra env for every worker (e.g. OMP_NUM_THREADS=1)
    gang_scheduler: str = "none"  # none | scheduler-plugins | volcano: which PodGroup to create for gang jobs
    worker_liveness: bool = True  # watch the workers' etcd lease keys; off: dead workers seen by pod/node status only
    hang_detection: bool = True  # report a job with no step in its etcd progress as hung (no Prometheus needed)
    security_profile: str = "hardened"  # hardened | image (pod_merge.SECURITY_PROFILES): the workers' default context
    rdma_resource: str = "rdma/rdma_shared_device_a"  # what `network: rdma` requests (one per worker)
    # Drain ahead (operator/drain.py): taints (NoSchedule/NoExecute) whose key means the node is leaving.
    drain_taint_keys: tuple[str, ...] = DEFAULT_DRAIN_TAINT_KEYS
    disruption_budgets: bool = True  # a PodDisruptionBudget per job (`disruption_budget`): evictions wait


def labels(job_name: str) -> dict[str, str]:
    return {JOB_LABEL: job_name}


def plan(job: TrainingJob, uid: str, settings: OperatorSettings, events_file: str | None) -> list[WorkerPlan]:
    spec, ns = job.spec, job.metadata.namespace
    extra = dict(settings.worker_env)
    extra["PET_RDZV_ID"] = run_id(job, uid)
    placement = Placement(
        replicas=spec.replicas.desired, rdzv_backend="etcd-v3", rdzv_endpoint=settings.etcd_endpoints,
        master_addr=f"{job.name}-worker-0.{service_name(job.name)}.{ns}.svc", master_port=RDZV_PORT,
        checkpoint_dir=spec.checkpoint.dir, launcher=WORKER_LAUNCHER, metrics_port_base=settings.metrics_port_base,
        per_worker_metrics_port=False, events_file=events_file, extra_env=extra,
        hostname_suffix=f".{service_name(job.name)}.{ns}.svc")
    return plan_workers(job, placement)


# Gang scheduling: the PodGroup kind of each supported scheduler, how pods name their group, default scheduler.
GANG = {
    "scheduler-plugins": {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "plural": "podgroups",
                          "label": "scheduling.x-k8s.io/pod-group", "scheduler": "scheduler-plugins-scheduler"},
    "volcano": {"apiVersion": "scheduling.volcano.sh/v1beta1", "plural": "podgroups",
                "annotation": "scheduling.k8s.io/group-name", "scheduler": "volcano"},
}


def gang(job: TrainingJob, settings: OperatorSettings) -> dict[str, str] | None:
    if settings.gang_scheduler == "none" or not job.spec.scheduling.gang:
        return None
    return GANG[settings.gang_scheduler]


def pod_group(job: TrainingJob, settings: OperatorSettings) -> dict[str, Any] | None:
    """The PodGroup that makes the scheduler place at least `replicas.min` workers together, or None."""
    kind = gang(job, settings)
    if kind is None:
        return None
    spec: dict[str, Any] = {"minMember": job.spec.replicas.min}
    if settings.gang_scheduler == "volcano" and job.spec.scheduling.queue:
        spec["queue"] = job.spec.scheduling.queue
    if settings.gang_scheduler == "scheduler-plugins":
        spec["scheduleTimeoutSeconds"] = int(max(job.spec.fault_tolerance.node_failure_grace_seconds, 10))
    return {"apiVersion": kind["apiVersion"], "kind": "PodGroup",
            "metadata": {"name": job.name, "namespace": job.metadata.namespace, "labels": labels(job.name)},
            "spec": spec}


def service(job: TrainingJob) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service_name(job.name), "namespace": job.metadata.namespace,
                         "labels": labels(job.name)},
            "spec": {"clusterIP": "None", "selector": labels(job.name), "publishNotReadyAddresses": True,
                     "ports": [{"name": "rdzv", "port": RDZV_PORT}]}}


def disruption_budget(job: TrainingJob) -> dict[str, Any]:
    """The job's PodDisruptionBudget: no voluntary eviction (`kubectl drain`, a node upgrade, an autoscaler) takes a
    healthy worker, so a drain waits while the operator moves the workers ahead (its cordon is drain ahead's
    trigger: docs/operator.md) and deletes them itself, which no budget holds up. An integer `minAvailable` of
    `replicas.max` -- never below the healthy workers -- needs no scale lookup (the scale subresource's
    `replicas.target` is often unset, and the disruption controller then fails); a worker not Ready (crash loop,
    still starting) may always go (`AlwaysAllow`), so a broken pod never blocks a drain. Spares are not covered."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": job.name, "namespace": job.metadata.namespace, "labels": labels(job.name)},
            "spec": {"minAvailable": job.spec.replicas.max, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                     "selector": {"matchLabels": {**labels(job.name), ROLE_LABEL: ROLE_WORKER}}}}


def worker_volumes(job: TrainingJob, settings: OperatorSettings, cache_home: bool = True) -> tuple[
        list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and mounts of a worker: the checkpoint dir (the job's claim, else an emptyDir), /dev/shm in memory,
    a writable /tmp, a writable home for the caches when the root filesystem is read-only, and the operator's
    events claim when it has one."""
    ckpt = job.spec.checkpoint
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.spec.shm_size}},
        {"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}]
    if cache_home:
        volumes.append({"name": "cache-home", "emptyDir": {}})
        mounts.append({"name": "cache-home", "mountPath": CACHE_HOME})
    # An object-store dir is staged in localDir: under /tmp (mounted above) unless it names another absolute path.
    local = object_store.local_dir(ckpt.dir, ckpt.local_dir)
    staged_in_tmp = object_store.is_url(ckpt.dir) and local.startswith("/tmp/")
    if local.startswith("/") and not staged_in_tmp:  # a relative dir lives under the working directory
        source = {"persistentVolumeClaim": {"claimName": ckpt.claim_name}} if ckpt.claim_name else {"emptyDir": {}}
        volumes.append({"name": "checkpoints", **source})
        mounts.append({"name": "checkpoints", "mountPath": local, **claim_sub_path(local, ckpt.claim_name)})
    if settings.events_claim and settings.events_dir:
        volumes.append({"name": "events", "persistentVolumeClaim": {"claimName": settings.events_claim}})
        mounts.append({"name": "events", "mountPath": settings.events_dir})
    return volumes, mounts


def claim_sub_path(directory: str, claim_name: str) -> dict[str, str]:
    """Where `directory` lives on its claim: the folder of that path (`/ckpt/a` -> `ckpt/a`), so jobs sharing one
    claim keep their checkpoints apart (mounted at its root, every job would see, resume from and prune the others'
    step folders), and a job naming another's dir resumes from it. The kubelet creates a missing folder with the
    permissions of the claim's root. No claim: the emptyDir is the job's own (no subPath)."""
    if not claim_name:
        return {}
    sub = posixpath.normpath(directory).lstrip("/")
    return {"subPath": sub} if sub else {}


def topology_affinity(job: TrainingJob) -> dict[str, Any] | None:
    """`scheduling.topologyKey` (e.g. `topology.kubernetes.io/zone` or a rack label): every worker pod of the job in
    one topology domain, by pod affinity to the job's own label. Required for gang jobs (they start and run only
    together, so a worker outside the domain would drag the whole job over the slow link), preferred (weight 100)
    otherwise. The scheduler places the first pod anywhere (a pod matching its own affinity term may start a
    domain); later ones, replacements after a restart included, join the domain of the job's pods. Ranks are
    row-major by replica index (worker i holds ranks i x procsPerReplica ... (i + 1) x procsPerReplica - 1), so tp
    groups stay inside a worker and pp and dp run across workers, all of them inside the domain."""
    key = job.spec.scheduling.topology_key
    if not key:
        return None
    term = {"labelSelector": {"matchLabels": labels(job.name)}, "topologyKey": key}
    if job.spec.scheduling.gang:
        return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term}]}}


def worker_security(job: TrainingJob, settings: OperatorSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's and the worker container's securityContext: the operator's profile, the template's overrides
    field by field, IPC_LOCK for `network: rdma`."""
    template_pod = job.spec.template.get("spec") or {}
    caps = ("IPC_LOCK",) if job.spec.network == "rdma" else ()
    return (pod_security(settings.security_profile, template_pod),
            container_security(settings.security_profile, worker_container(job.spec.template), caps))


def worker_resources(job: TrainingJob, settings: OperatorSettings) -> dict[str, Any]:
    """spec.resources with procsPerReplica of the accelerator and one RDMA device (`network: rdma`); the
    template's worker resources merge over these (pod_merge.merge_worker)."""
    resources = template_resources(job.spec.pod_view())
    if job.spec.network == "rdma":
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})[settings.rdma_resource] = "1"
    return resources


def pod(job: TrainingJob, worker: WorkerPlan, generation: int, settings: OperatorSettings) -> dict[str, Any]:
    """The worker pod: the operator's container and pod fields merged with `spec.template` (spec/pod_merge.py)."""
    spec = job.spec
    pod_ctx, container_ctx = worker_security(job, settings)
    read_only = root_is_read_only(container_ctx)
    env = {**(WORKER_ENV_DEFAULTS if read_only else {}), **worker.env, TERMINATION_ENV: TERMINATION_MESSAGE_PATH}
    volumes, mounts = worker_volumes(job, settings, cache_home=read_only)
    template_worker = worker_container(spec.template)
    container: dict[str, Any] = {
        "name": "worker", "image": template_worker.get("image") or spec.image, "command": list(worker.argv),
        "env": env, "resources": worker_resources(job, settings), "securityContext": container_ctx,
        "volumeMounts": mounts,
        # The worker writes why it exited (flywheel/contracts/termination_log.py); the kubelet keeps it in the pod's
        # state.terminated.message, or the log's tail when the worker could not write it.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH, "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    port = int(worker.env.get("FLYWHEEL_METRICS_PORT", "0"))
    if port:
        container["ports"] = [{"name": METRICS_PORT, "containerPort": port}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator decides restarts (policy/), the agent restarts ranks in place
        "hostname": worker.name, "subdomain": service_name(job.name),
        "terminationGracePeriodSeconds": spec.fault_tolerance.termination_grace_seconds,
        "securityContext": pod_ctx, "volumes": volumes,
    }
    meta_labels, annotations, scheduling = pod_scheduling(job, worker, generation, settings)
    annotations.update(spec_annotations(job))
    metadata = {"name": worker.name, "namespace": job.metadata.namespace, "labels": meta_labels,
                "annotations": annotations}
    base = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {**pod_spec, **scheduling}}
    merged = merge_pod(base, spec.template, merge_worker(container, template_worker))
    for key, value in NO_VOLUNTARY_DISRUPTION_ANNOTATIONS.items():  # after the template's: its own value wins
        merged["metadata"]["annotations"].setdefault(key, value)
    return with_scheduling_meta(job, settings.gang_scheduler, merged)  # Kueue's pod group and admission gate


def pod_scheduling(job: TrainingJob, worker: WorkerPlan, generation: int, settings: OperatorSettings) -> tuple[
        dict[str, str], dict[str, str], dict[str, Any]]:
    """The worker pod's labels and annotations (gang and queue included) and its pod fields from spec.scheduling
    (affinity, schedulerName, priorityClassName)."""
    spec = job.spec
    pod_spec: dict[str, Any] = {}
    meta_labels = {**labels(job.name), INDEX_LABEL: str(worker.index), GENERATION_LABEL: str(generation),
                   ROLE_LABEL: ROLE_WORKER}
    job_labels = (job.metadata.model_extra or {}).get("labels") or {}
    queue = job_labels.get(QUEUE_LABEL) or spec.scheduling.queue  # Kueue: the job's own label passes through
    if queue:
        meta_labels[QUEUE_LABEL] = queue
    annotations: dict[str, str] = {}
    affinity = topology_affinity(job)
    if affinity:
        pod_spec["affinity"] = affinity
    kind = gang(job, settings)
    if kind is not None:
        if "label" in kind:
            meta_labels[kind["label"]] = job.name
        else:
            annotations[kind["annotation"]] = job.name
    scheduler = spec.scheduling.scheduler_name or (kind["scheduler"] if kind else "")
    for key, value in (("schedulerName", scheduler),
                       ("priorityClassName", spec.scheduling.priority_class_name)):
        if value:
            pod_spec[key] = value
    return meta_labels, annotations, pod_spec


def spec_annotations(job: TrainingJob) -> dict[str, str]:
    """The spec a pod is created with: the job's metadata.generation (when known) and the baked part's hash; and
    where its checkpoints land, when another job could share that place (policy/checkpoint_sharing.py)."""
    out = {SPEC_HASH_ANNOTATION: baked_spec_hash(job.spec)}
    spec_generation = (job.metadata.model_extra or {}).get("generation")
    if spec_generation is not None:
        out[SPEC_GENERATION_ANNOTATION] = str(spec_generation)
    checkpoint = job.spec.checkpoint
    location = checkpoint_location(job.metadata.namespace, checkpoint.dir, checkpoint.claim_name)
    if location is not None:
        out[CHECKPOINT_LOCATION_ANNOTATION] = location
    return out


def owner_job_uid(pod: Mapping[str, Any]) -> str:
    """The uid of the TrainingJob that owns a pod ("" for none: orphaned)."""
    owners = pod.get("metadata", {}).get("ownerReferences") or []
    return next((str(o.get("uid") or "") for o in owners if o.get("kind") == KIND), "")


def lost_nodes(nodes: list[dict[str, Any]]) -> set[str]:
    out = set()
    for node in nodes:
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") != "True":
            out.add(node["metadata"]["name"])
    return out
