"""Restarts of every worker's ranks in place, in etcd: the operator's request and an agent's following of it.

A hang while every worker's agent is alive is answered without recreating a pod (policy/failure_decision.py): the
operator relabels the pods to the new worker generation G, then PUTs `/flywheel/restart/<run_id>/ranks` =
{"generation": G, "reason": "..."} (`put_request`; no lease). Each agent follows that key (`RankRestartFollower`,
started by the etcd-v3 rendezvous handler before it registers its liveness key, agent/rendezvous/handler.py): a
request for a generation newer than the last one it served makes it SIGKILL its ranks and start them again, in a
new rendezvous round of the same agents (agent/launch.py).

What the key holds when an agent starts is taken as served: a request left from an older generation (before its pod
was recreated) never restarts a new agent's ranks, and the operator asks only agents whose liveness keys it saw,
i.e. agents already following. A later request overwrites the key (generations only grow); the run's cleanup
(`liveness.delete_run`) deletes it.

Torch-free, like liveness.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from . import keys
from .prefix_watch import PrefixWatch
from .session import EtcdSession

log = logging.getLogger(__name__)

REQUEST_NAME = keys.rank_restart_key("run").rsplit(b"/", 1)[-1].decode()  # the key's last path segment


@dataclass(frozen=True)
class RankRestartRequest:
    generation: int  # the worker generation the restarted ranks belong to (status.workerGeneration)
    reason: str = ""  # why, in words (the hang finding)


def encode_request(request: RankRestartRequest) -> bytes:
    return json.dumps({"generation": request.generation, "reason": request.reason}).encode()


def decode_request(value: bytes) -> RankRestartRequest | None:
    """The request, or None for a value that is not one (a generation must be a positive integer)."""
    try:
        info = json.loads(value)
        generation = int(info["generation"]) if isinstance(info, dict) else 0
    except (ValueError, TypeError, KeyError):
        return None
    return RankRestartRequest(generation, str(info.get("reason", ""))) if generation > 0 else None


async def put_request(session: EtcdSession, run_id: str, request: RankRestartRequest) -> None:
    """The operator's request (idempotent: the same generation again is the same request)."""
    await session.call_async(lambda c: c.put(keys.rank_restart_key(run_id), encode_request(request)))


async def read_request(session: EtcdSession, run_id: str) -> RankRestartRequest | None:
    kv = await session.call_async(lambda c: c.get(keys.rank_restart_key(run_id)))
    return decode_request(kv.value) if kv is not None else None


def watch_request(endpoints: str | EtcdSession, run_id: str,
                  on_change: Callable[[RankRestartRequest | None], None]) -> PrefixWatch[RankRestartRequest]:
    """Follow the run's request; `on_change(request or None)` on the session's loop thread (keep it quick)."""
    return PrefixWatch(endpoints, keys.restart_prefix(run_id), lambda kv: decode_request(bytes(kv.value)),
                       lambda entries: on_change(entries.get(REQUEST_NAME)), "rank restart requests")


class RankRestartFollower:
    """One agent's view of the run's request: `take()` returns a request not served yet (once), else None; it
    only reads memory, so the agent's monitor loop may call it every interval."""

    def __init__(self, session: EtcdSession, run_id: str) -> None:
        self._lock = threading.Lock()
        self._pending: RankRestartRequest | None = None
        self._served: int | None = None  # the newest generation served; None: the first request seen is
        try:  # what the key holds now was meant for the agents before this one: served
            timeout = session.rpc_timeout
            current = session.run(asyncio.wait_for(read_request(session, run_id), timeout), timeout=timeout + 1)
            self._served = current.generation if current is not None else 0
        except Exception as exc:  # noqa: BLE001 - etcd unreachable: the watch's first listing is the baseline
            log.warning("could not read the rank restart request of run %s: %s", run_id, exc)
        self._watch = watch_request(session, run_id, self._changed)

    def _changed(self, request: RankRestartRequest | None) -> None:
        if request is None:
            return
        with self._lock:
            if self._served is None:
                self._served = request.generation
            elif request.generation > max(self._served, self._pending.generation if self._pending else 0):
                self._pending = request

    def take(self) -> RankRestartRequest | None:
        """The request not served yet, now served (None: none). Also what a restart of the ranks for another
        reason calls once its new ranks started: a request seen before they started is served by them."""
        with self._lock:
            request, self._pending = self._pending, None
            if request is not None:
                self._served = max(self._served or 0, request.generation)
            return request

    def stop(self) -> None:
        self._watch.stop()
