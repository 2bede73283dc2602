"""A controller loop as kube-controller-manager's informers drive theirs: a pass after the store's writes to the
resources it watches (a burst settled into one pass), and once every `resync_seconds` besides."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from tests.k8s_emulator.resources import ResourceKey

if TYPE_CHECKING:
    from tests.k8s_emulator.store import Event, Store

SETTLE_SECONDS = 0.05  # a burst of writes waits this long to become one pass


class WokenLoop:
    """Subclasses name what they watch (`watched`) and do one pass in `run_pass`; a pass that meets a conflict
    calls `again()` to be run once more. `noticed` sees each write to a watched resource as it happens (a
    controller that keeps its own work queue)."""

    watched: tuple[ResourceKey, ...] = ()

    def __init__(self, store: Store, resync_seconds: float = 1.0) -> None:
        self.store = store
        self.resync_seconds = resync_seconds
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        store.on_changed.append(self._changed)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def again(self) -> None:
        self._dirty.set()

    def run_pass(self) -> None:
        raise NotImplementedError

    def noticed(self, event: Event) -> None:
        """A write to a watched resource; the pass it wakes comes after SETTLE_SECONDS."""

    def _changed(self, event: Event) -> None:
        if event.key in self.watched:
            self.noticed(event)
            self._dirty.set()

    async def _loop(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that meets the event being
            # set (a store write at stop), and this loop then never ended (the test cluster's stop timed out).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.resync_seconds):
                    await self._dirty.wait()
            self._dirty.clear()
            await asyncio.sleep(SETTLE_SECONDS)
            self._dirty.clear()
            self.run_pass()
