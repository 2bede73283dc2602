"""The control-plane loops a real cluster runs next to the API server, reduced to what tests observe:
ownerReference garbage collection (background, foreground, orphan), namespace deletion, node lifecycle
(a node whose Lease stops being renewed turns Ready=Unknown, gets the unreachable taint, its pods NotReady), and
the taint manager's NoExecute evictions (taint_eviction.py)."""

from __future__ import annotations

import asyncio
import copy
import datetime
from typing import Any

from tests.k8s_emulator import taint_eviction
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import ResourceType
from tests.k8s_emulator.store import NAMESPACES, PODS, Store, now_rfc3339

NODES = ("", "nodes")
LEASES = ("coordination.k8s.io", "leases")
UNREACHABLE_TAINT = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}


class ControlPlane:
    def __init__(self, store: Store, node_monitor_grace_seconds: float = 40.0) -> None:
        self.store = store
        self.node_monitor_grace_seconds = node_monitor_grace_seconds
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        store.on_removed.append(self._removed)
        store.on_deleting.append(self._deleting)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._garbage_collector()), asyncio.create_task(self._node_monitor())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- hooks from the store (synchronous; the work happens in the collector task) --------------------
    def _removed(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        self._queue.put_nowait(("owner-removed", obj["metadata"]["uid"]))
        for owner in obj["metadata"].get("ownerReferences") or []:
            self._queue.put_nowait(("check-owner", owner.get("uid", "")))

    def _deleting(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if rt.key == NAMESPACES:
            asyncio.get_running_loop().create_task(self._finish_namespace(obj["metadata"]["name"]))
        elif {"orphan", "foregroundDeletion"} & set(obj["metadata"].get("finalizers") or []):
            self._queue.put_nowait(("check-owner", obj["metadata"]["uid"]))

    # ---- garbage collector -----------------------------------------------------------------------------
    def _resource(self, key: tuple[str, str]) -> ResourceType | None:
        return self.store.registry.get(key)

    def _delete_quietly(self, key: tuple[str, str], namespace: str, name: str, propagation: str) -> None:
        rt = self._resource(key)
        if rt is None:
            return
        try:
            self.store.delete(rt, namespace, name, propagation=propagation)
        except StatusError:
            pass  # already gone, or a conflict the next pass resolves

    def _collect_orphans_of(self, owner_uid: str) -> None:
        for key, (namespace, name) in self.store.dependents_of(owner_uid):
            obj = self.store.peek(key, namespace, name)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                continue
            owners = [o.get("uid") for o in obj["metadata"].get("ownerReferences") or []]
            if any(self.store.exists_uid(uid) for uid in owners if uid != owner_uid):
                continue  # another owner still holds it
            self._delete_quietly(key, namespace, name, "Background")

    def _remove_finalizer(self, owner_uid: str, finalizer: str) -> None:
        for rt in self.store.registry.all():
            for (namespace, name), obj in list(self.store.bucket(rt.key).items()):
                if obj["metadata"]["uid"] != owner_uid:
                    continue
                updated = copy.deepcopy(obj)
                updated["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or []
                                                     if f != finalizer]
                self.store.update(rt, namespace, name, updated)
                return

    def _owner_finalizers(self, owner_uid: str) -> None:
        owner = next((o for rt in self.store.registry.all() for o in self.store.bucket(rt.key).values()
                      if o["metadata"]["uid"] == owner_uid), None)
        if owner is None:
            return
        finalizers = owner["metadata"].get("finalizers") or []
        dependents = self.store.dependents_of(owner_uid)
        if "orphan" in finalizers:
            for key, (namespace, name) in dependents:
                obj = self.store.peek(key, namespace, name)
                rt = self._resource(key)
                if obj is None or rt is None:
                    continue
                updated = copy.deepcopy(obj)
                updated["metadata"]["ownerReferences"] = [
                    o for o in obj["metadata"].get("ownerReferences") or [] if o.get("uid") != owner_uid]
                self.store.update(rt, namespace, name, updated)
            self._remove_finalizer(owner_uid, "orphan")
        elif "foregroundDeletion" in finalizers:
            if not dependents:
                self._remove_finalizer(owner_uid, "foregroundDeletion")
                return
            for key, (namespace, name) in dependents:
                self._delete_quietly(key, namespace, name, "Foreground")

    async def _garbage_collector(self) -> None:
        while True:
            kind, uid = await self._queue.get()
            try:
                if kind == "owner-removed":
                    self._collect_orphans_of(uid)
                else:
                    self._owner_finalizers(uid)
            except StatusError:
                self._queue.put_nowait((kind, uid))  # e.g. a forced conflict: retry, as the real GC does
                await asyncio.sleep(0.1)

    # ---- namespace controller --------------------------------------------------------------------------
    async def _finish_namespace(self, namespace: str) -> None:
        while self.store.peek(NAMESPACES, "", namespace) is not None:
            remaining = 0
            for rt in self.store.registry.all():
                if not rt.namespaced:
                    continue
                for (ns, name), obj in list(self.store.bucket(rt.key).items()):
                    if ns != namespace:
                        continue
                    remaining += 1
                    if not obj["metadata"].get("deletionTimestamp"):
                        self._delete_quietly(rt.key, ns, name, "Background")
            if remaining == 0:
                self.store.remove_now(self.store.registry.get(NAMESPACES), "", namespace)
                return
            await asyncio.sleep(0.2)

    # ---- node lifecycle controller ---------------------------------------------------------------------
    def _lease_age(self, node_name: str) -> float | None:
        lease = self.store.peek(LEASES, "kube-node-lease", node_name)
        renew = ((lease or {}).get("spec") or {}).get("renewTime")
        if not renew:
            return None
        moment = datetime.datetime.fromisoformat(renew.replace("Z", "+00:00"))
        return (datetime.datetime.now(datetime.UTC) - moment).total_seconds()

    def check_nodes(self) -> None:
        nodes_rt, pods_rt = self.store.registry.get(NODES), self.store.registry.get(PODS)
        for (_, name), node in list(self.store.bucket(NODES).items()):
            age = self._lease_age(name)
            if age is None or age <= self.node_monitor_grace_seconds:
                taints = (node.get("spec") or {}).get("taints") or []
                if any(t.get("key") == UNREACHABLE_TAINT["key"] for t in taints) and self._node_ready(node):
                    updated = copy.deepcopy(node)
                    updated["spec"]["taints"] = [t for t in taints if t.get("key") != UNREACHABLE_TAINT["key"]]
                    self.store.update(nodes_rt, "", name, updated)
                continue
            if not self._node_ready(node) and node["status"].get("conditions") and all(
                    c.get("status") == "Unknown" for c in node["status"]["conditions"] if c.get("type") == "Ready"):
                continue
            status = copy.deepcopy(node.get("status") or {})
            for condition in status.get("conditions") or []:
                condition.update(status="Unknown", reason="NodeStatusUnknown", lastTransitionTime=now_rfc3339(),
                                 message="Kubelet stopped posting node status.")
            self.store.update(nodes_rt, "", name, {**node, "status": status}, subresource="status")
            tainted = copy.deepcopy(self.store.peek(NODES, "", name))
            tainted.setdefault("spec", {}).setdefault("taints", []).append(
                {**UNREACHABLE_TAINT, "timeAdded": now_rfc3339()})
            self.store.update(nodes_rt, "", name, tainted)
            for (namespace, pod_name), pod in list(self.store.bucket(PODS).items()):
                if (pod.get("spec") or {}).get("nodeName") == name:
                    status = copy.deepcopy(pod.get("status") or {})
                    for condition in status.get("conditions") or []:
                        if condition.get("type") in ("Ready", "ContainersReady"):
                            condition.update(status="False", lastTransitionTime=now_rfc3339())
                    self.store.update(pods_rt, namespace, pod_name, {**pod, "status": status}, subresource="status")

    @staticmethod
    def _node_ready(node: dict[str, Any]) -> bool:
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (node.get("status") or {}).get("conditions") or [])

    async def _node_monitor(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.node_monitor_grace_seconds / 4))
            try:
                self.check_nodes()
                taint_eviction.evict_due(self.store)
            except StatusError:
                pass  # a forced conflict from a fault hook; the next pass retries
