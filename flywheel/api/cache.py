"""Where the API reads from: a watch-backed cache of TrainingJobs, their pods and events (cluster); the local run
has its own source (localrun.py). Requests never call the Kubernetes API for reads.

The cluster cache is three asyncio tasks on the app's event loop, one watch per kind through the product's
Kubernetes client (flywheel/kube): list, then watch from the list's resourceVersion, resuming each watch from the
last event's or bookmark's version; relist on 410 Gone (the version is too old) or any other failure.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

from flywheel.contracts.labels import JOB_LABEL
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION

Obj = dict[str, Any]
Key = tuple[str, str]
log = logging.getLogger(__name__)


def object_key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "default", meta.get("name") or ""


class JobSource(Protocol):
    """What the app reads. Objects are plain dicts as the Kubernetes API returns them (camelCase). A changed
    object is a new dict, never one edited in place: the app memoizes what it derives per object."""

    def ready(self) -> bool: ...
    def jobs(self) -> list[Obj]: ...
    def job(self, namespace: str, name: str) -> Obj | None: ...
    def pods(self, namespace: str, job: str) -> list[Obj]: ...
    def events(self, namespace: str, names: Iterable[str]) -> list[Obj]: ...


class IndexedStore:
    """The three indexes a source keeps, and the reads the app makes on them (under one lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[Key, Obj] = {}
        self._pods: dict[Key, Obj] = {}
        self._events: dict[Key, Obj] = {}

    def jobs(self) -> list[Obj]:
        with self._lock:
            return list(self._jobs.values())

    def job(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._jobs.get((namespace, name))

    def pods(self, namespace: str, job: str) -> list[Obj]:
        with self._lock:
            return [p for (ns, _), p in self._pods.items()
                    if ns == namespace and (p["metadata"].get("labels") or {}).get(JOB_LABEL) == job]

    def events(self, namespace: str, names: Iterable[str]) -> list[Obj]:
        wanted = set(names)
        with self._lock:
            return [e for (ns, _), e in self._events.items()
                    if ns == namespace and (e.get("involvedObject") or {}).get("name") in wanted]


class Watcher(Protocol):
    """What a reflector needs of the client (flywheel.kube.client.Kube; the unit tests pass a fake)."""

    async def list_versioned(self, path: str, label_selector: str = "") -> tuple[list[Obj], str]: ...
    def watch(self, path: str, resource_version: str, label_selector: str = "",
              timeout_seconds: int = 60) -> AsyncIterator[Obj]: ...


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


def apply_event(store: dict[Key, Obj], kind: str, obj: Obj) -> None:
    """One watch event into the store (BOOKMARK and unknown types change nothing)."""
    if kind == "DELETED":
        store.pop(object_key(obj), None)
    elif kind in ("ADDED", "MODIFIED"):
        store[object_key(obj)] = obj


class Reflector:
    """One kind's list + watch into `store` (under `lock`), until cancelled. Keeps raw dicts."""

    def __init__(self, name: str, kube: Watcher, path: str, store: dict[Key, Obj], lock: threading.Lock,
                 label_selector: str = "", watch_seconds: int = 60, retry_seconds: float = 1.0) -> None:
        self.name, self._kube, self._path, self._selector = name, kube, path, label_selector
        self._store, self._lock = store, lock
        self._watch_seconds, self._retry_seconds = watch_seconds, retry_seconds
        self.synced = asyncio.Event()
        self.relists = 0

    async def run(self) -> None:
        while True:
            try:
                version = await self._relist()
                while True:  # a watch ends after watch_seconds: resume from the last version seen
                    version = await self._watch(version)
            except Expired as err:
                log.info("api cache %s: %s; relisting", self.name, err)
            except Exception as err:  # noqa: BLE001 - any failure: back off, relist from scratch
                log.warning("api cache %s: %s; relisting", self.name, err)
                await asyncio.sleep(self._retry_seconds)

    async def _relist(self) -> str:
        items, version = await self._kube.list_versioned(self._path, self._selector)
        fresh = {object_key(o): o for o in items}
        with self._lock:
            self._store.clear()
            self._store.update(fresh)
        self.relists += 1
        self.synced.set()
        return version

    async def _watch(self, version: str) -> str:
        async for event in self._kube.watch(self._path, version, self._selector, self._watch_seconds):
            kind, obj = str(event.get("type") or ""), event.get("object") or {}
            if kind == "ERROR":  # a Status object; 410 Gone: our resourceVersion is too old
                if obj.get("code") == 410:
                    raise Expired(obj.get("message") or "410 Gone")
                raise RuntimeError(f"watch error: {obj.get('message', obj)}")
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            with self._lock:
                apply_event(self._store, kind, obj)
        return version


class KubeCache(IndexedStore):
    """TrainingJobs, pods labelled `flywheel.dev/job`, and events, kept current by three watches. `start()` and
    `stop()` run on the event loop that serves the app."""

    def __init__(self, kube: Watcher, namespace: str | None = None, watch_seconds: int = 60) -> None:
        super().__init__()
        where = f"/namespaces/{namespace}" if namespace else ""
        self._reflectors = [
            Reflector("trainingjobs", kube, f"/apis/{GROUP}/{VERSION}{where}/{PLURAL}", self._jobs, self._lock,
                      watch_seconds=watch_seconds),
            Reflector("pods", kube, f"/api/v1{where}/pods", self._pods, self._lock, JOB_LABEL, watch_seconds),
            Reflector("events", kube, f"/api/v1{where}/events", self._events, self._lock,
                      watch_seconds=watch_seconds)]
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> KubeCache:
        self._tasks = [asyncio.create_task(r.run(), name=f"api-cache-{r.name}") for r in self._reflectors]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def wait_synced(self, timeout: float = 30.0) -> bool:
        try:
            await asyncio.wait_for(asyncio.gather(*(r.synced.wait() for r in self._reflectors)), timeout)
        except TimeoutError:
            return False
        return True

    def ready(self) -> bool:
        return all(r.synced.is_set() for r in self._reflectors)
