"""`spec.template`: the checks on a TrainingJob's pod template (a core/v1 PodTemplateSpec as a plain dict).

The template passes through to every worker pod (flywheel/spec/pod_merge.py merges it with what the operator generates);
what the operator owns is refused here, each with the field and the fix, so that `flywheel plan`/`run` and the
operator's `Invalid` condition say the same. The CRD's schema checks the template's shape; these checks are the
worker contract's. Pure functions over plain data; no pydantic, no Kubernetes client.
"""

from __future__ import annotations

import re
from typing import Any

from flywheel.contracts.labels import (
    GENERATION_LABEL,
    INDEX_LABEL,
    JOB_LABEL,
    POD_GROUP_LABEL,
    POD_GROUP_TOTAL_ANNOTATION,
    QUEUE_LABEL,
    ROLE_LABEL,
)

WORKER_CONTAINER = "worker"
METRICS_PORT = "metrics"  # the name of the worker container's metrics port (operator/manifests.py pod())
# The operator's own volumes (operator/manifests.py worker_volumes) and where it mounts them besides the checkpoint
# dir: a template may add volumes and mounts, not replace these.
OPERATOR_VOLUMES = ("dshm", "tmp", "cache-home", "checkpoints", "events")
# The writable home of a worker whose root filesystem is read-only (the Flywheel image's own HOME): HOME and the
# caches (XDG, Triton, TorchInductor) point into it.
CACHE_HOME = "/home/flywheel"
OPERATOR_MOUNT_PATHS = ("/dev/shm", "/tmp", CACHE_HOME)
# Env of the worker contract (docs/contracts.md): torch elastic's and Flywheel's, set per worker by the operator.
CONTRACT_ENV = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|"
                          r"MASTER_[A-Z0-9_]*|PET_[A-Z0-9_]*|TORCHELASTIC_[A-Z0-9_]*|FLYWHEEL_[A-Z0-9_]*)$")
OPERATOR_LABELS = (JOB_LABEL, INDEX_LABEL, GENERATION_LABEL, ROLE_LABEL)
# Pod fields the operator sets on every worker: field -> (why, fix). Refused here and, at apply time, by the CRD's
# CEL rules (spec/crd/generate.py TEMPLATE_RULES), both in owned_field_problem's words.
OWNED_POD_FIELDS = {
    "restartPolicy": ("the operator decides restarts (always Never on the pod)",
                      "use spec.faultTolerance (maxRestarts, restartScope)"),
    "hostname": ("the operator names each worker for the rendezvous", "remove it (workers are <job>-worker-<index>)"),
    "subdomain": ("the operator puts workers under the job's headless Service",
                  "remove it (the Service is <job>-workers)"),
}
# Kueue's pod-group metadata (labels, or annotations, which Kueue also reads): on a template it would give every
# worker pod its own queue or group, so Kueue would admit the workers as separate workloads (or never, with a total
# count that is not the job's). The operator sets it from spec.scheduling.queue (operator/scheduling_meta.py).
# Refused here and by CEL (spec/crd/generate.py TEMPLATE_RULES), both in kueue_key_problem's words.
KUEUE_KEYS = (QUEUE_LABEL, POD_GROUP_LABEL, POD_GROUP_TOTAL_ANNOTATION)
METADATA_MAPS = ("labels", "annotations")


def owned_field_problem(key: str) -> str:
    """The refusal of template.spec.<key>, an OWNED_POD_FIELDS field."""
    why, fix = OWNED_POD_FIELDS[key]
    return f"template.spec.{key}: {why}; {fix}"


def kueue_key_problem(where: str, key: str) -> str:
    """The refusal of template.metadata.<where>.<key>, where is labels or annotations and key one of KUEUE_KEYS."""
    return (f"template.metadata.{where}.{key}: Kueue would admit the worker pods as separate workloads; remove it "
            "and set spec.scheduling.queue (the operator gives every worker the job's pod-group metadata)")


def worker_index(containers: list[Any]) -> int | None:
    """The template's worker container: the one named `worker`, else the first; None when there is none."""
    for i, c in enumerate(containers):
        if isinstance(c, dict) and c.get("name") == WORKER_CONTAINER:
            return i
    return 0 if containers else None


