"""Following one etcd prefix as a whole: the liveness keys (liveness.py) and the progress records
(progress_watch.py) are both read this way.

Level-triggered: `on_change(current)` gets every current entry (by the key's last path segment) once at start and
after each change, so a consumer never replays missed events; a set that did not change is not reported again. A
broken watch (etcd restart, compaction, a replaced client) lists again and carries on. `on_change` runs on the
session's loop thread: keep it quick (hand off with `loop.call_soon_threadsafe` or a queue).
"""

from __future__ import annotations

import asyncio
import logging
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
                 on_change: Callable[[dict[str, T]], None], what: str) -> None:
        self._ref = SessionRef(endpoints)
        self._prefix, self._parse, self._on_change, self._what = prefix, parse, on_change, what
        self._current: dict[str, T] | None = None
        self._stopped = False
        self._task = self._ref.session.submit(self._follow())

    @property
    def current(self) -> dict[str, T]:
        return dict(self._current or {})

    def stop(self) -> None:
        self._stopped = True
        self._task.cancel()
        self._ref.__exit__()

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
        session = self._ref.session
        while not self._stopped:
            try:
                listing = await session.call_async(lambda c: c.get_prefix(self._prefix))
                entries = self._entries(listing)
                self._publish(entries)
                watch = await session.client.watch_prefix(self._prefix, start_revision=listing.header.revision + 1)
                async for event in watch:
                    entry = None if event.kind == "DELETE" else self._parse(event.kv)
                    if entry is None:
                        entries.pop(_name(event.kv.key), None)
                    else:
                        entries[_name(event.kv.key)] = entry
                    self._publish(entries)
                await asyncio.sleep(0.1)  # the stream ended without an error (client replaced): list again
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd restarts, compaction: list again after a pause
                log.debug("%s interrupted (%s: %s); listing again", self._what, type(exc).__name__, exc)
                await asyncio.sleep(0.3)
