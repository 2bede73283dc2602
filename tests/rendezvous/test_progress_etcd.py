"""The progress record through a real etcd: rank 0's publisher (trainer/progress_publisher.py) -> the operator's
watch (etcd/progress_watch.py); rate limit, urgent events, the lease, a dead etcd, and the run's cleanup."""

from __future__ import annotations

import queue
import time

import pytest

from flywheel.etcd.liveness import delete_run
from flywheel.etcd.progress import ProgressRecord
from flywheel.etcd.progress_watch import watch_progress
from flywheel.trainer.progress_publisher import LEASE_TTL_SECONDS, ProgressPublisher, progress_events

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)

Changes = queue.Queue[dict[str, ProgressRecord]]


def until(changes: Changes, check: object, timeout: float = 5.0) -> dict[str, ProgressRecord]:
    deadline = time.monotonic() + timeout
    while True:
        records = changes.get(timeout=max(deadline - time.monotonic(), 0.01))
        if callable(check) and check(records):
            return records


def test_publisher_to_watch(etcd_server: EtcdServer) -> None:
    changes: Changes = queue.Queue()
    watch = watch_progress(etcd_server.endpoint, "run-p", changes.put)
    env = {"PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": etcd_server.endpoint, "PET_RDZV_ID": "run-p"}
    events = progress_events(None, 0, env)  # no event log file: etcd alone
    try:
        assert until(changes, lambda r: True) == {}
        events.emit("start", world_size=2, resumed_from=0)
        first = until(changes, lambda r: "0" in r)["0"]
        assert (first.step, first.world_size, first.stepped) == (0, 2, False)
        began = time.monotonic()
        for step in range(1, 30):  # 29 steps in ~0.3 s: one put now, the rest coalesced to the latest
            events.emit("step", step=step, loss=1.0 / step, step_seconds=0.01, tokens_per_second=10.0, world_size=2)
            time.sleep(0.01)
        seen: list[int] = []

        def reached_29(records: dict[str, ProgressRecord]) -> bool:
            seen.append(records["0"].step)
            return records["0"].step == 29

        latest = until(changes, reached_29)["0"]
        assert len(seen) <= 3 and time.monotonic() - began >= 0.9  # at most one put a second
        assert latest.productive_seconds == pytest.approx(0.29)
        events.emit("checkpoint", step=29, path="/c/29")  # urgent: at once, not after the second
        ckpt = until(changes, lambda r: r["0"].checkpoint is not None, timeout=0.8)["0"]
        assert ckpt.checkpoint is not None and (ckpt.checkpoint.step, ckpt.checkpoint.path) == (29, "/c/29")
        events.emit("done", step=29)
        assert until(changes, lambda r: r["0"].done)["0"].step == 29
        events.publisher.close()  # type: ignore[attr-defined]
        # The key is under the publisher's lease: gone within the TTL once nobody keeps it alive.
        until(changes, lambda r: r == {}, timeout=LEASE_TTL_SECONDS * 3)
    finally:
        watch.stop()


def test_publisher_survives_no_etcd_and_cleanup_deletes_progress(etcd_server: EtcdServer) -> None:
    dead = ProgressPublisher("127.0.0.1:1", "run-x").start()  # nothing listens there
    began = time.monotonic()
    dead.observe("start", {"world_size": 1})
    dead.observe("step", {"step": 1})
    assert time.monotonic() - began < 0.1  # the caller never waits for etcd
    dead.close()
    live = ProgressPublisher(etcd_server.endpoint, "run-y").start()
    live.observe("start", {"world_size": 1})
    live.close()
    assert delete_run(etcd_server.endpoint, "run-y") == 1


def test_an_exit_reason_reaches_the_progress_key_before_the_process_exits(etcd_server: EtcdServer) -> None:
    from flywheel.contracts import termination_log

    changes: Changes = queue.Queue()
    watch = watch_progress(etcd_server.endpoint, "run-x", changes.put)
    env = {"PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": etcd_server.endpoint, "PET_RDZV_ID": "run-x"}
    events = progress_events(None, 0, env)
    try:
        events.emit("start", world_size=1, resumed_from=0)
        events.emit("step", step=1, step_seconds=0.01)
        until(changes, lambda r: "0" in r)
        termination_log.write_reason("ValueError: the batch is empty", {})  # as the trainer does before exiting
        said = until(changes, lambda r: bool(r.get("0") and r["0"].exit_reason), timeout=0.8)["0"]
        assert said.exit_reason == "ValueError: the batch is empty" and said.step == 1
    finally:
        events.publisher.close()  # type: ignore[attr-defined]
        watch.stop()
    assert events.publisher.observe_exit not in termination_log._listeners  # type: ignore[attr-defined]
