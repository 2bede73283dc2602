"""Warm spares in etcd: a waiting spare's liveness key, the operator's view of them, and the promotion.

A spare's agent holds `/flywheel/spares/<run_id>/<spare_id>` under its own short-TTL lease while it waits, with
{"spare", "host", "pid", "since", "ready": true}: the operator's `watch_spares` knows from it which spares are up
with their trainer imported. It promotes one by writing `/flywheel/promote/<run_id>/<spare_id>` =
{"replica": "<index>", "env": {...}} (`promote`); the agent's `wait_for_promotion` reads that key first (it may have
been written before the agent started to wait, or before a restarted container) and then watches it. The promote
key has no lease: a restarted container of a promoted spare pod finds it again and takes the same replica; the
run's cleanup (`liveness.delete_run`) deletes it.

Torch-free, like liveness.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flywheel.contracts.spare_promotion import Promotion, PromotionError, decode_promotion, encode_promotion

from . import keys
from .liveness import DEFAULT_WORKER_TTL
from .prefix_watch import PrefixWatch
from .session import EtcdSession, KeptLease

log = logging.getLogger(__name__)

STOP_CHECK_INTERVAL_S = 0.1


@dataclass(frozen=True)
class LiveSpare:
    spare_id: str
    host: str
    pid: int
    since: float  # unix time the key was (re)written
    lease_id: int
    ready: bool = True  # its warm zygote is started (the trainer is being or has been imported)


class SpareRegistration:
    """Holds one waiting spare's key while it waits (`close` deletes it: on promotion, or when the spare stops)."""

    def __init__(self, session: EtcdSession, run_id: str, spare_id: str, ttl: int = DEFAULT_WORKER_TTL) -> None:
        self.session = session
        self.key = keys.spare_key(run_id, spare_id)
        self.spare_id = spare_id
        self.ttl = ttl
        self._lease: KeptLease | None = None

    def start(self) -> "SpareRegistration":
        self._lease = self.session.start_lease(self.ttl, on_new_lease=self._put)
        return self

    async def _put(self, lease_id: int) -> None:
        info: dict[str, Any] = {"spare": self.spare_id, "host": socket.gethostname(), "pid": os.getpid(),
                                "since": time.time(), "ready": True}
        await self.session.call_async(lambda c: c.put(self.key, json.dumps(info).encode(), lease=lease_id))

    def close(self) -> None:
        """Remove the key at once: a promoted spare is no longer one, and a stopped one is gone."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.revoke()


def parse_spare(key: bytes, value: bytes, lease_id: int) -> LiveSpare:
    spare_id = key.rsplit(b"/", 1)[-1].decode()
    try:
        info: dict[str, Any] = json.loads(value)
    except ValueError:
        info = {}
    return LiveSpare(spare_id=spare_id, host=str(info.get("host", "")), pid=_int(info.get("pid", 0)),
                     since=_float(info.get("since", 0.0)), lease_id=lease_id, ready=bool(info.get("ready", False)))


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


OnSparesChange = Callable[[dict[str, LiveSpare]], None]


class SpareWatch(PrefixWatch[LiveSpare]):
    """Follows `/flywheel/spares/<run_id>/` and calls `on_change(live_spares)` with the whole current set."""

    def __init__(self, endpoints: str | EtcdSession, run_id: str, on_change: OnSparesChange, *,
                 shared: bool = False) -> None:
        super().__init__(endpoints, keys.spares_prefix(run_id), lambda kv: parse_spare(kv.key, kv.value, kv.lease),
                         on_change, "spare watch", shared=shared)

    @property
    def live_spares(self) -> dict[str, LiveSpare]:
        return self.current


def watch_spares(endpoints: str | EtcdSession, run_id: str, on_change: OnSparesChange, *,
                 shared: bool = False) -> SpareWatch:
    """Start following the waiting spares of `run_id`; `.stop()` the returned watch when done (shared: see
    liveness.watch_workers)."""
    return SpareWatch(endpoints, run_id, on_change, shared=shared)


async def promote(session: EtcdSession, run_id: str, spare_id: str, replica: str | int,
                  env: Mapping[str, str]) -> None:
    """The operator's side: promote spare `spare_id` to replica index `replica` with the env that differs for it.
    Runs on the session's loop (`session.run(promote(...))` from another thread)."""
    key, value = keys.promote_key(run_id, spare_id), encode_promotion(replica, env)
    await session.call_async(lambda c: c.put(key, value))


def wait_for_promotion(session: EtcdSession, run_id: str, spare_id: str,
                       stop: threading.Event) -> Promotion | None:
    """The spare agent's side: block until this spare is promoted (its promotion) or `stop` is set (None)."""
    return session.run(_wait_for_promotion(session, keys.promote_key(run_id, spare_id), stop))


async def _wait_for_promotion(session: EtcdSession, key: bytes, stop: threading.Event) -> Promotion | None:
    follow = asyncio.ensure_future(_follow_promotion(session, key))
    try:
        while not stop.is_set():
            done, _ = await asyncio.wait({follow}, timeout=STOP_CHECK_INTERVAL_S)
            if done:
                return follow.result()
        return None
    finally:
        follow.cancel()


async def _follow_promotion(session: EtcdSession, key: bytes) -> Promotion:
    while True:
        try:
            listing = await session.call_async(lambda c: c.get_prefix(key))
            for kv in listing:
                if kv.key == key and (promotion := _decoded(kv.value)) is not None:
                    return promotion
            watch = await session.client.watch(key, start_revision=listing.header.revision + 1)
            async for event in watch:
                if event.kind != "DELETE" and (promotion := _decoded(event.kv.value)) is not None:
                    return promotion
            await asyncio.sleep(0.1)  # the stream ended without an error (client replaced): read again
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - etcd restarts, compaction: read again after a pause
            log.debug("promotion watch on %s interrupted (%s: %s); reading again", key, type(exc).__name__, exc)
            await asyncio.sleep(0.3)


def _decoded(raw: bytes) -> Promotion | None:
    try:
        return decode_promotion(raw)
    except PromotionError as err:
        log.error("ignoring a malformed spare promotion: %s", err)
        return None
