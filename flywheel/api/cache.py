"""Where the API reads from: a watch-backed cache of TrainingJobs, their pods and events (cluster); the local run
has its own source (localrun.py). Requests never call the Kubernetes API for reads."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, cast

from flywheel.crd import GROUP, PLURAL, VERSION
from flywheel.labels import JOB_LABEL

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


class Reflector:
    """List, then watch from the list's resourceVersion; relist on any error or 410. Keeps raw dicts."""

    def __init__(self, name: str, lister: Callable[..., Any], store: dict[Key, Obj], lock: threading.Lock,
                 watch_seconds: int = 60) -> None:
        self.name, self._lister, self._store, self._lock = name, lister, store, lock
        self._watch_seconds = watch_seconds
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"api-cache-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    def _relist(self) -> str:
        resp = self._lister(_preload_content=False)
        body = json.loads(resp.data)
        fresh = {object_key(o): o for o in body.get("items") or []}
        with self._lock:
            self._store.clear()
            self._store.update(fresh)
        self.synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _run(self) -> None:
        from kubernetes import watch  # loaded only for a cluster cache

        while not self._stop.is_set():
            try:
                rv = self._relist()
                while not self._stop.is_set():
                    self._watch = cast(Any, watch).Watch()  # the kubernetes package is untyped
                    for event in self._watch.stream(self._lister, resource_version=rv,
                                                    timeout_seconds=self._watch_seconds,
                                                    allow_watch_bookmarks=True):
                        kind, obj = event["type"], event.get("raw_object") or {}
                        if kind == "ERROR":  # typically 410 Gone: our resourceVersion is too old
                            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        with self._lock:
                            if kind == "DELETED":
                                self._store.pop(object_key(obj), None)
                            elif kind in ("ADDED", "MODIFIED"):
                                self._store[object_key(obj)] = obj
                    rv = self._watch.resource_version or rv
            except Exception as err:  # noqa: BLE001 - any failure: back off, relist from scratch
                if self._stop.is_set():
                    return
                log.warning("api cache %s: %s; relisting", self.name, err)
                self._stop.wait(1.0)


class KubeCache(IndexedStore):
    """TrainingJobs, pods labelled `flywheel.dev/job`, and events, kept current by three watches."""

    def __init__(self, api_client: Any, namespace: str | None = None, watch_seconds: int = 60) -> None:
        from kubernetes import client

        super().__init__()
        custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        if namespace:
            def list_jobs(**kw: Any) -> Any:
                return custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, **kw)

            def list_pods(**kw: Any) -> Any:
                return core.list_namespaced_pod(namespace, label_selector=JOB_LABEL, **kw)

            def list_events(**kw: Any) -> Any:
                return core.list_namespaced_event(namespace, **kw)
        else:
            def list_jobs(**kw: Any) -> Any:
                return custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)

            def list_pods(**kw: Any) -> Any:
                return core.list_pod_for_all_namespaces(label_selector=JOB_LABEL, **kw)

            def list_events(**kw: Any) -> Any:
                return core.list_event_for_all_namespaces(**kw)
        # the watch helper picks the response type from the docstring: keep the client's
        list_jobs.__doc__ = custom.list_cluster_custom_object.__doc__
        list_pods.__doc__ = core.list_pod_for_all_namespaces.__doc__
        list_events.__doc__ = core.list_event_for_all_namespaces.__doc__
        self._reflectors = [Reflector("trainingjobs", list_jobs, self._jobs, self._lock, watch_seconds),
                            Reflector("pods", list_pods, self._pods, self._lock, watch_seconds),
                            Reflector("events", list_events, self._events, self._lock, watch_seconds)]

    def start(self) -> KubeCache:
        for r in self._reflectors:
            r.start()
        return self

    def stop(self) -> None:
        for r in self._reflectors:
            r.stop()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self._reflectors)

    def ready(self) -> bool:
        return all(r.synced.is_set() for r in self._reflectors)
