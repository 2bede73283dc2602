"""PriorityClass and RuntimeClass, and what the API server's admission does with a pod that names them, as
kube-apiserver's Priority and RuntimeClass admission plugins and the scheduling.k8s.io / node.k8s.io validation do.

- A pod's `priorityClassName` must name a PriorityClass (else 403 `no PriorityClass with name X was found`); the pod
  gets its `priority` and `preemptionPolicy`. A pod without one gets the `globalDefault` class (its name too), or
  priority 0 and `PreemptLowerPriority`. A `priority` or `preemptionPolicy` the pod sets itself must equal the
  class's (else 403). The two system classes exist from the start, as the API server's bootstrap creates them.
- A PriorityClass: `preemptionPolicy` defaults to `PreemptLowerPriority`; a value above 1e9 and a `system-` name
  other than the system classes are invalid; one `globalDefault` at most (403); value and preemptionPolicy are
  immutable.
- A pod's `runtimeClassName` must name a RuntimeClass (else 403 `pod rejected: RuntimeClass "X" not found`); its
  `overhead.podFixed` becomes the pod's `overhead` and its `scheduling` nodeSelector and tolerations are merged into
  the pod's (a conflicting nodeSelector value is a 403). A RuntimeClass needs a `handler` (a DNS label).

Not done: the scheduler neither orders by priority nor preempts, and the process kubelet runs every handler the same
way (docs/test-cluster.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceKey

PRIORITY_CLASSES: ResourceKey = ("scheduling.k8s.io", "priorityclasses")
RUNTIME_CLASSES: ResourceKey = ("node.k8s.io", "runtimeclasses")
HIGHEST_USER_PRIORITY = 1_000_000_000
DEFAULT_TOLERATION_SECONDS = 300
TOLERATED_BY_DEFAULT = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
SYSTEM_PRIORITY_CLASSES = {
    "system-cluster-critical": (2 * HIGHEST_USER_PRIORITY, "Used for system critical pods that must run in the "
                                "cluster, but can be moved to another node if necessary."),
    "system-node-critical": (2 * HIGHEST_USER_PRIORITY + 1000, "Used for system critical pods that must not be "
                             "moved from their current node."),
}
PREEMPTION_POLICIES = ("Never", "PreemptLowerPriority")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Objects = Callable[[ResourceKey], Iterable[dict[str, Any]]]  # every stored object of a (cluster-scoped) type


def system_priority_classes() -> list[dict[str, Any]]:
    """The PriorityClasses kube-apiserver creates at start."""
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
             "value": value, "description": description}
            for name, (value, description) in SYSTEM_PRIORITY_CLASSES.items()]


def _forbidden(plural: str, name: str, why: str) -> StatusError:
    return StatusError(403, "Forbidden", f'{plural} "{name}" is forbidden: {why}', {"name": name, "kind": plural})


def _named(objects: Objects, key: ResourceKey, name: str) -> dict[str, Any] | None:
    return next((o for o in objects(key) if o["metadata"]["name"] == name and
                 not o["metadata"].get("deletionTimestamp")), None)


def _default_priority_class(objects: Objects) -> dict[str, Any] | None:
    """The globalDefault class (the lowest-valued, should there be several)."""
    defaults = [o for o in objects(PRIORITY_CLASSES) if o.get("globalDefault")]
    return min(defaults, key=lambda o: int(o.get("value", 0)), default=None)


def admit_pod(pod: dict[str, Any], objects: Objects) -> None:
    """The Priority, DefaultTolerationSeconds and RuntimeClass plugins, in kube-apiserver's order, on a pod being
    created (mutating `pod`; StatusError 403 to refuse)."""
    name, spec = pod["metadata"].get("name", ""), pod.setdefault("spec", {})
    _admit_priority(name, spec, objects)
    add_default_tolerations(spec)
    _admit_runtime_class(name, spec, objects)


def add_default_tolerations(spec: dict[str, Any]) -> None:
    """DefaultTolerationSeconds: a pod without a toleration of `node.kubernetes.io/not-ready` or `.../unreachable`
    with effect NoExecute (an empty key or effect counts) gets one of each, for 300 s (the taint manager then evicts
    it from a node that stays not ready or unreachable that long: taint_eviction.py)."""
    tolerations = list(spec.get("tolerations") or [])
    for key in TOLERATED_BY_DEFAULT:
        if not any(t.get("key", "") in ("", key) and t.get("effect", "") in ("", "NoExecute") for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})
    spec["tolerations"] = tolerations


def _admit_priority(name: str, spec: dict[str, Any], objects: Objects) -> None:
    class_name = spec.get("priorityClassName") or ""
    if class_name:
        found = _named(objects, PRIORITY_CLASSES, class_name)
        if found is None:
            raise _forbidden("pods", name, f"no PriorityClass with name {class_name} was found")
    else:
        found = _default_priority_class(objects)
        if found is not None:
            spec["priorityClassName"] = found["metadata"]["name"]
    priority = int(found.get("value", 0)) if found is not None else 0
    policy = (found or {}).get("preemptionPolicy") or "PreemptLowerPriority"
    if spec.get("priority") is not None and int(spec["priority"]) != priority:
        raise _forbidden("pods", name, f"the integer value of priority ({spec['priority']}) must not be provided in "
                         f"pod spec; priority admission controller computed {priority} from the given PriorityClass "
                         "name")
    if spec.get("preemptionPolicy") is not None and spec["preemptionPolicy"] != policy:
        raise _forbidden("pods", name, f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must not "
                         f"be provided in pod spec; priority admission controller computed {policy} from the given "
                         "PriorityClass name")
    spec["priority"], spec["preemptionPolicy"] = priority, policy


def _admit_runtime_class(name: str, spec: dict[str, Any], objects: Objects) -> None:
    class_name = spec.get("runtimeClassName")
    if not class_name:
        return
    found = _named(objects, RUNTIME_CLASSES, class_name)
    if found is None:
        raise _forbidden("pods", name, f'pod rejected: RuntimeClass "{class_name}" not found')
    fixed = (found.get("overhead") or {}).get("podFixed")
    if fixed:
        if spec.get("overhead") and spec["overhead"] != fixed:
            raise _forbidden("pods", name, "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined "
                             "Overhead")
        spec["overhead"] = fixed
    elif spec.get("overhead"):
        raise _forbidden("pods", name, "pod rejected: Pod Overhead set without corresponding RuntimeClass defined "
                         "Overhead")
    scheduling = found.get("scheduling") or {}
    selector = dict(spec.get("nodeSelector") or {})
    for key, want in (scheduling.get("nodeSelector") or {}).items():
        if key in selector and selector[key] != want:
            raise _forbidden("pods", name, f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {want}; "
                             f"pod.spec.nodeSelector[{key}] = {selector[key]}")
        selector[key] = want
    if selector:
        spec["nodeSelector"] = selector
    tolerations = list(spec.get("tolerations") or [])
    tolerations += [t for t in scheduling.get("tolerations") or [] if t not in tolerations]
    if tolerations:
        spec["tolerations"] = tolerations


def admit_priority_class(obj: dict[str, Any], old: dict[str, Any] | None, objects: Objects) -> list[str]:
    """Defaults and validation of a PriorityClass being created (`old` None) or updated: the field errors (422);
    StatusError 403 for a second globalDefault."""
    name = obj["metadata"]["name"]
    obj.setdefault("value", 0)
    obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    errors = []
    value = obj["value"]
    if not isinstance(value, int) or isinstance(value, bool):
        errors.append(f'value: Invalid value: "{value}": must be an integer')
    elif name.startswith("system-"):
        known = SYSTEM_PRIORITY_CLASSES.get(name)
        if known is None or known[0] != value or obj.get("globalDefault"):
            why = f"{name} is not a known system priority class" if known is None else \
                f"value of {name} PriorityClass must be {known[0]}" if known[0] != value else \
                f"globalDefault must be false for {name} PriorityClass"
            errors.append("metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for "
                          f"system use only. error: {why}")
    elif value > HIGHEST_USER_PRIORITY:
        errors.append(f"value: Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}")
    if obj["preemptionPolicy"] not in PREEMPTION_POLICIES:
        errors.append(f'preemptionPolicy: Unsupported value: "{obj["preemptionPolicy"]}": supported values: '
                      '"Never", "PreemptLowerPriority"')
    if old is not None and obj["value"] != old.get("value"):
        errors.append("value: Forbidden: may not be changed in an update.")
    if old is not None and obj["preemptionPolicy"] != old.get("preemptionPolicy"):
        errors.append(f'preemptionPolicy: Invalid value: "{obj["preemptionPolicy"]}": field is immutable')
    if not errors and obj.get("globalDefault"):
        other = next((o for o in objects(PRIORITY_CLASSES) if o.get("globalDefault") and
                      o["metadata"]["name"] != name), None)
        if other is not None:
            raise _forbidden("priorityclasses.scheduling.k8s.io", name, f"PriorityClass {other['metadata']['name']} "
                             "is already marked as default. Only one default can exist")
    return errors


def admit_runtime_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    """Validation of a RuntimeClass: `handler` is a required DNS label, immutable."""
    handler = obj.get("handler")
    if not handler:
        return ["handler: Required value"]
    if not _DNS_LABEL.match(str(handler)) or len(str(handler)) > 63:
        return [f'handler: Invalid value: "{handler}": a lowercase RFC 1123 label must consist of lower case '
                "alphanumeric characters or '-', and must start and end with an alphanumeric character"]
    if old is not None and old.get("handler") != handler:
        return [f'handler: Invalid value: "{handler}": field is immutable']
    return []
