"""The Eviction API (`POST .../pods/<name>/eviction`, policy/v1 Eviction), what `kubectl drain` uses.

As a real API server (pkg/registry/core/pod/storage/eviction.go, pod disruption conditions on as in Kubernetes 1.31):

- a pod that is Pending, Succeeded or Failed, or already being deleted, is deleted without a look at budgets;
- else the PodDisruptionBudgets of its namespace whose selector selects it (pdb.py): more than one is an HTTP 500;
  a pod that is not Ready is deleted without using the budget if its policy is `AlwaysAllow`, or (the default,
  `IfHealthyBudget`) if the budget's currentHealthy >= desiredHealthy > 0; otherwise the budget's status must allow
  it: a budget the controller has not seen since its last change (observedGeneration < generation) answers 429 with
  retryAfterSeconds 10 (and `Retry-After`, which client-go obeys by itself), one with no disruption allowed 429
  with its counts; each 429 carries a `DisruptionBudget` cause. An allowed eviction decrements disruptionsAllowed
  and records the pod in `disruptedPods` (not on a dry run) in the budget's status, which the disruption controller
  (disruption.py) recomputes afterwards;
- then the pod gets `DisruptionTarget=True` (reason `EvictionByEvictionAPI`, message "Eviction API: evicting"; its
  transition time kept if it was True already) and is deleted with the Eviction's `deleteOptions` (grace period,
  preconditions), so a watcher sees the condition before the deletion. The answer is a 201 Success Status.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.k8s_emulator import pdb
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceType
from tests.k8s_emulator.store import Store, now_rfc3339

DISRUPTION_TARGET = "DisruptionTarget"
EVICTION_REASON = "EvictionByEvictionAPI"
EVICTION_MESSAGE = "Eviction API: evicting"
KIND = "Eviction"
GROUP_VERSION = ("policy", "v1")
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_BUDGETS = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
MAX_DISRUPTED_PODS = 2000  # a budget recording more unconfirmed evictions refuses further ones
CONFLICT_RETRIES = 20


def evict(store: Store, pods: ResourceType, namespace: str, name: str, body: dict[str, Any],
          dry_run: bool = False) -> dict[str, Any]:
    """Carry out one eviction; raises StatusError as the API server answers (400 for a malformed Eviction, 404 for
    a pod that is not there, 409 for a failed precondition)."""
    _check(body, namespace, name)
    pod = store.get(pods, namespace, name)
    options = body.get("deleteOptions") or {}
    dry_run = dry_run or "All" in (options.get("dryRun") or [])  # propagateDryRun: the query's or the body's
    if not _ignores_budgets(pod):
        _use_budget(store, pod, dry_run)
    preconditions = dict(options.get("preconditions") or {})
    meta = pod["metadata"]
    for field in ("uid", "resourceVersion"):  # checked before the condition is added, as the API server does
        if preconditions.get(field) and preconditions[field] != meta.get(field):
            raise StatusError(409, "Conflict", f"Precondition failed: {field} in precondition: "
                              f"{preconditions[field]}, {field} in object meta: {meta.get(field)}",
                              {"name": name, "kind": "pods"})
    if not dry_run:
        status = copy.deepcopy(pod.get("status") or {})
        status["conditions"] = with_disruption_target(status.get("conditions") or [])
        store.update(pods, namespace, name, {"status": status}, "status")
        preconditions.pop("resourceVersion", None)  # the condition's write moved it on
    grace = options.get("gracePeriodSeconds")
    propagation = "Orphan" if options.get("orphanDependents") is True else options.get("propagationPolicy")
    store.delete(pods, namespace, name, None if grace is None else int(grace), propagation, preconditions or None,
                 dry_run)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _ignores_budgets(pod: dict[str, Any]) -> bool:
    """canIgnorePDB: such a pod disrupts nothing by going."""
    return bool(pod["metadata"].get("deletionTimestamp")) or \
        (pod.get("status") or {}).get("phase") in ("Pending", "Succeeded", "Failed")


def _use_budget(store: Store, pod: dict[str, Any], dry_run: bool) -> None:
    """Raise as the API server refuses the eviction, else take one disruption from the pod's budget, if any."""
    budgets = pdb.budgets_of(store, pod)
    if len(budgets) > 1:
        raise StatusError(500, "", MULTIPLE_BUDGETS)
    if not budgets:
        return
    budget = budgets[0]
    spec, status = budget.get("spec") or {}, budget.get("status") or {}
    if not pdb.ready(pod) and (spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or (
            status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0)):
        return  # an unhealthy pod counts for nothing: its going takes no disruption
    meta = budget["metadata"]
    for _ in range(CONFLICT_RETRIES):
        try:
            _check_and_decrement(store, budget, pod["metadata"]["name"], dry_run)
            return
        except StatusError as err:
            if err.code != 409:
                raise
            budget = store.get(_pdb_type(store), meta["namespace"], meta["name"])  # re-read, as RetryOnConflict
    raise StatusError(504, "Timeout", f'couldn\'t update PodDisruptionBudget "{meta["name"]}" due to conflicts',
                      {"retryAfterSeconds": 10})


