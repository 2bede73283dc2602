"""Following one etcd prefix as a whole: the liveness keys (liveness.py) and the progress records
(progress_watch.py) are both read this way.

Level-triggered: `on_change(current)` gets every current entry (by the key's last path segment) once at start and
after each change, so a consumer never replays missed events; a set that did not change is not reported again. A
broken watch (etcd restart, compaction, a replaced client) lists again and carries on, and every watch lists again
each RESYNC_SECONDS (`list_and_watch`). `on_change` runs on the session's loop thread: keep it quick (hand off with
`loop.call_soon_threadsafe` or a queue).

Shared (`shared=True`, the operator's watches): one etcd watch per key root (`/flywheel/progress/`, ...) for every run
a session follows (PrefixHub), instead of a listing and a watch stream per run. Measured in the operator's burst of
300 jobs, three streams per job (liveness, progress, drain answers) took ~20% of its CPU in the etcd thread. A
worker's own watches stay per run: it must not receive every other run's keys.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from .session import EtcdSession

log = logging.getLogger(__name__)
T = TypeVar("T")


class SessionRef:
    """Use the caller's session, or open a private one for a single call and close it afterwards."""

    def __init__(self, endpoints: str | EtcdSession) -> None:
        self.owned = not isinstance(endpoints, EtcdSession)
        self.session = EtcdSession(endpoints, retry_seconds=10.0) if isinstance(endpoints, str) else endpoints

    def __enter__(self) -> EtcdSession:
        return self.session

    def __exit__(self, *exc: object) -> None:
        if self.owned:
            self.session.close()


def _name(key: bytes) -> str:
    return key.rsplit(b"/", 1)[-1].decode()


class PrefixWatch(Generic[T]):
    """`parse(kv)` turns a key-value (with `.key`, `.value`, `.lease`) into an entry, or None to leave it out."""

    def __init__(self, endpoints: str | EtcdSession, prefix: bytes, parse: Callable[[Any], T | None],
                 on_change: Callable[[dict[str, T]], None], what: str, *, shared: bool = False) -> None:
        """shared: follow `prefix` (<root><run>/) through the session's one watch of <root> (needs a session)."""
        self._ref = SessionRef(endpoints)
        self._prefix, self._parse, self._on_change, self._what = prefix, parse, on_change, what
        self._current: dict[str, T] | None = None
        self._stopped = False
        self._entries_now: dict[str, T] = {}
        self._hub: PrefixHub | None = None
        if shared and not self._ref.owned:
            self._hub = PrefixHub.of(self._ref.session, _root_of(prefix))
            self._hub.subscribe(self)
            self._task: Any = None
        else:
            self._task = self._ref.session.submit(self._follow())

    @property
    def current(self) -> dict[str, T]:
        return dict(self._current or {})

    def stop(self) -> None:
        self._stopped = True
        if self._hub is not None:
            self._hub.unsubscribe(self)
        else:
            self._task.cancel()
        self._ref.__exit__()

    # ---- fed by its own list_and_watch or by a PrefixHub (on the session's loop thread) ------------------------

    def _reset(self, kvs: Iterable[Any]) -> None:
        self._entries_now = self._entries(kvs)
        self._publish(self._entries_now)

    def _event(self, event: Any) -> None:
        entry = None if event.kind == "DELETE" else self._parse(event.kv)
        if entry is None:
            self._entries_now.pop(_name(event.kv.key), None)
        else:
            self._entries_now[_name(event.kv.key)] = entry
        self._publish(self._entries_now)

    def _entries(self, kvs: Iterable[Any]) -> dict[str, T]:
        parsed = ((_name(kv.key), self._parse(kv)) for kv in kvs)
        return {name: entry for name, entry in parsed if entry is not None}

    def _publish(self, entries: dict[str, T]) -> None:
        if entries == self._current:
            return
        self._current = dict(entries)
        try:
            self._on_change(dict(entries))
        except Exception:
            log.exception("%s: on_change callback failed", self._what)

    async def _follow(self) -> None:
        await list_and_watch(self._ref.session, self._prefix, self._reset, self._event, self._what)


def _root_of(prefix: bytes) -> bytes:
    """/flywheel/progress/<run>/ -> /flywheel/progress/"""
    return prefix.rstrip(b"/").rsplit(b"/", 1)[0] + b"/"


def _run_prefix(root: bytes, key: bytes) -> bytes:
    """The <root><run>/ a key lies under."""
    return root + key[len(root):].split(b"/", 1)[0] + b"/"


# A prefix is listed again at least this often, on a new stream (an informer's resync): one full run of the
# operator's tests saw a job's progress stop reaching its status after an etcd restart, its stream alive but silent.
# One range read per followed prefix every 10 s (a hub's: per key root, for all jobs).
RESYNC_SECONDS = 10.0


