"""A JobSource held in memory, for tests and benchmarks of the app without a cluster: put and remove objects by
hand (plain dicts, as the Kubernetes API returns them)."""

from __future__ import annotations

from typing import Any

from flywheel.api.cache import IndexedStore, object_key

Obj = dict[str, Any]


class MemorySource(IndexedStore):
    def _table(self, kind: str) -> dict[tuple[str, str], Obj]:
        return {"job": self._jobs, "pod": self._pods, "event": self._events}[kind]

    def put(self, kind: str, obj: Obj) -> None:
        with self._lock:
            self._table(kind)[object_key(obj)] = obj

    def remove(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._table(kind).pop((namespace, name), None)

    def ready(self) -> bool:
        return True