def _check_and_decrement(store: Store, budget: dict[str, Any], pod_name: str, dry_run: bool) -> None:
    meta, status = budget["metadata"], copy.deepcopy(budget.get("status") or {})
    name, allowed = meta["name"], status.get("disruptionsAllowed", 0)
    if status.get("observedGeneration", 0) < meta.get("generation", 1):
        raise _refused(f"The disruption budget {name} is still being processed by the server.", 10)
    if allowed < 0 or len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        why = "pdb disruptions allowed is negative" if allowed < 0 else \
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
        raise StatusError(403, "Forbidden", f'poddisruptionbudget.policy "{name}" is forbidden: {why}',
                          {"name": name, "group": "policy", "kind": "poddisruptionbudget"})
    if allowed == 0:
        raise _refused(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods and has "
                       f"{status.get('currentHealthy', 0)} currently")
    status["disruptionsAllowed"] = allowed - 1
    if allowed == 1:
        status = pdb.with_allowed_condition(status)
    if dry_run:
        return
    status["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: now_rfc3339()}
    store.update(_pdb_type(store), meta["namespace"], name, {**budget, "status": status}, "status")


def _refused(cause: str, retry_after: int = 0) -> StatusError:
    details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return StatusError(429, "TooManyRequests", VIOLATION, details)


def _pdb_type(store: Store) -> ResourceType:
    rt = store.registry.get(pdb.PDBS)
    assert rt is not None
    return rt


def _check(body: dict[str, Any], namespace: str, name: str) -> None:
    if body.get("kind", KIND) != KIND:
        raise StatusError.bad_request(f"the kind {body.get('kind')!r} is not Eviction")
    meta = body.get("metadata") or {}
    if meta.get("name", name) != name:
        raise StatusError.bad_request("name in URL does not match name in Eviction object")
    if meta.get("namespace", namespace) != namespace:
        raise StatusError.bad_request("namespace in URL does not match namespace in Eviction object")


def with_disruption_target(conditions: list[dict[str, Any]], reason: str = EVICTION_REASON,
                           message: str = EVICTION_MESSAGE) -> list[dict[str, Any]]:
    """`conditions` with DisruptionTarget=True for `reason` (its transition time kept if it was True already)."""
    old = next((c for c in conditions if c.get("type") == DISRUPTION_TARGET), None)
    since = old["lastTransitionTime"] if old and old.get("status") == "True" and old.get("lastTransitionTime") \
        else now_rfc3339()
    target = {"type": DISRUPTION_TARGET, "status": "True", "reason": reason, "message": message,
              "lastTransitionTime": since}
    return [c for c in conditions if c.get("type") != DISRUPTION_TARGET] + [target]