def worker_container(template: dict[str, Any]) -> dict[str, Any]:
    """The template's worker container (a copy-free view; {} when the template has none)."""
    containers = (template.get("spec") or {}).get("containers") or []
    index = worker_index(containers)
    return containers[index] if index is not None else {}


def template_problems(template: dict[str, Any], checkpoint_dir: str, events_dir: str = "") -> list[str]:
    """Every problem of a pod template, each "template.<path>: what; fix" (paths relative to spec)."""
    if not template:
        return []
    problems = [f"template.{key}: a pod template has only metadata and spec; remove {key}"
                for key in template if key not in ("metadata", "spec")]
    problems += _metadata_problems(template.get("metadata"))
    pod = template.get("spec")
    if pod is None:
        return problems
    if not isinstance(pod, dict):
        return [*problems, "template.spec: expected a pod spec mapping"]
    problems += [owned_field_problem(key) for key in OWNED_POD_FIELDS if key in pod]
    problems += _volume_problems(pod.get("volumes"))
    containers = pod.get("containers") or []
    if not isinstance(containers, list) or not all(isinstance(c, dict) for c in containers):
        return [*problems, "template.spec.containers: expected a list of containers"]
    index = worker_index(containers)
    if index is not None:
        problems += _worker_problems(containers[index], f"template.spec.containers[{index}]",
                                     (checkpoint_dir, events_dir))
    return problems


def _metadata_problems(meta: Any) -> list[str]:
    if meta is None:
        return []
    if not isinstance(meta, dict):
        return ["template.metadata: expected a mapping with labels and annotations"]
    problems = [f"template.metadata.{key}: the operator names the worker pods; keep only labels and annotations"
                for key in meta if key not in ("labels", "annotations")]
    labels = meta.get("labels") or {}
    problems += [f"template.metadata.labels.{key}: the operator sets this label on every worker; remove it"
                 for key in labels if key in OPERATOR_LABELS]
    problems += [kueue_key_problem(where, key) for where in METADATA_MAPS for key in KUEUE_KEYS
                 if key in (meta.get(where) or {})]
    return problems


def _volume_problems(volumes: Any) -> list[str]:
    # The operator's volume names are refused by flywheel/spec/pod_rules/rules.py, with the Pod API's rules on volumes.
    if volumes is None or isinstance(volumes, list):
        return []
    return ["template.spec.volumes: expected a list of volumes"]


def _worker_problems(container: dict[str, Any], path: str, operator_paths: tuple[str, str]) -> list[str]:
    problems = [f"{path}.{key}: the operator runs `flywheel launch` in the worker container; put your entrypoint "
                "in spec.command instead" for key in ("command", "args") if key in container]
    for i, item in enumerate(container.get("env") or []):
        name = item.get("name", "") if isinstance(item, dict) else ""
        if CONTRACT_ENV.match(name):
            problems.append(f"{path}.env[{i}].name: {name} belongs to the worker contract (set per worker by the "
                            "operator); remove it or rename yours")
    reserved_paths = {*OPERATOR_MOUNT_PATHS, *(p.rstrip("/") for p in operator_paths if p.startswith("/"))}
    for i, mount in enumerate(container.get("volumeMounts") or []):
        if not isinstance(mount, dict):
            continue
        if mount.get("name") in OPERATOR_VOLUMES:
            problems.append(f"{path}.volumeMounts[{i}].name: {mount['name']!r} is a volume the operator mounts; "
                            "mount your own volume")
        elif str(mount.get("mountPath", "")).rstrip("/") in reserved_paths:
            problems.append(f"{path}.volumeMounts[{i}].mountPath: the operator mounts {mount['mountPath']}; "
                            "mount yours elsewhere (checkpoints: spec.checkpoint.claimName)")
    return problems


def resource_quantity(resources: dict[str, Any], kind: str, name: str) -> Any:
    """resources[kind][name] of a container's resources mapping, or None."""
    return ((resources or {}).get(kind) or {}).get(name)
