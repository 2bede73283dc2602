"""Pure builders: a TrainingJob + operator settings -> the headless Service and the worker Pods (plain dicts), and
the reverse: a worker Pod object -> the `PodView` the reconcile policy reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flywheel import object_store
from flywheel.labels import DELETED_FOR_ANNOTATION
from flywheel.labels import GENERATION_LABEL as GENERATION_LABEL  # re-exported: m.JOB_LABEL etc. in the operator
from flywheel.labels import INDEX_LABEL as INDEX_LABEL
from flywheel.labels import JOB_LABEL as JOB_LABEL
from flywheel.labels import QUEUE_LABEL as QUEUE_LABEL
from flywheel.operator.scheduling_meta import with_scheduling_meta
from flywheel.plan import Placement, WorkerPlan, plan_workers
from flywheel.plan import run_id as run_id  # re-exported: m.run_id in the operator
from flywheel.policy.reconcile import PodView
from flywheel.spec import TrainingJob
from flywheel.timefmt import parse_rfc3339

RDZV_PORT = 29400  # MASTER_PORT hint; with etcd-v3 the rendezvous publishes the real one
TERMINATION_GRACE_SECONDS = 30  # the trainer's emergency checkpoint after SIGTERM
WORKER_UID = 10001  # the image's user (Dockerfile)
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_ENV = "FLYWHEEL_TERMINATION_LOG"  # flywheel.trainer.termination_log.ENV
# Workers run with a read-only root filesystem: HOME and caches go to the /tmp volume.
WORKER_ENV_DEFAULTS = {"HOME": "/tmp", "XDG_CACHE_HOME": "/tmp/.cache"}
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


def service_name(job_name: str) -> str:
    return f"{job_name}-workers"


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


def worker_volumes(job: TrainingJob, settings: OperatorSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and mounts of a worker: the checkpoint dir (the job's claim, else an emptyDir), /dev/shm in memory,
    a writable /tmp (the root filesystem is read-only), and the operator's events claim when it has one."""
    ckpt = job.spec.checkpoint
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.spec.shm_size}},
        {"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}]
    # An object-store dir is staged in localDir: under /tmp (mounted above) unless it names another absolute path.
    local = object_store.local_dir(ckpt.dir, ckpt.local_dir)
    staged_in_tmp = object_store.is_url(ckpt.dir) and local.startswith("/tmp/")
    if local.startswith("/") and not staged_in_tmp:  # a relative dir lives under the working directory
        source = {"persistentVolumeClaim": {"claimName": ckpt.claim_name}} if ckpt.claim_name else {"emptyDir": {}}
        volumes.append({"name": "checkpoints", **source})
        mounts.append({"name": "checkpoints", "mountPath": local})
    if settings.events_claim and settings.events_dir:
        volumes.append({"name": "events", "persistentVolumeClaim": {"claimName": settings.events_claim}})
        mounts.append({"name": "events", "mountPath": settings.events_dir})
    return volumes, mounts


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


def pod(job: TrainingJob, worker: WorkerPlan, generation: int, settings: OperatorSettings) -> dict[str, Any]:
    spec = job.spec
    meta_labels = {**labels(job.name), INDEX_LABEL: str(worker.index), GENERATION_LABEL: str(generation)}
    job_labels = (job.metadata.model_extra or {}).get("labels") or {}
    queue = job_labels.get(QUEUE_LABEL) or spec.scheduling.queue  # Kueue: the job's own label passes through
    if queue:
        meta_labels[QUEUE_LABEL] = queue
    annotations: dict[str, str] = {}
    env = {**WORKER_ENV_DEFAULTS, **worker.env, TERMINATION_ENV: TERMINATION_MESSAGE_PATH}
    volumes, mounts = worker_volumes(job, settings)
    container: dict[str, Any] = {
        "name": "worker", "image": spec.image, "command": list(worker.argv),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": dict(spec.resources),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": mounts,
        # The worker writes why it exited (flywheel/trainer/termination_log.py); the kubelet keeps it in the pod's
        # state.terminated.message, or the log's tail when the worker could not write it.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH, "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    port = int(worker.env.get("FLYWHEEL_METRICS_PORT", "0"))
    if port:
        container["ports"] = [{"name": "metrics", "containerPort": port}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator decides restarts (policy/), the agent restarts ranks in place
        "hostname": worker.name, "subdomain": service_name(job.name),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {"runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID,
                            "fsGroup": WORKER_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }
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
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": worker.name, "namespace": job.metadata.namespace, "labels": meta_labels,
                        "annotations": annotations},
           "spec": pod_spec}
    return with_scheduling_meta(job, settings.gang_scheduler, obj)  # Kueue's pod group and admission gate


def pod_view(obj: dict[str, Any], lost_nodes: set[str], liveness_lost: bool = False) -> PodView | None:
    meta, status = obj["metadata"], obj.get("status") or {}
    try:
        index = int(meta["labels"][INDEX_LABEL])
        generation = int(meta["labels"].get(GENERATION_LABEL, "0"))
    except (KeyError, ValueError):
        return None
    reason, code, finished = status.get("reason"), None, None
    message, waiting_since = None, None
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" in state:
            reason, code = state["terminated"].get("reason") or reason, state["terminated"].get("exitCode")
            finished = parse_rfc3339(state["terminated"].get("finishedAt"))
            message = exit_message(state["terminated"].get("message"))
        elif "waiting" in state:
            reason = state["waiting"].get("reason") or reason
            message = state["waiting"].get("message") or None
            # Never started (restartPolicy Never): waiting since the kubelet took the pod (its startTime).
            if "lastState" not in cs or not (cs.get("lastState") or {}).get("terminated"):
                waiting_since = (parse_rfc3339(status.get("startTime"))
                                 or parse_rfc3339(meta.get("creationTimestamp")))
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conds.get("Ready", {}).get("status") == "True"
    sched = conds.get("PodScheduled", {})
    unsched = parse_rfc3339(sched.get("lastTransitionTime")) if sched.get("reason") == "Unschedulable" else None
    sched_message = (sched.get("message") or None) if unsched is not None else None
    target = conds.get("DisruptionTarget", {})  # preempted or evicted (Kubernetes 1.26+)
    disruption = str(target.get("reason") or "DisruptionTarget") if target.get("status") == "True" else None
    node = (obj.get("spec") or {}).get("nodeName")
    deleted_for = (meta.get("annotations") or {}).get(DELETED_FOR_ANNOTATION)
    deleting = parse_rfc3339(meta.get("deletionTimestamp"))  # graceful deletes stamp the end of the grace period
    if deleting is not None:
        deleting -= float(meta.get("deletionGracePeriodSeconds") or 0)
    return PodView(name=meta["name"], uid=meta["uid"], index=index, generation=generation,
                   phase=status.get("phase", "Pending"), ready=ready, deleting_since=deleting,
                   node_lost=bool(node) and node in lost_nodes, reason=reason, exit_code=code,
                   unschedulable_since=unsched, liveness_lost=liveness_lost, finished_at=finished,
                   message=message, waiting_since=waiting_since, disruption=disruption, deleted_for=deleted_for,
                   scheduler_message=sched_message)


def exit_message(text: str | None, limit: int = 500) -> str | None:
    """The reason a container gave for its exit: the last non-blank line of its termination message (the worker's
    one line, or the last line of the log tail the kubelet fell back to)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:limit] if lines else None


def lost_nodes(nodes: list[dict[str, Any]]) -> set[str]:
    out = set()
    for node in nodes:
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") != "True":
            out.add(node["metadata"]["name"])
    return out
