"""Worker liveness keys in etcd, and the small API the operator uses to follow them.

Each worker agent holds `/flywheel/workers/<run_id>/<replica_id>` under its own lease with a short TTL, refreshed
from the session's loop thread. When the agent dies (SIGKILL, lost node, network partition) the refreshes stop and
etcd deletes the key within the TTL, so the operator sees a dead worker in seconds instead of waiting minutes for
Kubernetes to mark the node lost. An agent that ends by itself (success, failure, or a Python exception) marks its
key `exited` and lets the lease run out: its pod's status will say how it ended, and the key's disappearance then
means nothing. Revoking at once would race the kubelet's report of that status and read as a lost worker.

Torch-free on purpose, so the operator can use it without importing torch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aetcd import Client

from . import keys
from .prefix_watch import PrefixWatch, SessionRef
from .session import EtcdSession, KeptLease

log = logging.getLogger(__name__)

DEFAULT_WORKER_TTL = 3  # refreshed every ttl/3 = 1 s: a lost node is seen 2-3 s after it died


@dataclass(frozen=True)
class LiveWorker:
    replica_id: str
    host: str
    pid: int
    since: float  # unix time the key was (re)written
    lease_id: int
    exited: bool = False  # the agent ended by itself (its pod's status tells how); the key expires after the TTL
    rank_restarts: int = 0  # times this agent restarted its crashed ranks in place (its pod did not fail)
    rank_restart_reason: str = ""  # why it last did: the failed rank and its exit code or signal
    rank_restart_at: float = 0.0  # unix time it last did


class WorkerRegistration:
    """Holds one worker's liveness key for as long as the process lives (or until `close`)."""

    def __init__(self, session: EtcdSession, run_id: str, replica_id: str, ttl: int = DEFAULT_WORKER_TTL,
                 on_replaced: Callable[[str], None] | None = None) -> None:
        self.session = session
        # Called (with what holds the key now) when another agent took this replica's key while this one was cut
        # off: its pod was given up and replaced, so this agent must end without rejoining the group.
        self.on_replaced = on_replaced
        self.run_id = run_id
        self.replica_id = replica_id
        self.key = keys.worker_key(run_id, replica_id)
        self.ttl = ttl
        self._lease: KeptLease | None = None
        self._since = 0.0  # when the key was last (re)registered
        self._written = b""  # the value this agent last put: its exit marker replaces only that
        self._rank_restarts = 0
        self._rank_restart_reason = ""
        self._rank_restart_at = 0.0

    def start(self) -> "WorkerRegistration":
        self._lease = self.session.start_lease(self.ttl, on_new_lease=self._put)
        return self

    async def _put(self, lease_id: int, exited: bool = False, keep_since: bool = False) -> None:
        # The exited marker keeps the registration time: the operator tells a replacement pod's key from its
        # predecessor's by `since`, and a marker written as the old agent ends (after the replacement was created)
        # must still read as the predecessor's.
        if not (exited or keep_since):
            self._since = time.time()
        info: dict[str, Any] = {"replica": self.replica_id, "host": socket.gethostname(), "pid": os.getpid(),
                                "since": self._since}
        if exited:
            info["exited"] = True
        if self._rank_restarts:
            info["rankRestarts"] = self._rank_restarts
            info["rankRestartReason"] = self._rank_restart_reason
            info["rankRestartAt"] = self._rank_restart_at
        value = json.dumps(info).encode()
        if exited:  # only over this agent's own key: a promoted spare may hold the replica's key by now
            written = self._written

            async def mark(c: Any) -> Any:
                tx = c.transactions
                return await c.transaction(compare=[tx.value(self.key) == written],
                                           success=[tx.put(self.key, value, lease=lease_id)], failure=[])

            await self.session.call_async(mark)
            return
        if not self._written:  # the first registration: a predecessor's key (its pod gone) is taken over
            await self.session.call_async(lambda c: c.put(self.key, value, lease=lease_id))
            self._written = value
            return
        holder = await self.session.call_async(lambda c: self._claim(c, value, lease_id))
        if holder is None:
            self._written = value
        elif self.on_replaced is not None:
            self.on_replaced(holder)

    async def _claim(self, c: Any, value: bytes, lease_id: int) -> str | None:
        """Re-attach the key (a new lease, a rank restart's report) only while it is absent or still this agent's;
        else what holds it now (a replacement's registration)."""
        tx = c.transactions
        for compare in (tx.version(self.key) == 0, tx.value(self.key) == self._written):
            succeeded, _ = await c.transaction(compare=[compare], success=[tx.put(self.key, value, lease=lease_id)],
                                               failure=[])
            if succeeded:
                return None
        current = await c.get(self.key)
        return "nothing" if current is None else current.value.decode(errors="replace")

    def still_held(self) -> bool:
        """Before the agent joins a rendezvous round: is the replica's key still this agent's (re-attached if it
        expired meanwhile)? False: a replacement holds it (on_replaced was told)."""
        lease = self._lease
        if lease is None or not self._written:
            return True
        value, timeout = self._written, self.session.rpc_timeout
        try:
            holder = self.session.run(asyncio.wait_for(self.session.call_async(
                lambda c: self._claim(c, value, lease.lease_id)), timeout), timeout=timeout + 1)
        except Exception as exc:  # noqa: BLE001 - etcd unreachable: the rendezvous' own retries decide, not this check
            log.warning("could not check %s before joining the rendezvous: %s", self.key, exc)
            return True
        if holder is None:
            return True
        if self.on_replaced is not None:
            self.on_replaced(holder)
        return False

    def report_rank_restart(self, count: int, reason: str, at: float) -> None:
        """The agent restarted its crashed ranks in place (`count` times so far, the last at unix time `at` because
        of `reason`): the key says so at once (same lease, same `since`), so the operator counts it in
        `status.restarts`. Best effort: etcd unreachable leaves the count to the next successful write (a
        re-registration carries it too)."""
        self._rank_restarts, self._rank_restart_reason, self._rank_restart_at = count, reason, at
        lease = self._lease
        if lease is None:
            return
        try:
            timeout = self.session.rpc_timeout
            self.session.run(asyncio.wait_for(self._put(lease.lease_id, keep_since=True), timeout),
                             timeout=timeout + 1)
        except Exception as exc:  # noqa: BLE001 - never fail the agent's restart over a report
            log.warning("reporting the rank restart in %s failed: %s", self.key, exc)

    def close(self) -> None:
        """The agent is ending by itself: mark the key `exited` and let its lease run out. Its pod's own status says
        how it ended; a key that simply vanished here (a revoke) would race the kubelet's report of that status and
        read as a lost worker."""
        if self._lease is None:
            return
        lease, self._lease = self._lease, None
        try:
            timeout = self.session.rpc_timeout
            self.session.run(asyncio.wait_for(self._put(lease.lease_id, exited=True), timeout), timeout=timeout + 1)
            lease.stop()
        except Exception as exc:  # noqa: BLE001 - etcd unreachable: the key then expires by its TTL unmarked
            log.debug("marking %s exited failed: %s", self.key, exc)
            lease.revoke()


