"""The operator's follower of a run's progress keys (`/flywheel/progress/<run_id>/`, records: progress.py).

Like `WorkerWatch`: level-triggered, `on_change(records)` gets every current record by rank once at start and after
each change, and a broken watch (etcd restart, compaction) lists again. A deleted key (its writer's lease expired:
the process ended or stopped) simply leaves the set; the reader keeps what it learned from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from . import keys
from .liveness import _SessionRef
from .progress import ProgressRecord, decode
from .session import EtcdSession

log = logging.getLogger(__name__)

OnProgress = Callable[[dict[str, ProgressRecord]], None]


def _records_from(kvs: Iterable[Any]) -> dict[str, ProgressRecord]:
    records = {}
    for kv in kvs:
        record = decode(kv.value)
        if record is not None:
            records[kv.key.rsplit(b"/", 1)[-1].decode()] = record
    return records


class ProgressWatch:
    """`on_change` runs on the session's loop thread: keep it quick (hand off with `loop.call_soon_threadsafe`)."""

    def __init__(self, endpoints: str | EtcdSession, run_id: str, on_change: OnProgress) -> None:
        self._ref = _SessionRef(endpoints)
        self._prefix = keys.progress_prefix(run_id)
        self._on_change = on_change
        self._stopped = False
        self._task = self._ref.session.submit(self._follow())

    def stop(self) -> None:
        self._stopped = True
        self._task.cancel()
        self._ref.__exit__()

    def _publish(self, records: dict[str, ProgressRecord]) -> None:
        try:
            self._on_change(dict(records))
        except Exception:
            log.exception("on_change callback failed")

    async def _follow(self) -> None:
        session = self._ref.session
        while not self._stopped:
            try:
                listing = await session.call_async(lambda c: c.get_prefix(self._prefix))
                records = _records_from(listing)
                self._publish(records)
                watch = await session.client.watch_prefix(self._prefix, start_revision=listing.header.revision + 1)
                async for event in watch:
                    rank = event.kv.key.rsplit(b"/", 1)[-1].decode()
                    record = None if event.kind == "DELETE" else decode(event.kv.value)
                    if record is None:
                        records.pop(rank, None)
                    else:
                        records[rank] = record
                    self._publish(records)
                await asyncio.sleep(0.1)  # the stream ended without an error (client replaced): list again
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd restarts, compaction: list again after a pause
                log.debug("progress watch interrupted (%s: %s); listing again", type(exc).__name__, exc)
                await asyncio.sleep(0.3)


def watch_progress(endpoints: str | EtcdSession, run_id: str, on_change: OnProgress) -> ProgressWatch:
    """Start following the progress records of `run_id`; `.stop()` the returned watch when done."""
    return ProgressWatch(endpoints, run_id, on_change)
