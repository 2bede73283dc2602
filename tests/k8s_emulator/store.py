"""The emulator's state: objects by resource type, one global resourceVersion counter, a bounded event history
for watch replay, live watchers, and the write rules (conflicts, generation, status isolation, finalizers,
graceful pod deletion). Every method is synchronous and runs on the server's event loop, so each is atomic.

Stored dicts are never mutated in place: a write stores a new dict, so history entries can share them.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.k8s_emulator import admission, pod_classes
from tests.k8s_emulator.clock import now_rfc3339
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.listing import etcd_key
from tests.k8s_emulator.resources import CRD_KEY, Registry, ResourceKey, ResourceType, resource_type_from_crd
from tests.k8s_emulator.selectors import Predicate

ObjectKey = tuple[str, str]  # (namespace or "", name)
NAMESPACES: ResourceKey = ("", "namespaces")
PODS: ResourceKey = ("", "pods")
_NOT_SPEC = ("metadata", "status", "apiVersion", "kind")
DEPLOYMENTS: ResourceKey = ("apps", "deployments")
PDBS: ResourceKey = ("policy", "poddisruptionbudgets")
_GENERATION_KINDS = {CRD_KEY, PODS, DEPLOYMENTS, PDBS}  # built-ins with metadata.generation (configmaps, nodes: none)


@dataclass(frozen=True)
class Event:
    rv: int
    key: ResourceKey
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


class Watcher:
    """One watch stream's queue. Selector transitions turn MODIFIED into ADDED/DELETED as the API server does."""

    def __init__(self, key: ResourceKey, namespace: str, predicate: Predicate) -> None:
        self.key, self.namespace, self.predicate = key, namespace, predicate
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = asyncio.Queue()
        self.closed = False

    def _matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace and obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.predicate(obj)

    def offer(self, event: Event) -> None:
        if self.closed or event.key != self.key:
            return
        now, before = self._matches(event.obj), self._matches(event.old)
        kind = event.type
        if kind == "MODIFIED":
            kind = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else ""
        elif kind == "DELETED":
            kind = "DELETED" if now or before else ""
        elif not now:
            kind = ""
        if kind:
            self.queue.put_nowait((kind, event.obj))

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        if not self.closed:
            self.queue.put_nowait((kind, obj))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


