"""policy/v1 PodDisruptionBudgets on the test cluster: what kube-apiserver does to one (validation, status reset on
create), its `kubectl get` columns, and the pieces the disruption controller (disruption.py) and the Eviction API
(eviction.py) share: which pods a budget selects, pod health, and the `DisruptionAllowed` condition.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING, Any

from tests.k8s_emulator.clock import now_rfc3339
from tests.k8s_emulator.resources import ResourceKey
from tests.k8s_emulator.selectors import match_label_selector_object

if TYPE_CHECKING:
    from tests.k8s_emulator.store import Store

PDBS: ResourceKey = ("policy", "poddisruptionbudgets")
PODS: ResourceKey = ("", "pods")
POLICIES = ("AlwaysAllow", "IfHealthyBudget")  # sorted, as the API server lists them
CONDITION = "DisruptionAllowed"
_PERCENT = re.compile(r"^[0-9]+%$")
_PERCENT_MESSAGE = ("a valid percent string must be a numeric string followed by an ending '%' "
                    "(e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')")  # two spaces: Go's RegexError
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_pointers = itertools.count(0xC000A1C000, 0x40)


# ---- admission -----------------------------------------------------------------------------------------------
def _go_int_or_string(value: Any) -> str:
    """Go's `%#v` of an intstr.IntOrString: how the API server's messages show a bad value."""
    if isinstance(value, str):
        return f"intstr.IntOrString{{Type:1, IntVal:0, StrVal:{json.dumps(value)}}}"
    return f'intstr.IntOrString{{Type:0, IntVal:{value}, StrVal:""}}'


def _go_spec(spec: dict[str, Any]) -> str:
    """Go's `%#v` of the internal PodDisruptionBudgetSpec (pointers print as addresses there too)."""
    def pointer(kind: str, field: str) -> str:
        return f"({kind})(nil)" if spec.get(field) is None else f"({kind})({hex(next(_pointers))})"
    return ("policy.PodDisruptionBudgetSpec{MinAvailable:" + pointer("*intstr.IntOrString", "minAvailable")
            + ", Selector:" + pointer("*v1.LabelSelector", "selector")
            + ", MaxUnavailable:" + pointer("*intstr.IntOrString", "maxUnavailable")
            + ", UnhealthyPodEvictionPolicy:" + pointer("*policy.UnhealthyPodEvictionPolicyType",
                                                         "unhealthyPodEvictionPolicy") + "}")


def _int_or_percent(value: Any, path: str) -> list[str]:
    """apps validation's ValidatePositiveIntOrPercent + IsNotMoreThan100Percent."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return [f"{path}: Invalid value: {json.dumps(value)}: must be an integer or percentage (e.g '5%')"]
    if isinstance(value, int):
        return [] if value >= 0 else [f"{path}: Invalid value: {value}: must be greater than or equal to 0"]
    if not _PERCENT.match(value):
        return [f"{path}: Invalid value: {_go_int_or_string(value)}: {_PERCENT_MESSAGE}"]
    if int(value[:-1]) > 100:
        return [f"{path}: Invalid value: {_go_int_or_string(value)}: must not be greater than 100%"]
    return []


def _selector(selector: Any, path: str) -> list[str]:
    """The operator/values rules of metav1 ValidateLabelSelector (label syntax is not checked)."""
    errors = []
    for i, expr in enumerate((selector or {}).get("matchExpressions") or []):
        at, op, values = f"{path}.matchExpressions[{i}]", expr.get("operator"), expr.get("values") or []
        if op in ("In", "NotIn") and not values:
            errors.append(f"{at}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'")
        elif op in ("Exists", "DoesNotExist") and values:
            errors.append(f"{at}.values: Forbidden: may not be specified when `operator` is 'Exists' or "
                          "'DoesNotExist'")
        elif op not in _OPERATORS:
            errors.append(f'{at}.operator: Invalid value: "{op}": not a valid selector operator')
    return errors


def _status_errors(status: dict[str, Any]) -> list[str]:
    return [f"status.{field}: Invalid value: {status[field]}: must be greater than or equal to 0"
            for field in ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods")
            if isinstance(status.get(field), int) and status[field] < 0]


def admit(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    """The validation errors of a PodDisruptionBudget (policy/v1 has no defaults); a create's status is reset."""
    spec = obj.setdefault("spec", {})
    errors = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        errors.append(f"spec: Invalid value: {_go_spec(spec)}: minAvailable and maxUnavailable cannot be both set")
    for field in ("minAvailable", "maxUnavailable"):
        if spec.get(field) is not None:
            errors += _int_or_percent(spec[field], f"spec.{field}")
    errors += _selector(spec.get("selector"), "spec.selector")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in POLICIES:
        errors.append(f'spec.unhealthyPodEvictionPolicy: Unsupported value: "{policy}": supported values: '
                      + ", ".join(f'"{p}"' for p in POLICIES))
    if old is None:  # the strategy's PrepareForCreate: an empty status, whose counts are not omitted
        obj["status"] = {"currentHealthy": 0, "desiredHealthy": 0, "disruptionsAllowed": 0, "expectedPods": 0}
    else:
        errors += _status_errors(obj.get("status") or {})
    return errors