def _parse_worker(key: bytes, value: bytes, lease_id: int) -> LiveWorker:
    replica_id = key.rsplit(b"/", 1)[-1].decode()
    try:
        info: dict[str, Any] = json.loads(value)
    except ValueError:
        info = {}
    return LiveWorker(
        replica_id=replica_id,
        host=str(info.get("host", "")),
        pid=int(info.get("pid", 0)),
        since=float(info.get("since", 0.0)),
        lease_id=lease_id,
        exited=bool(info.get("exited", False)),
        rank_restarts=_non_negative_int(info.get("rankRestarts", 0)),
        rank_restart_reason=str(info.get("rankRestartReason", "")),
        rank_restart_at=_float(info.get("rankRestartAt", 0.0)),
    )


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _non_negative_int(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def _workers_from(kvs: Iterable[Any]) -> dict[str, LiveWorker]:
    workers = (_parse_worker(kv.key, kv.value, kv.lease) for kv in kvs)
    return {w.replica_id: w for w in workers}


def list_live_workers(endpoints: str | EtcdSession, run_id: str) -> dict[str, LiveWorker]:
    """The workers of `run_id` whose liveness lease is held now, by replica id."""
    prefix = keys.workers_prefix(run_id)
    with SessionRef(endpoints) as session:
        return _workers_from(session.call(lambda c: c.get_prefix(prefix)))


def delete_run(endpoints: str | EtcdSession, run_id: str) -> int:
    """Delete every key of `run_id` (rendezvous state, store, liveness, progress, spares, promotions, requests, the
    rank restart request); for the operator's finalizer.

    Returns the number of keys deleted. Agents still running lose their rendezvous; call this after they stopped.
    """
    prefixes = (keys.rdzv_prefix(run_id), keys.workers_prefix(run_id), keys.progress_prefix(run_id),
                keys.spares_prefix(run_id), keys.promote_prefix(run_id), keys.requests_prefix(run_id),
                keys.restart_prefix(run_id))

    async def delete_all(client: Client) -> int:
        return sum([int((await client.delete_prefix(prefix)).deleted) for prefix in prefixes])

    with SessionRef(endpoints) as session:
        return session.call(delete_all)


def reset_rendezvous(endpoints: str | EtcdSession, run_id: str) -> int:
    """Delete the rendezvous state of `run_id` (not the liveness keys), so that a new set of agents forms its group
    at once instead of waiting for the heartbeats of the previous, dead participants to expire. Call it only when
    none of the run's agents is alive. Returns the number of keys deleted."""
    prefix = keys.rdzv_prefix(run_id)
    with SessionRef(endpoints) as session:
        return int(session.call(lambda c: c.delete_prefix(prefix)).deleted)


OnWorkersChange = Callable[[dict[str, LiveWorker]], None]


class WorkerWatch(PrefixWatch[LiveWorker]):
    """Follows `/flywheel/workers/<run_id>/` and calls `on_change(live_workers)` with the whole current set
    (prefix_watch.py: level-triggered, lists again after a broken watch)."""

    def __init__(self, endpoints: str | EtcdSession, run_id: str, on_change: OnWorkersChange, *,
                 shared: bool = False) -> None:
        super().__init__(endpoints, keys.workers_prefix(run_id), lambda kv: _parse_worker(kv.key, kv.value, kv.lease),
                         on_change, "worker watch", shared=shared)

    @property
    def live_workers(self) -> dict[str, LiveWorker]:
        return self.current


def watch_workers(endpoints: str | EtcdSession, run_id: str, on_change: OnWorkersChange, *,
                  shared: bool = False) -> WorkerWatch:
    """Start following the live workers of `run_id`; `.stop()` the returned watch when done. shared: through
    the session's one watch of every run's keys (prefix_watch.PrefixHub; the operator's)."""
    return WorkerWatch(endpoints, run_id, on_change, shared=shared)
