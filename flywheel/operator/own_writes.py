"""A runner's own writes, laid over the watch-fed caches until the caches show them.

kopf's indices (caches.py) learn of a write from the watch a moment after the API answered it. A pass in that gap
must not decide from the older picture: it would create a worker a second time, count a pod it just created as
missing, or take a decision on a status it has already replaced. So each write the runner makes is remembered here
and the pass reads the cache with these laid over it:

- the job: after a status write, while the cache still shows a resourceVersion this runner wrote over, the object
  the write answered (its resourceVersion is the precondition of the next write);
- a pod it created, until the cache shows that pod (at most `PENDING_SECONDS`: a pod deleted before its watch
  event was processed never shows);
- a pod it deleted, marked terminating until the cache shows it so or drops it;
- a pod it relabelled, with those labels until the cache shows them.

A create answered 409 AlreadyExists stays the API server's truth in any case: a pod is never created twice.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flywheel.contracts.timefmt import rfc3339

Obj = dict[str, Any]
PENDING_SECONDS = 30.0  # how long a write may stay unseen in the cache before the cache is believed again


def _meta(obj: Obj) -> dict[str, Any]:
    meta: dict[str, Any] = obj["metadata"]
    return meta


@dataclass
class OwnWrites:
    superseded: set[str] = field(default_factory=set)  # job resourceVersions this runner wrote over
    job_written: Obj | None = None  # the job as the last status write answered
    created: dict[str, tuple[Obj, float]] = field(default_factory=dict)  # pod name -> (as created, when)
    deleted: dict[str, float] = field(default_factory=dict)  # pod uid -> when deleted
    relabelled: dict[str, tuple[dict[str, str], float]] = field(default_factory=dict)  # pod uid -> (labels, when)

    # -- the job ------------------------------------------------------------------------------------------------
    def wrote_job(self, before: Obj, answer: Obj) -> None:
        self.superseded.add(str(_meta(before).get("resourceVersion")))
        self.job_written = answer

    def cache_shows_job(self, resource_version: str) -> None:
        """The cache holds the job at this version (its watch event): if it is the last write's, the overlay lets
        the written object go (a finished job may see no pass after its last write)."""
        if self.job_written is not None and str(_meta(self.job_written).get("resourceVersion")) == resource_version:
            self.superseded.clear()
            self.job_written = None

    def job(self, cached: Obj | None) -> Obj | None:
        if cached is None:
            return None
        if self.job_written is not None and str(_meta(cached).get("resourceVersion")) in self.superseded:
            return self.job_written
        self.superseded.clear()  # the cache shows our last write, or something newer: it is the truth again
        self.job_written = None
        return cached

    # -- pods ---------------------------------------------------------------------------------------------------
    def wrote_pod(self, answer: Obj, now: float) -> None:
        self.created[str(_meta(answer)["name"])] = (answer, now)

    def echoes_create(self, pod: Mapping[str, Any]) -> bool:
        """Whether a watch event shows a pod exactly as this runner's create answered it (the same uid and
        resourceVersion): the pass that created it already read it so, and a pass on the echo would find nothing
        new (two of a new job's ~7 passes were these). The cache holds it now (kopf updates its index before the
        event handlers), so the overlay lets it go."""
        name = str(pod["metadata"].get("name"))
        entry = self.created.get(name)
        if entry is None:
            return False
        meta, created = pod["metadata"], _meta(entry[0])
        if meta.get("uid") != created.get("uid") or meta.get("resourceVersion") != created.get("resourceVersion"):
            return False
        del self.created[name]
        return True

    def deleted_pod(self, uid: str, now: float) -> None:
        self.deleted.setdefault(uid, now)

    def relabelled_pod(self, uid: str, labels: dict[str, str], now: float) -> None:
        self.relabelled[uid] = (labels, now)

    def pods(self, cached: list[Obj], now: float) -> list[Obj]:
        """`cached` with this runner's unseen writes laid over it (copies where changed; `cached` is not touched)."""
        self._expire(now)
        uids = {str(_meta(p).get("uid")) for p in cached}
        self.deleted = {u: t for u, t in self.deleted.items() if u in uids}
        self.relabelled = {u: v for u, v in self.relabelled.items() if u in uids}
        out = [self._overlaid(p) for p in cached]
        by_name = {str(_meta(p)["name"]): i for i, p in enumerate(out)}
        for name, (created, _) in list(self.created.items()):
            i = by_name.get(name)
            if i is not None and _meta(out[i]).get("uid") == _meta(created).get("uid"):
                del self.created[name]  # seen: the cache is the truth for it now
            elif i is not None:
                out[i] = created  # the cache still shows the pod it replaced (deleted from the API already)
            else:
                out.append(created)
        return out

    def _overlaid(self, pod: Obj) -> Obj:
        meta = _meta(pod)
        uid = str(meta.get("uid"))
        labels = self.relabelled.get(uid)
        if labels is not None and all((meta.get("labels") or {}).get(k) == v for k, v in labels[0].items()):
            del self.relabelled[uid]
            labels = None
        deleted_at = self.deleted.get(uid)
        if deleted_at is not None and meta.get("deletionTimestamp"):
            del self.deleted[uid]
            deleted_at = None
        if labels is None and deleted_at is None:
            return pod
        pod = {**pod, "metadata": copy.deepcopy(meta)}
        if labels is not None:
            _meta(pod).setdefault("labels", {}).update(labels[0])
        if deleted_at is not None:
            _meta(pod)["deletionTimestamp"] = rfc3339(deleted_at)
        return pod

    def due(self) -> float | None:
        """When the oldest unseen write stops being laid over the cache (the cache is believed again)."""
        times = [t for _, t in self.created.values()] + list(self.deleted.values()) + \
            [t for _, t in self.relabelled.values()]
        return min(times) + PENDING_SECONDS if times else None

    def _expire(self, now: float) -> None:
        self.created = {k: v for k, v in self.created.items() if now - v[1] < PENDING_SECONDS}
        self.deleted = {k: t for k, t in self.deleted.items() if now - t < PENDING_SECONDS}
        self.relabelled = {k: v for k, v in self.relabelled.items() if now - v[1] < PENDING_SECONDS}
