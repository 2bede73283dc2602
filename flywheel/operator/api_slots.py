"""The operator's API client: the Kubernetes client (flywheel/kube/client.py) with at most REQUESTS_IN_FLIGHT of its
requests under way at once; the others wait for a slot.

Each request under way holds an HTTP/1.1 connection of its own, and a connection once opened keeps its TLS state
and buffers until it has idled for the pool's keep-alive (15 s). In a burst of 500 new jobs the runners' creates,
status writes and events kept up to ~100 open (the client library's pool limit); bounded to 64, the operator's RSS
peak in that burst fell from 203 to 179 MB (bench/operator_scale's bed). 32 gave 172 MB but held a burst of 100
jobs to ~19 jobs/s against ~24 unbounded (requests waited for a slot while the API server was slowest, and the
operator spent ~30% more CPU per job). client-go sends a controller's requests over one HTTP/2 connection;
kube-apiserver serves 400 reads and 200 writes at once by default.
kopf's patches and watches go through kopf's own session, not this one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from flywheel.kube.auth import Connection, Credentials
from flywheel.kube.client import Kube

REQUESTS_IN_FLIGHT = 64


class OperatorKube(Kube):
    def __init__(self, source: Connection | Credentials, in_flight: int = REQUESTS_IN_FLIGHT) -> None:
        super().__init__(source)
        self.slots = asyncio.Semaphore(in_flight)

    async def request(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        async with self.slots:
            return await super().request(method, path, body, params, content_type)
