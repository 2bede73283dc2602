"""apps/v1 Deployments on the test cluster: the served type, what the API server does to one (defaults, validation,
status reset on create) and a minimal deployment controller.

The controller owns the pods directly (there are no ReplicaSets): it keeps `spec.replicas` pods of the current pod
template, each labelled `pod-template-hash` (a hash of the template, as the ReplicaSet controller labels them), named
`<deployment>-<hash>-<random>` and owned by the Deployment (`controller: true`), so that deleting the Deployment
lets the garbage collector delete them. A template change rolls out as the strategy says:

- `Recreate`: the old pods are deleted, and new ones are created only once no old pod exists any more (two
  generations never run at once);
- `RollingUpdate`: new pods are created at once (as if `maxSurge` were 100 %) and an old pod is deleted for each
  new pod that turns Ready (`maxSurge`/`maxUnavailable` are not read).

Pods that finished (Succeeded/Failed) or are being deleted do not count and are replaced. Status: replicas,
updatedReplicas, readyReplicas, availableReplicas (= ready: `minReadySeconds` is not read), unavailableReplicas,
observedGeneration, and the Available and Progressing conditions that `kubectl rollout status` reads.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from tests.k8s_emulator.clock import now_rfc3339
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceKey, ResourceType
from tests.k8s_emulator.woken_loop import WokenLoop

DEPLOYMENTS: ResourceKey = ("apps", "deployments")
PODS: ResourceKey = ("", "pods")
HASH_LABEL = "pod-template-hash"


# ---- admission -----------------------------------------------------------------------------------------------
def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels + matchExpressions) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), set(expr.get("values") or [])
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def admit(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    """Defaults and the validation errors of a Deployment (apps/v1), as the API server applies them."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy.setdefault("type", "RollingUpdate")
        strategy.setdefault("rollingUpdate", {"maxSurge": "25%", "maxUnavailable": "25%"})
    template = spec.get("template") or {}
    pod_spec = template.get("spec") or {}
    if isinstance(pod_spec, dict):
        pod_spec.setdefault("restartPolicy", "Always")
        pod_spec.setdefault("terminationGracePeriodSeconds", 30)
        pod_spec.setdefault("dnsPolicy", "ClusterFirst")
        pod_spec.setdefault("schedulerName", "default-scheduler")
    errors = []
    replicas = spec.get("replicas")
    if not isinstance(replicas, int) or replicas < 0:
        errors.append(f"spec.replicas: Invalid value: {replicas!r}: must be greater than or equal to 0")
    if strategy.get("type") not in ("RollingUpdate", "Recreate"):
        errors.append(f'spec.strategy.type: Unsupported value: "{strategy.get("type")}": supported values: '
                      '"Recreate", "RollingUpdate"')
    if strategy.get("type") == "Recreate" and strategy.get("rollingUpdate"):
        errors.append("spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is "
                      "'Recreate'")
    selector = spec.get("selector")
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        errors.append("spec.selector: Required value")
    elif not _matches(selector, labels):
        errors.append("spec.template.metadata.labels: Invalid value: "
                      f"{json.dumps(labels)}: `selector` does not match template `labels`")
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        errors.append(f"spec.selector: Invalid value: {json.dumps(selector)}: field is immutable")
    if not isinstance(pod_spec, dict) or not pod_spec.get("containers"):
        errors.append("spec.template.spec.containers: Required value")
    else:
        for i, container in enumerate(pod_spec["containers"]):
            for field in ("name", "image"):
                if not container.get(field):
                    errors.append(f"spec.template.spec.containers[{i}].{field}: Required value")
        if pod_spec.get("restartPolicy") != "Always":
            errors.append(f'spec.template.spec.restartPolicy: Unsupported value: "{pod_spec.get("restartPolicy")}": '
                          'supported values: "Always"')
    if old is None:
        obj["status"] = {}  # a client's status is dropped on create; the controller writes it
    return errors


# ---- kubectl get -----------------------------------------------------------------------------------------------
def table_cells(obj: dict[str, Any], age: str) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return [obj["metadata"]["name"], f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
            status.get("updatedReplicas", 0), status.get("availableReplicas", 0), age]


TABLE_COLUMNS = [("Name", "string"), ("Ready", "string"), ("Up-to-date", "integer"), ("Available", "integer"),
                 ("Age", "string")]


