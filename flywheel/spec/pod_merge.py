"""The worker pod = what the operator generates, merged with the job's pod template (`spec.template`). Pure.

The template's worker container (named `worker`, else the first; it is named `worker` in the pod) gets the
operator's image, command, env, mounts, resources, security context, ports and termination message on top of its
own fields: env, mounts, volumes and ports add to the operator's, resources and security contexts merge field by
field (the template's value wins where both set one; what the operator owns is refused before, by
flywheel/spec/pod_template.py). Every other container, init container and pod field passes through as given.
"""

from __future__ import annotations

import copy
from typing import Any

from flywheel.spec.pod_template import WORKER_CONTAINER, worker_index

DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
# Security profiles (the operator's --security-profile, the chart's securityProfile): hardened forces a non-root
# user, a read-only root filesystem and no capabilities; image runs the image as it was built (its user, a writable
# root), keeping only no privilege escalation and the runtime's seccomp profile.
WORKER_UID = 10001  # the Flywheel image's user (Dockerfile)
POD_SECURITY: dict[str, dict[str, Any]] = {
    "hardened": {"runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID, "fsGroup": WORKER_UID,
                 "seccompProfile": {"type": "RuntimeDefault"}},
    "image": {"seccompProfile": {"type": "RuntimeDefault"}},
}
CONTAINER_SECURITY: dict[str, dict[str, Any]] = {
    "hardened": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    "image": {"allowPrivilegeEscalation": False},
}
SECURITY_PROFILES = tuple(POD_SECURITY)


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base` field by field: nested mappings merge, anything else in `top` replaces."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = overlay(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def pod_security(profile: str, template_pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's securityContext: the profile's, overridden field by field by the template's. A template running
    as root (runAsUser: 0) without saying runAsNonRoot drops the profile's runAsNonRoot, which would only stop the
    container from starting."""
    theirs = template_pod.get("securityContext") or {}
    out = overlay(POD_SECURITY[profile], theirs)
    if theirs.get("runAsUser") == 0 and "runAsNonRoot" not in theirs:
        out.pop("runAsNonRoot", None)
    return out


def container_security(profile: str, template_worker: dict[str, Any], add_capabilities: tuple[str, ...]) -> dict[
        str, Any]:
    """The worker container's securityContext: the profile's, overridden by the template's, plus capabilities the
    job needs (IPC_LOCK for RDMA)."""
    out = overlay(CONTAINER_SECURITY[profile], template_worker.get("securityContext") or {})
    if add_capabilities:
        caps = out.setdefault("capabilities", {})
        caps["add"] = [*caps.get("add", []), *(c for c in add_capabilities if c not in caps.get("add", []))]
    return out


def root_is_read_only(container_ctx: dict[str, Any]) -> bool:
    """readOnlyRootFilesystem is a container field only (no pod-level default exists)."""
    return bool(container_ctx.get("readOnlyRootFilesystem"))


def merge_env(operator_env: dict[str, str], template_env: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's env (sorted by name) without the names the template sets, then the template's in its order,
    so that its $(VAR) references see the operator's values (the contract's names are refused before)."""
    theirs = {item.get("name") for item in template_env}
    ours = [{"name": k, "value": v} for k, v in sorted(operator_env.items()) if k not in theirs]
    return ours + copy.deepcopy(template_env)


def merge_lists(ours: list[Any], theirs: list[Any] | None) -> list[Any]:
    return [*ours, *copy.deepcopy(theirs or [])]


def merge_affinity(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Affinity terms of both: lists of terms add up, mappings merge (the template's scalars win)."""
    out = copy.deepcopy(ours)
    for key, value in theirs.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_affinity(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + copy.deepcopy(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_worker(generated: dict[str, Any], template_worker: dict[str, Any]) -> dict[str, Any]:
    """The worker container: the template's fields, then the operator's over them, with env, envFrom, mounts and
    ports adding up and resources merging per kind. `generated["env"]` is the operator's env as a mapping; its
    securityContext is already the merged one (container_security)."""
    out = copy.deepcopy(template_worker)
    for key, value in generated.items():
        if key == "env":
            out["env"] = merge_env(value, template_worker.get("env") or [])
        elif key in ("volumeMounts", "ports"):
            out[key] = merge_lists(value, template_worker.get(key))
        elif key == "resources":
            out[key] = overlay(value, template_worker.get("resources") or {})
        else:
            out[key] = copy.deepcopy(value)
    out["name"] = WORKER_CONTAINER
    if not out.get("resources"):
        out.pop("resources", None)
    return out


def merge_pod(pod: dict[str, Any], template: dict[str, Any], worker: dict[str, Any]) -> dict[str, Any]:
    """The worker pod: `pod` (the operator's, without containers) with the template's metadata and pod fields,
    and `worker` (merge_worker's) in the template's worker container's place."""
    out = copy.deepcopy(pod)
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    out["metadata"]["labels"] = {**(meta.get("labels") or {}), **out["metadata"]["labels"]}
    out["metadata"]["annotations"] = {**(meta.get("annotations") or {}), **out["metadata"]["annotations"]}
    ours = out["spec"]
    merged: dict[str, Any] = copy.deepcopy({k: v for k, v in spec.items() if k != "containers"})
    for key, value in ours.items():
        if key in ("volumes",):
            merged[key] = merge_lists(value, spec.get(key))
        elif key == "affinity":
            merged[key] = merge_affinity(value, spec.get("affinity") or {})
        elif key in ("schedulerName", "priorityClassName", "terminationGracePeriodSeconds") and key in spec:
            continue  # the template's (the spec's shorthands were checked to agree)
        else:
            merged[key] = value
    containers = copy.deepcopy(spec.get("containers") or [])
    index = worker_index(containers)
    if index is None:
        containers = [worker]
    else:
        containers[index] = worker
    merged["containers"] = containers
    if len(containers) > 1:
        out["metadata"]["annotations"].setdefault(DEFAULT_CONTAINER_ANNOTATION, WORKER_CONTAINER)
    out["spec"] = merged
    return out
