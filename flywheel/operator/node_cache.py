"""Lost nodes, listed once for all jobs.

Every job's pass needs the set of nodes that are not Ready (their pods are lost, not merely silent). Each pass
listing every node made the operator's steady load jobs x nodes per tick: 500 jobs on a 1,000-node cluster would
LIST half a million node objects a second. One list serves every pass within `max_age` seconds, and concurrent
passes share the one request in flight. A second of staleness is what the per-job tick already allowed.
"""

from __future__ import annotations

import asyncio
import time

from flywheel.operator import manifests as m
from flywheel.operator.kube import Kube


class LostNodes:
    def __init__(self, kube: Kube, max_age: float = 1.0) -> None:
        self.kube, self.max_age = kube, max_age
        self._value: set[str] = set()
        self._at = float("-inf")
        self._inflight: asyncio.Future[set[str]] | None = None

    async def get(self) -> set[str]:
        if time.monotonic() - self._at < self.max_age:
            return self._value
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._list())
        inflight = self._inflight
        try:
            return await asyncio.shield(inflight)
        finally:
            if self._inflight is inflight and inflight.done():
                self._inflight = None

    async def _list(self) -> set[str]:
        started = time.monotonic()
        value = m.lost_nodes(await self.kube.list("/api/v1/nodes"))
        self._value, self._at = value, started
        return value
