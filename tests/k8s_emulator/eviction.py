"""The Eviction API (`POST .../pods/<name>/eviction`, policy/v1 Eviction), what `kubectl drain` uses.

As a real API server with pod disruption conditions (GA in Kubernetes 1.31): the pod first gets the condition
`DisruptionTarget=True` (reason `EvictionByEvictionAPI`, message "Eviction API: evicting"; its transition time kept
if it was True already), then it is deleted with the Eviction's `deleteOptions` (grace period, preconditions), so a
watcher sees the condition before the deletion. The answer is a 201 Success Status. There are no
PodDisruptionBudgets here, so no eviction is ever refused with 429 (docs/test-cluster.md lists the gap).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceType
from tests.k8s_emulator.store import Store, now_rfc3339

DISRUPTION_TARGET = "DisruptionTarget"
EVICTION_REASON = "EvictionByEvictionAPI"
EVICTION_MESSAGE = "Eviction API: evicting"
KIND = "Eviction"
GROUP_VERSION = ("policy", "v1")


def evict(store: Store, pods: ResourceType, namespace: str, name: str, body: dict[str, Any],
          dry_run: bool = False) -> dict[str, Any]:
    """Carry out one eviction; raises StatusError as the API server answers (400 for a malformed Eviction, 404 for
    a pod that is not there, 409 for a failed precondition)."""
    _check(body, namespace, name)
    pod = store.get(pods, namespace, name)
    options = body.get("deleteOptions") or {}
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
