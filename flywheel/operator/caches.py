"""What a reconcile pass and the health monitor read of the cluster: TrainingJobs, the operator's pods, its headless
Services and the lost nodes.

In the operator these come from kopf's own watches (`@kopf.index` handlers in handlers.py feed `WatchCaches`), so
a pass reads memory and the steady state sends the API server no LIST and no GET: its load no longer grows with
jobs x time. kopf fills every index from its initial LIST before it starts any daemon, and updates it on each watch
event (after its batching window, ~0.1 s). A cache may therefore lag the operator's own writes by a moment; the
runner (executor.py) covers that gap with what its own writes answered.

`ApiReads` serves the same interface from GET/LIST calls, for code run outside kopf (tests that drive one pass by
hand, tools): every call is a request, so the operator never uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from flywheel.contracts.labels import CHECKPOINT_LOCATION_ANNOTATION
from flywheel.kube.client import Kube
from flywheel.operator import manifests as m
from flywheel.operator.drain import NodeEntry
from flywheel.operator.drain import node_entry as drain_node_entry
from flywheel.policy.checkpoint_sharing import checkpoint_location
from flywheel.policy.observed import DirUser
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from flywheel.spec.sections import CheckpointSpec
from flywheel.spec.status import Phase

Obj = dict[str, Any]
LOST = "lost"  # a key of the nodes index: the names of the nodes that are not Ready
MARKS = "marks"  # and the cordoned or NoSchedule/NoExecute-tainted nodes (operator/drain.py node_entry)
USABLE = "usable"  # and the Ready ones with neither (where a spare may be moved: policy/spare_placement.py)
# A key of the jobs and the pods index, with a location: the jobs whose checkpoints land there, and the pods that
# may still write there ("@" is in no namespace's name).
CHECKPOINT = "@checkpoint"
DEFAULT_CHECKPOINT_DIR = str(CheckpointSpec.model_fields["dir"].default)


class ClusterReads(Protocol):
    async def job(self, namespace: str, name: str) -> Obj | None: ...
    async def pods(self, namespace: str, job: str) -> list[Obj]: ...
    async def service_exists(self, namespace: str, name: str) -> bool: ...
    async def lost_nodes(self) -> set[str]: ...
    async def node_marks(self) -> list[NodeEntry]: ...
    async def usable_nodes(self) -> frozenset[str]: ...
    async def jobs(self, namespaces: Sequence[str]) -> list[Obj]: ...
    async def all_pods(self, namespaces: Sequence[str]) -> list[Obj]: ...
    async def checkpoint_users(self, location: str) -> list[DirUser]: ...


# -- what the kopf index handlers store (handlers.py); pure, tested without kopf ----------------------------------
def job_entry(body: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """The job under (namespace, name); and, when its checkpoints land on a claim or in an object store, what
    policy/checkpoint_sharing.py reads of it under (CHECKPOINT, its location)."""
    meta = body["metadata"]
    # Without managedFields (one entry per writer on a real API server: kopf, the operator, kubectl): no pass reads
    # them, and the entry would hold them for every job as long as it lives.
    job = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    entry: dict[tuple[str, str], Any] = {(meta["namespace"], meta["name"]): job}
    found = dir_user(body)
    if found is not None:
        entry[(CHECKPOINT, found[0])] = found[1]
    return entry


def dir_user(body: Mapping[str, Any]) -> tuple[str, DirUser] | None:
    """(where a job's checkpoints land, the job as a user of that place), from its raw body; None: in its pods."""
    meta, spec = body["metadata"], body.get("spec") or {}
    ckpt = spec.get("checkpoint") or {}
    location = checkpoint_location(meta["namespace"], str(ckpt.get("dir") or DEFAULT_CHECKPOINT_DIR),
                                   str(ckpt.get("claimName") or ""))
    if location is None:
        return None
    finished = (body.get("status") or {}).get("phase") in (Phase.SUCCEEDED, Phase.FAILED)
    return location, DirUser(meta["namespace"], meta["name"], str(meta.get("creationTimestamp") or ""), finished,
                             str(meta.get("uid") or ""))


def location_users(jobs: Iterable[DirUser], pods: Iterable[Obj]) -> list[DirUser]:
    """The users of one checkpoint location: its jobs, and one user per deleted job for its pods (`pod_entry`'s
    under that location) that are still stopping there -- a pod whose owner is none of those jobs."""
    users = list(jobs)
    known = {u.uid for u in users}
    stopping: dict[tuple[str, str, str], list[str]] = {}
    for pod in pods:
        meta = pod["metadata"]
        owner = m.owner_job_uid(pod)
        if owner not in known:
            stopping.setdefault((meta["namespace"], meta["labels"][m.JOB_LABEL], owner), []).append(meta["name"])
    return users + [DirUser(namespace, name, "", False, uid, tuple(sorted(names)))
                    for (namespace, name, uid), names in sorted(stopping.items())]


# What pod_view, the runner and the health monitor read of a pod's metadata; its spec is only where it runs. The
# rest (containers, their env with the whole job spec, volumes, managedFields) is ~10x the size and stays out of
# the index, which holds every worker pod for the operator's life.
POD_METADATA = ("name", "namespace", "uid", "labels", "annotations", "creationTimestamp", "deletionTimestamp",
                "deletionGracePeriodSeconds", "resourceVersion", "ownerReferences")


def slim_pod(body: Mapping[str, Any]) -> Obj:
    meta, spec = body["metadata"], body.get("spec") or {}
    return {"apiVersion": body.get("apiVersion", "v1"), "kind": body.get("kind", "Pod"),
            "metadata": {k: meta[k] for k in POD_METADATA if k in meta},
            "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
            "status": body.get("status") or {}}


def pod_entry(body: Mapping[str, Any]) -> dict[tuple[str, str], Obj]:
    """A worker pod under (namespace, its job label): what the operator reads of it (`slim_pod`); and, while its
    container may still write there (not Succeeded or Failed), under (CHECKPOINT, where its checkpoints land)."""
    meta, pod = body["metadata"], slim_pod(body)
    entry = {(meta["namespace"], meta["labels"][m.JOB_LABEL]): pod}
    location = (meta.get("annotations") or {}).get(CHECKPOINT_LOCATION_ANNOTATION)
    if location and pod["status"].get("phase") not in (Phase.SUCCEEDED, Phase.FAILED):
        entry[(CHECKPOINT, location)] = pod
    return entry


def service_entry(body: Mapping[str, Any]) -> dict[tuple[str, str], bool]:
    meta = body["metadata"]
    return {(meta["namespace"], meta["name"]): True}


def node_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """A lost node under LOST, a cordoned or tainted one under MARKS (drain ahead), a Ready one with neither under
    USABLE (a node under no key any more: kopf drops what it had stored before)."""
    name = str(body["metadata"]["name"])
    lost = bool(m.lost_nodes([dict(body)]))
    out: dict[str, Any] = {LOST: name} if lost else {}
    marks = drain_node_entry(body)
    if marks is not None:
        out[MARKS] = marks
    elif not lost:
        out[USABLE] = name
    return out


def _values(index: Mapping[Any, Iterable[Any]], key: Any) -> list[Any]:
    store = index.get(key)
    return list(store) if store is not None else []


def _in(namespaces: Sequence[str], obj: Obj) -> bool:
    return not namespaces or obj["metadata"].get("namespace") in namespaces


class WatchCaches:
    """`ClusterReads` over kopf's indices (handlers.py): Mapping[key, Store of values], kept current by kopf."""

    def __init__(self, jobs: Mapping[Any, Iterable[Any]], pods: Mapping[Any, Iterable[Any]],
                 services: Mapping[Any, Iterable[Any]], nodes: Mapping[Any, Iterable[Any]]) -> None:
        self._jobs, self._pods, self._services, self._nodes = jobs, pods, services, nodes

    async def job(self, namespace: str, name: str) -> Obj | None:
        found = _values(self._jobs, (namespace, name))
        return found[0] if found else None

    async def pods(self, namespace: str, job: str) -> list[Obj]:
        return _values(self._pods, (namespace, job))

    async def service_exists(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._services

    async def lost_nodes(self) -> set[str]:
        return set(_values(self._nodes, LOST))

    async def node_marks(self) -> list[NodeEntry]:
        return _values(self._nodes, MARKS)

    async def usable_nodes(self) -> frozenset[str]:
        return frozenset(_values(self._nodes, USABLE))

    async def jobs(self, namespaces: Sequence[str]) -> list[Obj]:
        return [o for key, store in list(self._jobs.items()) if key[0] != CHECKPOINT for o in store
                if _in(namespaces, o)]

    async def checkpoint_users(self, location: str) -> list[DirUser]:
        return location_users(_values(self._jobs, (CHECKPOINT, location)), _values(self._pods, (CHECKPOINT, location)))

    async def all_pods(self, namespaces: Sequence[str]) -> list[Obj]:
        return [o for key, store in list(self._pods.items()) if key[0] != CHECKPOINT for o in store
                if _in(namespaces, o)]


class ApiReads:
    """`ClusterReads` by GET/LIST, one request per call: for passes driven outside kopf (tests), never the operator."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def job(self, namespace: str, name: str) -> Obj | None:
        return await self.kube.get(Kube.custom(GROUP, VERSION, namespace, PLURAL, name))

    async def pods(self, namespace: str, job: str) -> list[Obj]:
        return await self.kube.list(Kube.core(namespace, "pods"), f"{m.JOB_LABEL}={job}")

    async def service_exists(self, namespace: str, name: str) -> bool:
        return await self.kube.get(Kube.core(namespace, "services", name)) is not None

    async def lost_nodes(self) -> set[str]:
        return m.lost_nodes(await self.kube.list("/api/v1/nodes"))

    async def node_marks(self) -> list[NodeEntry]:
        entries = (drain_node_entry(n) for n in await self.kube.list("/api/v1/nodes"))
        return [e for e in entries if e is not None]

    async def usable_nodes(self) -> frozenset[str]:
        entries = map(node_entry, await self.kube.list("/api/v1/nodes"))
        return frozenset(e[USABLE] for e in entries if USABLE in e)

    async def _list(self, all_path: str, ns_path: str, namespaces: Sequence[str], selector: str = "") -> list[Obj]:
        if not namespaces:
            return await self.kube.list(all_path, selector)
        return [o for ns in namespaces for o in await self.kube.list(ns_path.format(ns=ns), selector)]

    async def jobs(self, namespaces: Sequence[str]) -> list[Obj]:
        return await self._list(f"/apis/{GROUP}/{VERSION}/{PLURAL}",
                                f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}", namespaces)

    async def all_pods(self, namespaces: Sequence[str]) -> list[Obj]:
        return await self._list("/api/v1/pods", "/api/v1/namespaces/{ns}/pods", namespaces, m.JOB_LABEL)

    async def checkpoint_users(self, location: str) -> list[DirUser]:
        found = (dir_user(job) for job in await self.jobs(()))
        pods = (e.get((CHECKPOINT, location)) for e in map(pod_entry, await self.all_pods(())))
        return location_users((user for at, user in filter(None, found) if at == location), filter(None, pods))