# ---- the controller --------------------------------------------------------------------------------------------
def template_hash(template: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:10]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _active(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class DeploymentController(WokenLoop):
    """Reconciles every Deployment whenever a Deployment or a pod changes, and once a second besides."""

    watched = (DEPLOYMENTS, PODS)

    def run_pass(self) -> None:
        for deployment in list(self.store.bucket(DEPLOYMENTS).values()):
            try:
                self.reconcile(deployment)
            except StatusError:
                self.again()  # e.g. a forced conflict: the next pass retries

    def _owned_pods(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        uid = deployment["metadata"]["uid"]
        pods = []
        for key, (namespace, name) in self.store.dependents_of(uid):
            pod = self.store.peek(key, namespace, name) if key == PODS else None
            if pod is not None and any(o.get("uid") == uid and o.get("controller")
                                       for o in pod["metadata"].get("ownerReferences") or []):
                pods.append(pod)
        return pods

    def reconcile(self, deployment: dict[str, Any]) -> None:
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return  # the garbage collector takes the pods (foreground deletion waits for them)
        pods_rt = self.store.registry.get(PODS)
        assert pods_rt is not None
        wanted = int(spec.get("replicas", 1))
        current_hash = template_hash(spec.get("template") or {})
        pods = self._owned_pods(deployment)
        active = [p for p in pods if _active(p)]
        new = [p for p in active if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == current_hash]
        old = [p for p in active if p not in new]
        old_present = [p for p in pods if (p["metadata"].get("labels") or {}).get(HASH_LABEL) != current_hash
                       and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
        if recreate:
            for pod in old:
                self._delete(pods_rt, pod)
            if not old_present:
                self._scale(pods_rt, deployment, new, wanted, current_hash)
        else:
            self._scale(pods_rt, deployment, new, wanted, current_hash)
            surplus = len([p for p in new if _ready(p)]) + len(old) - wanted
            for pod in sorted(old, key=_ready)[:max(surplus, 0)]:  # not-ready old pods go first
                self._delete(pods_rt, pod)
        self._write_status(deployment, wanted, current_hash)

    def _scale(self, pods_rt: ResourceType, deployment: dict[str, Any], new: list[dict[str, Any]], wanted: int,
               current_hash: str) -> None:
        for _ in range(wanted - len(new)):
            self._create_pod(pods_rt, deployment, current_hash)
        # Scale down: pods not yet scheduled, then not ready, then the newest go first (as the ReplicaSet does).
        newest_first = sorted(new, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
        extra = sorted(newest_first, key=lambda p: (bool((p.get("spec") or {}).get("nodeName")), _ready(p)))
        for pod in extra[:max(len(new) - wanted, 0)]:
            self._delete(pods_rt, pod)

    def _create_pod(self, pods_rt: ResourceType, deployment: dict[str, Any], current_hash: str) -> None:
        meta = deployment["metadata"]
        template = copy.deepcopy((deployment.get("spec") or {}).get("template") or {})
        pod_meta = template.get("metadata") or {}
        labels = {**(pod_meta.get("labels") or {}), HASH_LABEL: current_hash}
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {**{k: v for k, v in pod_meta.items() if k in ("annotations", "finalizers")},
                             "generateName": f"{meta['name']}-{current_hash}-", "labels": labels,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": template.get("spec") or {}}
        try:
            self.store.create(pods_rt, meta["namespace"], body)
        except StatusError as err:
            if err.code not in (403, 404, 409, 422):  # terminating/missing namespace, name clash, invalid pod
                raise

    def _delete(self, pods_rt: ResourceType, pod: dict[str, Any]) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            return
        try:
            self.store.delete(pods_rt, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except StatusError as err:
            if err.code != 404:
                raise

    def _write_status(self, deployment: dict[str, Any], wanted: int, current_hash: str) -> None:
        meta = deployment["metadata"]
        pods = [p for p in self._owned_pods(deployment) if _active(p)]
        updated = [p for p in pods if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == current_hash]
        ready = [p for p in pods if _ready(p)]
        available = len(ready)
        old_status = deployment.get("status") or {}
        old_conditions = {c.get("type"): c for c in old_status.get("conditions") or []}

        def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
            before = old_conditions.get(kind) or {}
            status, now = ("True" if ok else "False"), now_rfc3339()
            same = before.get("status") == status and before.get("reason") == reason
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastUpdateTime": before.get("lastUpdateTime", now) if same else now,
                    "lastTransitionTime": before.get("lastTransitionTime", now)
                    if before.get("status") == status else now}

        complete = len(updated) == wanted and len(pods) == wanted and available >= wanted
        status: dict[str, Any] = {
            "observedGeneration": meta.get("generation", 1), "replicas": len(pods), "updatedReplicas": len(updated),
            "readyReplicas": len(ready), "availableReplicas": available,
            "unavailableReplicas": max(wanted - available, 0),
            "conditions": [
                condition("Available", available >= wanted,
                          "MinimumReplicasAvailable" if available >= wanted else "MinimumReplicasUnavailable",
                          "Deployment has minimum availability." if available >= wanted
                          else "Deployment does not have minimum availability."),
                condition("Progressing", True, "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                          f'Pods of template hash "{current_hash}" '
                          + ("are available." if complete else "are progressing.")),
            ]}
        for field in ("readyReplicas", "availableReplicas", "unavailableReplicas", "updatedReplicas", "replicas"):
            if not status[field]:
                del status[field]  # zero counts are omitted, as in the API's JSON
        if status == old_status:
            return
        deployments_rt = self.store.registry.get(DEPLOYMENTS)
        assert deployments_rt is not None
        self.store.update(deployments_rt, meta["namespace"], meta["name"], {**deployment, "status": status},
                          subresource="status")