async def list_and_watch(session: EtcdSession, prefix: bytes, on_list: Callable[[Iterable[Any]], None],
                         on_event: Callable[[Any], None], what: str) -> None:
    """Follow `prefix` for ever: `on_list(kvs)` with a listing, then `on_event(event)` for each change from the
    listing's revision on; listed again after a broken stream and every RESYNC_SECONDS."""
    while True:
        try:
            listing = await session.call_async(lambda c: c.get_prefix(prefix))
            on_list(listing)
            watch = await session.client.watch_prefix(prefix, start_revision=listing.header.revision + 1)
            try:
                async with asyncio.timeout(RESYNC_SECONDS):
                    async for event in watch:
                        on_event(event)
                await asyncio.sleep(0.1)  # the stream ended without an error (client replaced): list again
            except TimeoutError:  # the periodic resync: list again, on a new stream
                await watch.cancel()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - etcd restarts, compaction: list again after a pause
            log.debug("%s interrupted (%s: %s); listing again", what, type(exc).__name__, exc)
            await asyncio.sleep(0.3)


class PrefixHub:
    """One watch of a key root for every PrefixWatch of a session under it (by <root><run>/). It keeps the root's
    current keys, so a watch subscribing later starts from them, and lists again after a broken watch and every
    RESYNC_SECONDS. Everything here runs on the session's loop thread."""

    def __init__(self, session: EtcdSession, root: bytes) -> None:
        self._session, self._root = session, root
        self._subscribers: dict[bytes, set[PrefixWatch[Any]]] = {}
        self._kvs: dict[bytes, dict[bytes, Any]] | None = None  # <root><run>/ -> key -> kv; None until listed
        self.listings = 0  # how many times the root was listed (the first, resyncs, after broken streams)
        self._pending: list[tuple[Callable[[PrefixWatch[Any]], None], PrefixWatch[Any]]] = []
        self._pending_lock = threading.Lock()
        self._task = session.submit(self._follow())

    @classmethod
    def of(cls, session: EtcdSession, root: bytes) -> PrefixHub:
        """The session's hub of `root` (it lives as long as the session: its watch ends with the session's loop)."""
        hub = session.prefix_hubs.get(root)
        if hub is None:
            hub = session.prefix_hubs[root] = cls(session, root)
        return hub

    def subscribe(self, watch: PrefixWatch[Any]) -> None:
        self._hand_over(self._add, watch)

    def unsubscribe(self, watch: PrefixWatch[Any]) -> None:
        self._hand_over(self._remove, watch)

    def _hand_over(self, change: Callable[[PrefixWatch[Any]], None], watch: PrefixWatch[Any]) -> None:
        """Queue a (un)subscription for the loop thread, in order; one wake-up of that thread per batch (a burst
        of new jobs subscribes hundreds of watches: a wake-up each was ~3% of the operator's CPU)."""
        with self._pending_lock:
            self._pending.append((change, watch))
            first = len(self._pending) == 1
        if first and not self._session.loop.is_closed():
            self._session.loop.call_soon_threadsafe(self._take_pending)

    def _take_pending(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for change, watch in pending:
            change(watch)

    def _add(self, watch: PrefixWatch[Any]) -> None:
        if watch._stopped:
            return
        self._subscribers.setdefault(watch._prefix, set()).add(watch)
        if self._kvs is not None:
            watch._reset(self._kvs.get(watch._prefix, {}).values())

    def _remove(self, watch: PrefixWatch[Any]) -> None:
        watchers = self._subscribers.get(watch._prefix)
        if watchers is not None:
            watchers.discard(watch)
            if not watchers:
                del self._subscribers[watch._prefix]

    def _list(self, kvs: Iterable[Any]) -> None:
        by_run: dict[bytes, dict[bytes, Any]] = {}
        for kv in kvs:
            by_run.setdefault(_run_prefix(self._root, bytes(kv.key)), {})[bytes(kv.key)] = kv
        self._kvs = by_run
        self.listings += 1
        for prefix, watchers in self._subscribers.items():
            for watch in list(watchers):
                watch._reset(by_run.get(prefix, {}).values())

    def _apply(self, event: Any) -> None:
        assert self._kvs is not None
        key = bytes(event.kv.key)
        prefix = _run_prefix(self._root, key)
        if event.kind == "DELETE":
            run = self._kvs.get(prefix)
            if run is not None:
                run.pop(key, None)
                if not run:
                    del self._kvs[prefix]
        else:
            self._kvs.setdefault(prefix, {})[key] = event.kv
        for watch in list(self._subscribers.get(prefix, ())):
            watch._event(event)

    async def _follow(self) -> None:
        await list_and_watch(self._session, self._root, self._list, self._apply, f"watch of {self._root.decode()}")
