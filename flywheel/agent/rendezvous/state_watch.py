"""A rendezvous round that moves when its state changes, not on the next poll.

torch's DynamicRendezvousHandler polls the backend while it waits for a round to change (`_delay(1)` in its op
executor, here every RENDEZVOUS_POLL_SECONDS, rank_order.py) and serves its reads from a copy up to as old; a
restart waits through up to three such polls (the survivor's monitor notices the joiner, the joiner sees the new
round, the last joiner sees it complete): ~0.4 s of a drained node's ~1.1 s stall on the test cluster. The agent
watches the state key instead: a change drops the handler's cached copy and wakes the waiting poll at once. The
polls stay as the fallback (a watch broken by an etcd restart, a compaction), every RENDEZVOUS_POLL_SECONDS.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from flywheel import torch_compat
from flywheel.etcd.session import EtcdSession

log = logging.getLogger(__name__)


class RendezvousStateWatch:
    def __init__(self, session: EtcdSession, key: bytes, handler: Any) -> None:
        self._session, self._key, self._handler = session, key, handler
        self._changed = threading.Event()
        self._task = session.submit(self._follow())

    def wait(self, seconds: float) -> None:
        """The op executor's poll delay: until the state changes, `seconds` at the most."""
        self._changed.wait(seconds)
        self._changed.clear()

    def stop(self) -> None:
        self._task.cancel()

    def _notify(self) -> None:
        torch_compat.drop_rendezvous_state_cache(self._handler)  # before the wake-up: the next read is fresh
        self._changed.set()

    async def _follow(self) -> None:
        while True:
            try:
                watch = await self._session.client.watch(self._key)
                self._notify()  # what changed before the watch began is read by the next poll now
                async for _ in watch:
                    self._notify()
                await asyncio.sleep(0.1)  # the stream ended without an error (client replaced): watch again
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - etcd restarts: the polls go on meanwhile
                log.debug("rendezvous state watch interrupted (%s: %s); watching again", type(exc).__name__, exc)
                await asyncio.sleep(0.3)
