"""Deletions that happened while a kopf watch was down: reported as DELETED events when kopf lists again.

Why (kopf 1.45.2, kopf/_cogs/clients/watching.py): when a watch ends with 410 Gone (its resourceVersion is too old:
an API server restart, a control-plane upgrade, a reconnect to another replica), `infinite_watch` lists the resource
again and yields each listed object as `{'type': None, 'object': ...}`, then `Bookmark.LISTED`, then the watch
events. kopf's indices (kopf/_core/engines/indexing.py) drop an object only on a DELETED event, and its queueing
(kopf/_core/reactor/queueing.py) never compares a new listing with what it knew. So an object deleted during the
gap stayed in the operator's indices (caches.py) until the operator restarted: a ghost Terminating pod held back a
new worker group, a ghost Running pod held its replica index, a deleted node stayed usable for spare moves.
client-go's Reflector instead replaces its store on a relist, which deletes what the new listing lacks; this does the
same for kopf.

`install()` replaces `kopf._cogs.clients.watching.infinite_watch` (kopf's queueing calls it as a module attribute
when each resource's watcher starts, after the startup handlers) with a wrapper that, per watch stream, remembers
the objects it has passed on and, at each `Bookmark.LISTED`, first yields `{'type': 'DELETED', 'object': <what it
remembered>}` for every remembered object the listing just ended did not hold. It only reads kopf's stream: no
request of its own.

What is remembered, per object: by default its apiVersion/kind and a few metadata fields (`KEPT_METADATA`): what
kopf needs to drop it (namespace, name, uid) and to match a handler's `labels=` filter (the pod and Service event
handlers in handlers.py), the ownerReferences (`sweep_after_pod`) and the resourceVersion. They are references into
the last body seen, no copies: a pod's are the same objects its index entry (`caches.slim_pod`) holds. Annotations
are left out (nothing reads them from a deletion here; a handler filtering on annotations would miss a synthetic
DELETED). For the API groups given to `install(whole_groups=...)` (the TrainingJobs) the whole last body is kept,
by reference: kopf's job index holds the same dicts, and a job's daemon reads its spec on its way out (`forget_run`).
A synthetic body without a deletionTimestamp gets one (now), as the object was deleted: kopf stops an object's
daemons on a deletion only when it sees one.

Every object passes on without its `metadata.managedFields` (one entry per writer, each a tree of the fields it
set: a third of a job's body on a real API server, a status write's entry listing every status field). Neither kopf
nor the operator reads them, and kopf keeps each job's last body for its daemon (as this wrapper does): without
them, the bodies held for 500 jobs are ~10 MB smaller.

A listing is the events of type None up to the next `Bookmark.LISTED` (an empty one has none). A listing that
fails half-way is listed again by kopf without a LISTED in between: the two count as one listing (their union), so
an object the first half held but that was deleted before the retry goes at the next relist, never a live one now.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any, cast

from kopf._cogs.clients import watching
from kopf._cogs.structs import references

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Event = Any  # what kopf's watch stream yields: `watching.Bookmark` or a raw event {'type': ..., 'object': {...}}
WatchFn = Callable[..., AsyncIterator[Event]]

KEPT_METADATA = ("name", "namespace", "uid", "labels", "ownerReferences", "resourceVersion", "deletionTimestamp",
                 "deletionGracePeriodSeconds")
MAX_NAMES_LOGGED = 10


def remembered(obj: Mapping[str, Any], whole: bool) -> Obj:
    """What is kept of an object until its deletion: the body itself (`whole`), or its apiVersion, kind and
    `KEPT_METADATA` (references into `obj`, not copies)."""
    if whole:
        return cast(Obj, obj)
    meta = obj.get("metadata") or {}
    kept: Obj = {"metadata": {key: meta[key] for key in KEPT_METADATA if key in meta}}
    for key in ("apiVersion", "kind"):
        if key in obj:
            kept[key] = obj[key]
    return kept


def deleted_event(kept: Mapping[str, Any], resource: references.Resource, now: str) -> Obj:
    """The synthetic DELETED event for a remembered object (new dicts: what is remembered may be shared)."""
    meta = dict(kept.get("metadata") or {})
    meta.setdefault("deletionTimestamp", now)
    body: Obj = {**kept, "metadata": meta}
    body.setdefault("apiVersion", f"{resource.group}/{resource.version}" if resource.group else resource.version)
    if resource.kind:
        body.setdefault("kind", resource.kind)
    return {"type": "DELETED", "object": body}


def _uid(event: Mapping[str, Any]) -> str | None:
    obj = event.get("object")
    uid = obj.get("metadata", {}).get("uid") if isinstance(obj, Mapping) else None
    return str(uid) if uid else None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile_relists(stream: AsyncIterator[Event], resource: references.Resource,
                            namespace: str | None = None, whole: bool = False) -> AsyncIterator[Event]:
    """Pass `stream` (one resource's kopf watch stream) on, adding a DELETED event for each object a relisting
    lacks, right before its `Bookmark.LISTED`; see the module's docstring."""
    known: dict[str, Obj] = {}  # uid -> what is remembered of each object passed on and not deleted since
    listing: set[str] | None = None  # the uids of the listing in progress; None: none in progress
    async with contextlib.aclosing(cast(Any, stream)):
        async for event in stream:
            if event is watching.Bookmark.LISTED:
                gone = [k for k in known if k not in (listing or ())]
                if gone:
                    now, names = _now(), []
                    for gone_uid in gone:
                        kept = known.pop(gone_uid)
                        names.append(str(kept.get("metadata", {}).get("name")))
                        yield deleted_event(kept, resource, now)
                    where = f"in {namespace!r}" if namespace is not None else "cluster-wide"
                    shown = ", ".join(names[:MAX_NAMES_LOGGED]) + (", ..." if len(names) > MAX_NAMES_LOGGED else "")
                    log.info(f"relisted {resource.plural} {where}: dropping {len(gone)} deleted while the watch was "
                             f"down (no DELETED event was seen): {shown}")
                listing = None
            elif isinstance(event, Mapping) and (uid := _uid(event)) is not None:
                event["object"]["metadata"].pop("managedFields", None)  # read by nothing here (the docstring)
                kind = event.get("type")
                if kind == "DELETED":
                    known.pop(uid, None)
                    if listing is not None:
                        listing.discard(uid)
                else:  # listed (None), ADDED, MODIFIED
                    known[uid] = remembered(event["object"], whole)
                    if kind is None:
                        listing = set() if listing is None else listing
                    if listing is not None:
                        listing.add(uid)
            yield event


def install(whole_groups: Collection[str] = ()) -> None:
    """Wrap kopf's `infinite_watch` with `reconcile_relists` (once; kopf's watchers started after this use it).
    Objects of `whole_groups` (API groups) are remembered whole, others trimmed (`remembered`)."""
    original: WatchFn = watching.infinite_watch
    if getattr(original, "reconciles_relists", False):
        return
    groups = frozenset(whole_groups)

    @functools.wraps(original)
    async def infinite_watch(**kwargs: Any) -> AsyncIterator[Event]:
        resource: references.Resource = kwargs["resource"]
        async for event in reconcile_relists(original(**kwargs), resource, kwargs.get("namespace"),
                                             whole=resource.group in groups):
            yield event

    setattr(infinite_watch, "reconciles_relists", True)  # a marker: installed once
    setattr(watching, "infinite_watch", infinite_watch)  # (mypy refuses assigning to a function)
