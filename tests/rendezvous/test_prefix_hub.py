"""The operator's shared etcd watches (etcd/prefix_watch.py, PrefixHub) on a real etcd: one watch per key root
serves every run's PrefixWatch, each sees its own run's keys only, level-triggered as a per-run watch is; a watch
started later begins from the current keys; a stopped one hears nothing more; a worker's own watch stays per run."""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest

from flywheel.etcd import keys
from flywheel.etcd.liveness import watch_workers
from flywheel.etcd.prefix_watch import PrefixWatch
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)
ROOT = b"/flywheel/test-hub/"


def _watch(session: EtcdSession, run: str, changes: queue.Queue[dict[str, bytes]], shared: bool = True) -> Any:
    return PrefixWatch(session, ROOT + run.encode() + b"/", lambda kv: bytes(kv.value), changes.put, "test",
                       shared=shared)


def _until(changes: queue.Queue[dict[str, bytes]], expected: dict[str, bytes], timeout: float = 5.0) -> None:
    deadline, seen = time.monotonic() + timeout, None
    while seen != expected:
        seen = changes.get(timeout=max(deadline - time.monotonic(), 0.01))


def _put(session: EtcdSession, key: bytes, value: bytes) -> None:
    session.call(lambda c: c.put(key, value))


def test_one_watch_serves_every_run_each_seeing_its_own(etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint) as session:
        _put(session, ROOT + b"run-a/0", b"a0")
        _put(session, ROOT + b"run-b/0", b"b0")
        a: queue.Queue[dict[str, bytes]] = queue.Queue()
        b: queue.Queue[dict[str, bytes]] = queue.Queue()
        watch_a, watch_b = _watch(session, "run-a", a), _watch(session, "run-b", b)
        _until(a, {"0": b"a0"})
        _until(b, {"0": b"b0"})
        assert list(session.prefix_hubs) == [ROOT]  # one hub (one etcd watch) for both runs
        _put(session, ROOT + b"run-a/1", b"a1")
        _until(a, {"0": b"a0", "1": b"a1"})
        session.call(lambda c: c.delete(ROOT + b"run-a/0"))
        _until(a, {"1": b"a1"})
        assert b.empty()  # run-a's changes never reach run-b's watch
        # A run whose name extends another's is another run.
        _put(session, ROOT + b"run-a-2/0", b"x")
        late: queue.Queue[dict[str, bytes]] = queue.Queue()
        watch_late = _watch(session, "run-a", late)  # starts from the current keys, without a listing of its own
        _until(late, {"1": b"a1"})
        watch_a.stop()
        time.sleep(0.2)
        _put(session, ROOT + b"run-a/2", b"a2")
        _until(late, {"1": b"a1", "2": b"a2"})
        time.sleep(0.3)
        assert all(change != {"1": b"a1", "2": b"a2"} for change in _drain(a))  # stopped: heard nothing more
        assert watch_late.current == {"1": b"a1", "2": b"a2"} and watch_b.current == {"0": b"b0"}
        watch_b.stop()
        watch_late.stop()


def test_a_shared_watch_needs_a_session_and_a_worker_watch_stays_per_run(etcd_server: EtcdServer) -> None:
    """Given endpoints (a private session) the watch follows its own prefix; the operator's liveness watch with
    the shared session goes through the hub of the workers' root."""
    changes: queue.Queue[dict[str, bytes]] = queue.Queue()
    own = _watch(etcd_server.endpoint, "run-c", changes)  # type: ignore[arg-type]
    try:
        _until(changes, {})
        assert own._hub is None and own._task is not None
    finally:
        own.stop()
    with EtcdSession(etcd_server.endpoint) as session:
        live: queue.Queue[dict[str, Any]] = queue.Queue()
        watch = watch_workers(session, "run-d", live.put, shared=True)
        assert watch._hub is session.prefix_hubs[keys.WORKERS_ROOT.encode()]
        assert live.get(timeout=5) == {}
        watch.stop()


def _drain(changes: queue.Queue[dict[str, bytes]]) -> list[dict[str, bytes]]:
    out = []
    while not changes.empty():
        out.append(changes.get())
    return out


def test_the_hub_lists_again_periodically_and_reports_only_changes(etcd_server: EtcdServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An informer-style resync: the root is listed again every RESYNC_SECONDS on a new stream (a stream alive but
    silent must not freeze a job's status), and a listing that finds nothing new wakes no watch."""
    monkeypatch.setattr("flywheel.etcd.prefix_watch.RESYNC_SECONDS", 0.3)
    with EtcdSession(etcd_server.endpoint) as session:
        _put(session, ROOT + b"run-r/0", b"r0")
        changes: queue.Queue[dict[str, bytes]] = queue.Queue()
        watch = _watch(session, "run-r", changes)
        _until(changes, {"0": b"r0"})
        time.sleep(1.5)
        hub = session.prefix_hubs[ROOT]
        assert hub.listings >= 3
        assert changes.empty()  # the same keys listed again: nothing published
        _put(session, ROOT + b"run-r/1", b"r1")  # and the new stream still carries changes
        _until(changes, {"0": b"r0", "1": b"r1"})
        watch.stop()