# ---- kubectl get -----------------------------------------------------------------------------------------------
TABLE_COLUMNS = [("Name", "string"), ("Min Available", "string"), ("Max Unavailable", "string"),
                 ("Allowed Disruptions", "integer"), ("Age", "string")]


def table_cells(obj: dict[str, Any], age: str) -> list[Any]:
    spec = obj.get("spec") or {}
    shown = ["N/A" if spec.get(f) is None else str(spec[f]) for f in ("minAvailable", "maxUnavailable")]
    return [obj["metadata"]["name"], *shown, int((obj.get("status") or {}).get("disruptionsAllowed", 0)), age]


# ---- shared by the controller and the Eviction API ----------------------------------------------------------
def selects(budget: dict[str, Any], pod: dict[str, Any]) -> bool:
    """policy/v1: a null selector selects no pod, an empty one every pod of the budget's namespace."""
    selector = (budget.get("spec") or {}).get("selector")
    if selector is None or pod["metadata"].get("namespace") != budget["metadata"].get("namespace"):
        return False
    return match_label_selector_object(selector, pod["metadata"].get("labels") or {})


class BudgetIndex:
    """The budgets of the store, each indexed under its namespace and one pair of its matchLabels, so a pod is
    matched only against the budgets that could select it: pods x labels rather than pods x budgets (500 budgets
    over 1000 pods had stalled the test cluster)."""

    def __init__(self, store: Store) -> None:
        self.budgets = list(store.bucket(PDBS).values())
        self._by_label: dict[tuple[str, str, str], list[int]] = {}
        self._broad: dict[str, list[int]] = {}  # no matchLabels: tried against every pod of their namespace
        for i, budget in enumerate(self.budgets):
            selector, namespace = (budget.get("spec") or {}).get("selector"), budget["metadata"].get("namespace", "")
            if selector is None:
                continue  # selects no pod
            label = next(iter((selector.get("matchLabels") or {}).items()), None)
            if label is None:
                self._broad.setdefault(namespace, []).append(i)
            else:
                self._by_label.setdefault((namespace, *label), []).append(i)

    def selecting(self, pod: dict[str, Any]) -> list[int]:
        """The positions in `budgets` of those that select the pod."""
        namespace, labels = pod["metadata"].get("namespace", ""), pod["metadata"].get("labels") or {}
        candidates = list(self._broad.get(namespace, ()))
        for key, value in labels.items():
            candidates.extend(self._by_label.get((namespace, key, value), ()))
        return [i for i in candidates if selects(self.budgets[i], pod)]


def pods_by_budget(store: Store, pods: list[dict[str, Any]] | None = None,
                   budgets: set[tuple[str, str]] | None = None) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Budgets with the pods each selects, from one walk over the pods: every budget, or (given `pods` or `budgets`)
    only those that select one of `pods` (versions written since the last pass, old and new) or are named in
    `budgets` as (namespace, name)."""
    index = BudgetIndex(store)
    if pods is None and budgets is None:
        chosen = set(range(len(index.budgets)))
    else:
        chosen = {i for i, b in enumerate(index.budgets)
                  if (b["metadata"].get("namespace", ""), b["metadata"]["name"]) in (budgets or ())}
        chosen.update(i for pod in pods or () for i in index.selecting(pod))
    selected: dict[int, list[dict[str, Any]]] = {i: [] for i in sorted(chosen)}
    namespaces = {index.budgets[i]["metadata"].get("namespace", "") for i in chosen}
    for (namespace, _), pod in store.bucket(PODS).items():
        if namespace not in namespaces:
            continue
        for i in index.selecting(pod):
            if i in selected:
                selected[i].append(pod)
    return [(index.budgets[i], found) for i, found in selected.items()]


def budgets_of(store: Store, pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in store.bucket(PDBS).values() if selects(b, pod)]


def ready(pod: dict[str, Any]) -> bool:
    """IsPodReady: what the budgets count as healthy."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def with_condition(status: dict[str, Any], ok: bool, reason: str, message: str = "") -> dict[str, Any]:
    """`status` with DisruptionAllowed set as meta.SetStatusCondition does (its time moves only with its status)."""
    old = next((c for c in status.get("conditions") or [] if c.get("type") == CONDITION), None)
    value = "True" if ok else "False"
    since = old["lastTransitionTime"] if old and old.get("status") == value else now_rfc3339()
    condition = {"type": CONDITION, "status": value, "reason": reason, "message": message,
                 "lastTransitionTime": since}
    if status.get("observedGeneration"):
        condition["observedGeneration"] = status["observedGeneration"]
    others = [c for c in status.get("conditions") or [] if c.get("type") != CONDITION]
    return {**status, "conditions": [*others, condition]}


def with_allowed_condition(status: dict[str, Any]) -> dict[str, Any]:
    """pdbhelper.UpdateDisruptionAllowedCondition: True/SufficientPods while a disruption is allowed."""
    if status.get("disruptionsAllowed", 0) > 0:
        return with_condition(status, True, "SufficientPods")
    return with_condition(status, False, "InsufficientPods")
