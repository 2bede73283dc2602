"""The test cluster's scheduler filters, as pure functions over Node and Pod objects, in kube-scheduler's order
(NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit, InterPodAffinity): a cordoned node, an
untolerated NoSchedule/NoExecute taint, a nodeSelector or required node affinity that does not match, too few of an
extended resource (e.g. `nvidia.com/gpu`: the sum of the requests of the node's unfinished pods against its
allocatable count), or the pod's required pod (anti-)affinity rule a node out. Among the nodes left, the pod's
preferred pod (anti-)affinity scores them (`best_scored`). When none is left, `unschedulable_message` says why
in the scheduler's words, which a pod's PodScheduled=False/Unschedulable condition and its FailedScheduling event carry.

cpu and memory are not counted (every node of the test cluster is the same host): only extended resources, those
whose name has a domain (`vendor/name`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tests.k8s_emulator.selectors import match_label_selector_object

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
UNREACHABLE_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
AFFINITY_MISFIT = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_MISFIT = "node(s) didn't match pod anti-affinity rules"
TERMINAL_PHASES = ("Succeeded", "Failed")
Labels = dict[str, str]


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
                (other.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            used.update(pod_requests(other))
    return used


def node_misfit(pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]],
                around: Neighbours | None = None) -> str | None:
    """Why `node` cannot take `pod` (the first failing filter's reason), or None when it can. `around` gives
    inter-pod affinity every node's labels (topology domains span nodes); by default only this node's."""
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
    return inter_pod_affinity_misfit(pod, node, around or Neighbours.of(pods, [node]))


def _histogram(reasons: Iterable[str]) -> str:
    return ", ".join(sorted(f"{count} {reason}" for reason, count in Counter(reasons).items()))


def unschedulable_message(misfits: dict[str, str]) -> str:
    """The scheduler's FitError text for per-node reasons, e.g. `0/2 nodes are available: 2 node(s) had
    untolerated taint {nvidia.com/gpu: }. preemption: 0/2 nodes are available: 2 Preemption is not helpful for
    scheduling.` Only a lack of resources or an anti-affinity could be helped by preempting other pods (there are
    none of lower priority here); a failed pod affinity is unresolvable, as in InterPodAffinity's Filter."""
    total = len(misfits)
    preemption = [NO_VICTIMS if reason.startswith("Insufficient ") or reason == ANTI_AFFINITY_MISFIT else NOT_HELPFUL
                  for reason in misfits.values()]
    return (f"0/{total} nodes are available: {_histogram(misfits.values())}. "
            f"preemption: 0/{total} nodes are available: {_histogram(preemption)}.")


def feasible_nodes(pod: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                   lost: set[str], around: Neighbours | None = None) -> tuple[list[str], dict[str, str]]:
    """(names of the nodes that can take the pod, reason per node that cannot). A lost node (no heartbeats) is
    treated as carrying the unreachable taint the node lifecycle controller gives it."""
    around = around or Neighbours.of(pods, nodes)
    fit, misfits = [], {}
    for node in nodes:
        name = node["metadata"]["name"]
        if name in lost:
            misfits[name] = f"node(s) had untolerated taint {{{UNREACHABLE_TAINT['key']}: }}"
            continue
        reason = node_misfit(pod, node, pods, around)
        if reason is None:
            fit.append(name)
        else:
            misfits[name] = reason
    return fit, misfits


# Inter-pod affinity (kube-scheduler's InterPodAffinity plugin), for the incoming pod's own terms only.

@dataclass(frozen=True)
class Neighbours:
    """What inter-pod affinity looks at: the pods that count -- bound and not terminal; terminating ones still
    count, as in kube-scheduler (a pod may take arbitrarily long to go) -- and the labels of every node (topology
    domains) and of every namespace (namespaceSelector)."""
    pods: list[dict[str, Any]]
    node_labels: dict[str, Labels]
    namespace_labels: dict[str, Labels]

    @classmethod
    def of(cls, pods: Iterable[dict[str, Any]], nodes: Iterable[dict[str, Any]],
           namespaces: Iterable[dict[str, Any]] = ()) -> Neighbours:
        counted = [p for p in pods if (p.get("spec") or {}).get("nodeName")
                   and (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
        return cls(counted, {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes},
                   {ns["metadata"]["name"]: ns["metadata"].get("labels") or {} for ns in namespaces})

    def domain_of(self, pod: dict[str, Any], key: str) -> str | None:
        """The value of topology label `key` on the pod's node (None when the node lacks it)."""
        return self.node_labels.get(pod["spec"]["nodeName"], {}).get(key)


def _pod_terms(pod: dict[str, Any], kind: str, mode: str) -> list[dict[str, Any]]:
    """The pod's `kind` (podAffinity/podAntiAffinity) terms of `mode` (required.../preferred...)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get(f"{mode}DuringSchedulingIgnoredDuringExecution") or [])


def _in_term_namespaces(term: dict[str, Any], owner: dict[str, Any], namespace: str,
                        namespace_labels: dict[str, Labels]) -> bool:
    """The term's namespaces: those listed plus those its namespaceSelector selects ({} = all); neither given
    means the namespace of the pod that carries the term."""
    listed, selector = term.get("namespaces") or [], term.get("namespaceSelector")
    if not listed and selector is None:
        return namespace == owner["metadata"].get("namespace", "default")
    if namespace in listed:
        return True
    return selector is not None and match_label_selector_object(selector, namespace_labels.get(namespace, {}))


def _selects(term: dict[str, Any], owner: dict[str, Any], other: dict[str, Any],
             namespace_labels: dict[str, Labels]) -> bool:
    """Whether `owner`'s pod affinity term selects pod `other` (a null labelSelector selects none)."""
    selector, meta = term.get("labelSelector"), other["metadata"]
    return selector is not None and \
        _in_term_namespaces(term, owner, meta.get("namespace", "default"), namespace_labels) and \
        match_label_selector_object(selector, meta.get("labels") or {})


def _satisfies_affinity(pod: dict[str, Any], labels: Labels, terms: list[dict[str, Any]],
                        around: Neighbours) -> bool:
    """Every term has a pod it selects in this node's domain; an existing pod counts only when it matches all the
    terms (as kube-scheduler counts them). A node lacking a term's topology label fails."""
    keys = [term.get("topologyKey", "") for term in terms]
    if any(key not in labels for key in keys):
        return False
    group = [p for p in around.pods if all(_selects(t, pod, p, around.namespace_labels) for t in terms)
             and any(around.domain_of(p, key) is not None for key in keys)]
    if all(any(around.domain_of(p, key) == labels[key] for p in group) for key in keys):
        return True
    # The first pod of a group with affinity to itself: no pod anywhere matches, but it matches its own terms.
    return not group and all(_selects(t, pod, pod, around.namespace_labels) for t in terms)


def _in_domain(term: dict[str, Any], owner: dict[str, Any], labels: Labels, around: Neighbours) -> int:
    """How many pods the term selects in the node's domain for its topologyKey (0 when the node lacks it)."""
    key = term.get("topologyKey", "")
    if key not in labels:
        return 0
    return sum(1 for p in around.pods
               if around.domain_of(p, key) == labels[key] and _selects(term, owner, p, around.namespace_labels))


def inter_pod_affinity_misfit(pod: dict[str, Any], node: dict[str, Any], around: Neighbours) -> str | None:
    """InterPodAffinity's Filter for the pod's required terms: its pod affinity first, then its anti-affinity (a
    node lacking an anti-affinity term's topology label passes that term)."""
    labels = node["metadata"].get("labels") or {}
    affinity = _pod_terms(pod, "podAffinity", "required")
    if affinity and not _satisfies_affinity(pod, labels, affinity, around):
        return AFFINITY_MISFIT
    if any(_in_domain(term, pod, labels, around) for term in _pod_terms(pod, "podAntiAffinity", "required")):
        return ANTI_AFFINITY_MISFIT
    return None


def affinity_score(pod: dict[str, Any], node_name: str, around: Neighbours) -> int:
    """InterPodAffinity's Score for the pod's preferred terms: each pod a preferred pod affinity term selects in
    the node's domain adds the term's weight, each one a preferred anti-affinity term selects subtracts it."""
    labels = around.node_labels.get(node_name, {})
    score = 0
    for sign, kind in ((1, "podAffinity"), (-1, "podAntiAffinity")):
        for preferred in _pod_terms(pod, kind, "preferred"):
            matches = _in_domain(preferred.get("podAffinityTerm") or {}, pod, labels, around)
            score += sign * int(preferred.get("weight", 0)) * matches
    return score


def best_scored(pod: dict[str, Any], fit: Iterable[str], around: Neighbours) -> set[str]:
    """The feasible nodes with the highest affinity score (all of them when the pod prefers nothing)."""
    scores = {name: affinity_score(pod, name, around) for name in fit}
    top = max(scores.values(), default=0)
    return {name for name, score in scores.items() if score == top}
