"""One etcd session for the whole operator, shared by every job's liveness watch, rendezvous reset and finalizer.

A session is a thread, an event loop and a gRPC channel (flywheel/etcd/session.py). One per job cost a blocking
connect on the operator's event loop for every new job and a thread per job; shared, a new job's watch is one more
coroutine on the session's loop. The session is created on first use, off the event loop, and again after a
failed attempt (etcd down at start-up must not stop the operator).
"""

from __future__ import annotations

import asyncio
import threading

from flywheel.etcd.session import EtcdSession


class SharedEtcd:
    def __init__(self, endpoints: str) -> None:
        self.endpoints = endpoints
        self._session: EtcdSession | None = None
        self._lock = threading.Lock()

    def get(self) -> EtcdSession:
        """The session, connecting on the first call (blocking: from a worker thread)."""
        with self._lock:
            if self._session is None:
                self._session = EtcdSession(self.endpoints, retry_seconds=10.0, name="flywheel-operator-etcd")
            return self._session

    async def session(self) -> EtcdSession:
        if self._session is not None:
            return self._session
        return await asyncio.get_running_loop().run_in_executor(None, self.get)

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
