"""The test cluster's scheduler filters, as pure functions over Node and Pod objects, in kube-scheduler's order
(NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit): a cordoned node, an untolerated
NoSchedule/NoExecute taint, a nodeSelector or required node affinity that does not match, or too few of an
extended resource (e.g. `nvidia.com/gpu`: the sum of the requests of the node's unfinished pods against its
allocatable count) rule a node out. When none is left, `unschedulable_message` says why in the scheduler's words,
which a pod's PodScheduled=False/Unschedulable condition and its FailedScheduling event carry.

cpu and memory are not counted (every node of the test cluster is the same host): only extended resources, those
whose name has a domain (`vendor/name`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
UNREACHABLE_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"


def tolerates(tolerations: Iterable[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """A toleration matches a taint as core/v1's ToleratesTaint says: an empty effect matches every effect, an
    empty key (with Exists) every key; Exists ignores the value, Equal (the default) compares it."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("key") and toleration["key"] != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists" or \
                (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated_taint(pod: dict[str, Any], taints: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    return next((t for t in taints if t.get("effect") in BLOCKING_EFFECTS and not tolerates(tolerations, t)), None)


def _expression_matches(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator, values = expression.get("key", ""), expression.get("operator", ""), expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and values:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(term: dict[str, Any], node: dict[str, Any]) -> bool:
    """One nodeSelectorTerm: all its matchExpressions (labels) and matchFields (metadata.name); an empty term
    matches nothing, as in Kubernetes."""
    labels = node["metadata"].get("labels") or {}
    expressions, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if not expressions and not fields:
        return False
    return all(_expression_matches(e, labels) for e in expressions) and \
        all(_expression_matches(f, {"metadata.name": node["metadata"]["name"]}) for f in fields)


def matches_node_affinity(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    """nodeSelector (every pair) and the required node affinity (any of its terms)."""
    spec, labels = pod.get("spec") or {}, node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(_term_matches(term, node) for term in required.get("nodeSelectorTerms") or [])


def _extended(resources: dict[str, Any]) -> Counter[str]:
    """Extended-resource requests of one container (a missing request defaults to the limit)."""
    amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return Counter({name: int(str(value)) for name, value in amounts.items() if "/" in name})


def pod_requests(pod: dict[str, Any]) -> Counter[str]:
    """The pod's extended-resource requests: its containers' sum, or its largest init container's if larger."""
    spec = pod.get("spec") or {}
    total: Counter[str] = Counter()
    for container in spec.get("containers") or []:
        total.update(_extended(container.get("resources") or {}))
    for init in spec.get("initContainers") or []:
        for name, amount in _extended(init.get("resources") or {}).items():
            total[name] = max(total[name], amount)
    return total


def in_use(node_name: str, pods: Iterable[dict[str, Any]]) -> Counter[str]:
    used: Counter[str] = Counter()
    for other in pods:
        if (other.get("spec") or {}).get("nodeName") == node_name and \
                (other.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            used.update(pod_requests(other))
    return used


def node_misfit(pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]]) -> str | None:
    """Why `node` cannot take `pod` (the first failing filter's reason), or None when it can."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "node(s) were unschedulable"
    taint = untolerated_taint(pod, spec.get("taints") or [])
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint.get('key', '')}: {taint.get('value') or ''}}}"
    if not matches_node_affinity(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used = in_use(node["metadata"]["name"], pods)
    for name, amount in sorted(pod_requests(pod).items()):
        if amount and used[name] + amount > int(str(allocatable.get(name, "0"))):
            return f"Insufficient {name}"
    return None


def _histogram(reasons: Iterable[str]) -> str:
    return ", ".join(sorted(f"{count} {reason}" for reason, count in Counter(reasons).items()))


def unschedulable_message(misfits: dict[str, str]) -> str:
    """The scheduler's FitError text for per-node reasons, e.g. `0/2 nodes are available: 2 node(s) had
    untolerated taint {nvidia.com/gpu: }. preemption: 0/2 nodes are available: 2 Preemption is not helpful for
    scheduling.` Only a lack of resources could be helped by preempting other pods."""
    total = len(misfits)
    preemption = [NO_VICTIMS if reason.startswith("Insufficient ") else NOT_HELPFUL for reason in misfits.values()]
    return (f"0/{total} nodes are available: {_histogram(misfits.values())}. "
            f"preemption: 0/{total} nodes are available: {_histogram(preemption)}.")


def feasible_nodes(pod: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                   lost: set[str]) -> tuple[list[str], dict[str, str]]:
    """(names of the nodes that can take the pod, reason per node that cannot). A lost node (no heartbeats) is
    treated as carrying the unreachable taint the node lifecycle controller gives it."""
    fit, misfits = [], {}
    for node in nodes:
        name = node["metadata"]["name"]
        if name in lost:
            misfits[name] = f"node(s) had untolerated taint {{{UNREACHABLE_TAINT['key']}: }}"
            continue
        reason = node_misfit(pod, node, pods)
        if reason is None:
            fit.append(name)
        else:
            misfits[name] = reason
    return fit, misfits
