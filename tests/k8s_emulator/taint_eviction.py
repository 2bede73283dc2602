"""NoExecute taints as kube-controller-manager's taint-eviction controller (the taint manager) acts on them; the
tolerations pods meet them with come from kube-apiserver's DefaultTolerationSeconds admission (pod_classes.py).

- The `timeAdded` the API server writes on a NoExecute taint is written here, by the first pass that sees the taint
  without one (within a second of the write, not in it).
- Eviction: a pod bound to a node with a NoExecute taint it does not tolerate is deleted at once; a pod that tolerates
  every such taint, but with `tolerationSeconds` on the tolerations it uses, once the shortest of them has passed
  since the taint's `timeAdded` (a toleration without seconds tolerates it for ever; a negative one is 0). First the
  pod gets `DisruptionTarget=True` (reason DeletionByTaintManager), and a `TaintManagerEviction` event is posted, then
  it is deleted gracefully with its own grace period. Pods already finished or being deleted are left alone.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable
from typing import Any

from tests.k8s_emulator import eviction
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceType
from tests.k8s_emulator.scheduling import tolerates
from tests.k8s_emulator.store import PODS, Store, now_rfc3339

REASON = "DeletionByTaintManager"
MESSAGE = "Taint manager: deleting due to NoExecute taint"
NODES = ("", "nodes")


def _seconds_since(stamp: str | None, now: datetime.datetime) -> float:
    if not stamp:
        return 0.0
    return (now - datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()


def due(pod: dict[str, Any], taints: Iterable[dict[str, Any]], now: datetime.datetime) -> bool:
    """Whether the taint manager evicts `pod` now, its node having `taints`."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    left = float("inf")
    for taint in taints:
        if taint.get("effect") != "NoExecute":
            continue
        used = [t for t in tolerations if tolerates([t], taint)]
        if not used:
            return True
        seconds = [max(float(t["tolerationSeconds"]), 0.0) for t in used if t.get("tolerationSeconds") is not None]
        if len(seconds) == len(used):  # every toleration it has of this taint runs out
            left = min(left, min(seconds) - _seconds_since(taint.get("timeAdded"), now))
    return left <= 0


def evict_due(store: Store) -> list[str]:
    """One pass of the taint manager over the nodes with NoExecute taints; the pods it evicted (ns/name)."""
    tainted = {}
    for (_, name), node in list(store.bucket(NODES).items()):
        taints = (node.get("spec") or {}).get("taints") or []
        if any(t.get("effect") == "NoExecute" for t in taints):
            tainted[name] = _stamped(store, node, taints)
    if not tainted:
        return []
    pods_rt, now, evicted = store.registry.get(PODS), datetime.datetime.now(datetime.UTC), []
    assert pods_rt is not None
    for (namespace, name), pod in list(store.bucket(PODS).items()):
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in tainted or pod["metadata"].get("deletionTimestamp") or \
                (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if due(pod, tainted[node], now):
            _evict(store, pods_rt, pod)
            evicted.append(f"{namespace}/{name}")
    return evicted


def _stamped(store: Store, node: dict[str, Any], taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The node's taints, each NoExecute one with its `timeAdded` (written to the node if it had none)."""
    if all(t.get("timeAdded") or t.get("effect") != "NoExecute" for t in taints):
        return taints
    stamped = [{**t, "timeAdded": now_rfc3339()} if t.get("effect") == "NoExecute" and not t.get("timeAdded") else t
               for t in taints]
    nodes = store.registry.get(NODES)
    assert nodes is not None
    try:
        store.update(nodes, "", node["metadata"]["name"], {**node, "spec": {**node["spec"], "taints": stamped}})
    except StatusError:
        pass  # a forced conflict: stamped on the next pass
    return stamped


def _evict(store: Store, pods: ResourceType, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    status = copy.deepcopy(pod.get("status") or {})
    status["conditions"] = eviction.with_disruption_target(status.get("conditions") or [], REASON, MESSAGE)
    try:
        store.update(pods, meta["namespace"], meta["name"], {"status": status}, "status")
        _event(store, pod)
        store.delete(pods, meta["namespace"], meta["name"])
    except StatusError:
        pass  # gone meanwhile, or a forced conflict from a fault hook: the next pass sees it again


def _event(store: Store, pod: dict[str, Any]) -> None:
    events = store.registry.get(("", "events"))
    meta, now = pod["metadata"], now_rfc3339()
    if events is not None:
        store.create(events, meta["namespace"], {
            "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": "TaintManagerEviction", "message": f"Marking for deletion Pod {meta['namespace']}/{meta['name']}",
            "type": "Normal", "count": 1, "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": "taint-eviction-controller"}})