class Store:
    def __init__(self, registry: Registry, history_size: int = 20000) -> None:
        self.registry = registry
        self.rv = 0
        self.history: deque[Event] = deque(maxlen=history_size)
        self.compacted_rv = 0  # events at or below this revision are gone from history
        self.watchers: set[Watcher] = set()
        self._objects: dict[ResourceKey, dict[ObjectKey, dict[str, Any]]] = {}
        self._dependents: dict[str, set[tuple[ResourceKey, ObjectKey]]] = {}  # owner uid -> dependents
        self._uids: dict[str, tuple[ResourceKey, ObjectKey]] = {}
        self._forced_conflicts: dict[tuple[ResourceKey, ObjectKey], int] = {}
        self.on_removed: list[Callable[[ResourceType, dict[str, Any]], None]] = []
        self.on_deleting: list[Callable[[ResourceType, dict[str, Any]], None]] = []
        self.on_changed: list[Callable[[Event], None]] = []  # after every write (controllers mark work)
        self.pod_hooks: list[Callable[[dict[str, Any]], None]] = []  # pod mutation at create (pod_hooks.py)
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create(self.registry.get(NAMESPACES), "", {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": name}})
        for priority_class in pod_classes.system_priority_classes():  # as kube-apiserver's bootstrap creates them
            self.create(self.registry.get(pod_classes.PRIORITY_CLASSES), "", priority_class)

    # ---- reads -------------------------------------------------------------------------------------------
    def bucket(self, key: ResourceKey) -> dict[ObjectKey, dict[str, Any]]:
        return self._objects.setdefault(key, {})

    def peek(self, key: ResourceKey, namespace: str, name: str) -> dict[str, Any] | None:
        return self.bucket(key).get((namespace, name))

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.peek(rt.key, namespace, name)
        if obj is None:
            raise StatusError.not_found(rt.group_kind, name)
        return copy.deepcopy(obj)

    def list(self, rt: ResourceType, namespace: str, predicate: Predicate) -> list[dict[str, Any]]:
        keyed = sorted((etcd_key(key), obj) for key, obj in self.bucket(rt.key).items()
                       if not namespace or key[0] == namespace)  # etcd's key order, as a list from it
        return [copy.deepcopy(obj) for _, obj in keyed if predicate(obj)]

    def state_at(self, key: ResourceKey, rv: int) -> dict[ObjectKey, dict[str, Any]] | None:
        """The objects of one kind as they were at revision `rv` (<= self.rv), rebuilt by undoing the later events;
        None once the history no longer reaches back to it (compacted)."""
        if rv < self.compacted_rv:
            return None
        state = dict(self.bucket(key))
        for event in reversed(self.history):
            if event.rv <= rv:
                break
            if event.key == key:
                meta = event.obj["metadata"]
                if event.old is None:
                    state.pop((meta.get("namespace", ""), meta["name"]), None)
                else:
                    state[(meta.get("namespace", ""), meta["name"])] = event.old
        return state

    def compact(self) -> int:
        """Fault hook: forget the history up to now, as etcd's compaction does (every 5 minutes on a cluster):
        continue tokens and watches from an older revision get 410 Expired."""
        self.history.clear()
        self.compacted_rv = self.rv
        return self.rv

    def exists_uid(self, uid: str) -> bool:
        return uid in self._uids

    def dependents_of(self, uid: str) -> list[tuple[ResourceKey, ObjectKey]]:
        return sorted(self._dependents.get(uid, ()))

    # ---- writes ------------------------------------------------------------------------------------------
    def _emit(self, kind: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        event = Event(self.rv, rt.key, kind, obj, old)
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        self.history.append(event)
        for watcher in list(self.watchers):
            watcher.offer(event)
        for callback in self.on_changed:
            callback(event)

    def _index(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        ref = (rt.key, (obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        for owner in (old or {}).get("metadata", {}).get("ownerReferences") or []:
            self._dependents.get(owner.get("uid"), set()).discard(ref)
        for owner in obj["metadata"].get("ownerReferences") or []:
            self._dependents.setdefault(owner.get("uid"), set()).add(ref)
        self._uids[obj["metadata"]["uid"]] = ref

    def _store(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        meta = obj["metadata"]
        self.bucket(rt.key)[(meta.get("namespace", ""), meta["name"])] = obj
        self._index(rt, obj, old)
        if rt.key == CRD_KEY:
            self.registry.add(resource_type_from_crd(obj))
        self._emit("ADDED" if old is None else "MODIFIED", rt, obj, old)
        return copy.deepcopy(obj)

    def _check_namespace(self, rt: ResourceType, namespace: str) -> None:
        if not rt.namespaced:
            return
        ns = self.peek(NAMESPACES, "", namespace)
        if ns is None:
            raise StatusError.not_found("namespaces", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise StatusError(403, "Forbidden", f"unable to create new content in namespace {namespace} because it "
                           "is being terminated")

    def create(self, rt: ResourceType, namespace: str, body: dict[str, Any], dry_run: bool = False,
               strict: bool = False) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj.setdefault("apiVersion", rt.api_version(rt.versions[0]))
        obj.setdefault("kind", rt.kind)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise StatusError.invalid(rt.group_kind, "", ["metadata.name: Required value: name or generateName is "
                                                       "required"])
        admission.validate_name(rt, meta["name"])
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise StatusError.bad_request("the namespace of the provided object does not match the namespace "
                                           "sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
            namespace = ""
        self._check_namespace(rt, namespace)
        if self.peek(rt.key, namespace, meta["name"]) is not None:
            raise StatusError.already_exists(rt.group_kind, meta["name"])
        for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        if rt.custom or rt.key in _GENERATION_KINDS:
            meta["generation"] = 1
        if rt.key == PODS:
            for hook in self.pod_hooks:  # mutating admission, before validation (as webhooks run)
                hook(obj)
        self._admit_classes(rt, obj, None)
        obj = admission.admit_create(rt, obj, strict)
        if dry_run:
            return obj
        return self._store(rt, obj, None)

    def _admit_classes(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """The admission that reads other objects: a pod's PriorityClass and RuntimeClass, a PriorityClass's
        globalDefault (pod_classes.py)."""
        def objects(key: ResourceKey) -> list[dict[str, Any]]:
            return list(self.bucket(key).values())

        errors: list[str] = []
        if rt.key == PODS and old is None:
            pod_classes.admit_pod(obj, objects)
        elif rt.key == PODS and old is not None:
            spec, old_spec = obj.get("spec") or {}, old.get("spec") or {}
            if spec.get("priority") is None and old_spec.get("priority") is not None:
                spec["priority"] = old_spec["priority"]  # the Priority plugin keeps it on update
        elif rt.key == pod_classes.PRIORITY_CLASSES:
            errors = pod_classes.admit_priority_class(obj, old, objects)
        elif rt.key == pod_classes.RUNTIME_CLASSES:
            errors = pod_classes.admit_runtime_class(obj, old)
        if errors:
            raise StatusError.invalid(rt.group_kind, obj["metadata"]["name"], errors)

    def force_conflict(self, key: ResourceKey, namespace: str, name: str, count: int = 1) -> None:
        """Fault hook: the next `count` writes to this object answer 409 Conflict."""
        self._forced_conflicts[(key, (namespace, name))] = count

    def _take_forced_conflict(self, rt: ResourceType, namespace: str, name: str) -> None:
        ref = (rt.key, (namespace, name))
        if self._forced_conflicts.get(ref, 0) > 0:
            self._forced_conflicts[ref] -= 1
            raise StatusError.conflict(rt.group_kind, name)

    def update(self, rt: ResourceType, namespace: str, name: str, body: dict[str, Any],
               subresource: str | None = None, dry_run: bool = False, strict: bool = False,
               require_rv: bool = False) -> dict[str, Any]:
        old = self.peek(rt.key, namespace, name)
        if old is None:
            raise StatusError.not_found(rt.group_kind, name)
        self._take_forced_conflict(rt, namespace, name)
        sent_meta = body.get("metadata") or {}
        if sent_meta.get("name", name) != name:
            raise StatusError.bad_request("the name of the object does not match the name on the URL")
        sent_rv = sent_meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise StatusError.conflict(rt.group_kind, name)
        if not sent_rv and require_rv and rt.custom:
            raise StatusError.invalid(rt.group_kind, name, ["metadata.resourceVersion: Invalid value: 0x0: must be "
                                                         "specified for an update"])
        if subresource == "status":
            obj = copy.deepcopy(old)
            if "status" in body:
                obj["status"] = copy.deepcopy(body["status"])
            else:
                obj.pop("status", None)
        else:
            obj = copy.deepcopy(body)
            if rt.status_subresource:
                if "status" in old:
                    obj["status"] = copy.deepcopy(old["status"])
                else:
                    obj.pop("status", None)
        obj["apiVersion"], obj["kind"] = old["apiVersion"], old["kind"]
        meta = obj.setdefault("metadata", {})
        old_meta = old["metadata"]
        for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "generation"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        if subresource == "status":
            obj["metadata"] = meta = copy.deepcopy(old_meta)  # /status never changes metadata
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise StatusError.invalid(rt.group_kind, name, [f"metadata.finalizers: Forbidden: no new finalizers "
                                                             f"can be added if the object is being deleted, found "
                                                             f"new finalizers {sorted(added)}"])
        if subresource is None:
            self._admit_classes(rt, obj, old)
        obj = admission.admit_custom(rt, obj, old, strict)
        meta = obj["metadata"]
        if "generation" in old_meta and {k: v for k, v in obj.items() if k not in _NOT_SPEC} != {
                k: v for k, v in old.items() if k not in _NOT_SPEC}:
            meta["generation"] = old_meta.get("generation", 1) + 1
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if obj == old:
            return copy.deepcopy(old)  # a no-op write changes nothing, not even the resourceVersion
        if dry_run:
            return obj
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not meta.get("deletionGracePeriodSeconds"):
            return self.remove_now(rt, namespace, name, obj)
        return self._store(rt, obj, old)

    def remove_now(self, rt: ResourceType, namespace: str, name: str,
                   final: dict[str, Any] | None = None) -> dict[str, Any]:
        """Take the object out of storage at once (the end of every deletion path)."""
        old = self.bucket(rt.key).pop((namespace, name))
        obj = copy.deepcopy(final if final is not None else old)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        uid = obj["metadata"]["uid"]
        self._uids.pop(uid, None)
        for owner in obj["metadata"].get("ownerReferences") or []:
            self._dependents.get(owner.get("uid"), set()).discard((rt.key, (namespace, name)))
        self._emit("DELETED", rt, obj, old)
        if rt.key == CRD_KEY:
            self._drop_custom_type(obj)
        for callback in self.on_removed:
            callback(rt, obj)
        return copy.deepcopy(obj)

    def _drop_custom_type(self, crd: dict[str, Any]) -> None:
        served = resource_type_from_crd(crd)
        for (ns, name) in list(self.bucket(served.key)):
            self.remove_now(served, ns, name)
        self.registry.remove(served.key)
        for watcher in list(self.watchers):
            if watcher.key == served.key:
                watcher.close()

    def delete(self, rt: ResourceType, namespace: str, name: str, grace: int | None = None,
               propagation: str | None = None, preconditions: dict[str, Any] | None = None,
               dry_run: bool = False) -> dict[str, Any]:
        old = self.peek(rt.key, namespace, name)
        if old is None:
            raise StatusError.not_found(rt.group_kind, name)
        meta = old["metadata"]
        for field in ("uid", "resourceVersion"):
            wanted = (preconditions or {}).get(field)
            if wanted and wanted != meta.get(field):
                raise StatusError(409, "Conflict", f"Precondition failed: {field} in precondition: {wanted}, "
                               f"{field} in object meta: {meta.get(field)}", {"name": name, "kind": rt.group_kind})
        if dry_run:
            return copy.deepcopy(old)
        if rt.key == PODS:
            status, spec = old.get("status") or {}, old.get("spec") or {}
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", 30))
            if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
                grace = 0
        elif rt.key == NAMESPACES:
            grace = 1  # namespaces always go through the namespace controller
        else:
            grace = 0
        finalizers = list(meta.get("finalizers") or [])
        for policy, finalizer in (("Foreground", "foregroundDeletion"), ("Orphan", "orphan")):
            if propagation == policy and finalizer not in finalizers and not meta.get("deletionTimestamp"):
                finalizers.append(finalizer)
        if grace == 0 and not finalizers:
            return self.remove_now(rt, namespace, name)
        obj = copy.deepcopy(old)
        new_meta = obj["metadata"]
        new_meta["finalizers"] = finalizers
        if not new_meta["finalizers"]:
            new_meta.pop("finalizers")
        if not new_meta.get("deletionTimestamp"):
            new_meta["deletionTimestamp"] = now_rfc3339(grace if rt.key == PODS else 0)
            new_meta["deletionGracePeriodSeconds"] = grace if rt.key != NAMESPACES else 0
        elif grace < new_meta.get("deletionGracePeriodSeconds", 0):
            new_meta["deletionGracePeriodSeconds"] = grace
        if rt.key == NAMESPACES:
            obj["status"] = {"phase": "Terminating"}
        if obj == old:
            return copy.deepcopy(old)
        stored = self._store(rt, obj, old)
        for callback in self.on_deleting:
            callback(rt, stored)
        return stored

    # ---- watches -----------------------------------------------------------------------------------------
    def watch(self, rt: ResourceType, namespace: str, predicate: Predicate, since: str | None) -> Watcher:
        """Register a watcher; replay history after `since`, or send the current objects as ADDED."""
        watcher = Watcher(rt.key, namespace, predicate)
        if since in (None, "", "0"):
            for obj in self.list(rt, namespace, predicate):
                watcher.send("ADDED", obj)
        else:
            try:
                since_rv = int(since)
            except ValueError:
                raise StatusError.bad_request(f"invalid resourceVersion {since!r}") from None
            if since_rv < self.compacted_rv:
                watcher.send("ERROR", StatusError(410, "Expired", f"too old resource version: {since_rv} "
                                               f"({self.compacted_rv + 1})").status())
                watcher.close()
                return watcher
            for event in self.history:
                if event.rv > since_rv:
                    watcher.offer(event)
        self.watchers.add(watcher)
        return watcher

    def drop_watches(self) -> int:
        """Fault hook: end every open watch stream, as an API server restart or a load balancer would."""
        dropped = list(self.watchers)
        for watcher in dropped:
            watcher.close()
        self.watchers.clear()
        return len(dropped)
