"""When a job's runner runs a pass (executor.py): on a change (a poke), when the last pass said a rule comes due,
at the latest every SAFETY_TICK_SECONDS -- never on a fixed one-second tick, and not on its own status write."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from flywheel.etcd.liveness import LiveWorker
from flywheel.operator import etcd_views, executor
from flywheel.operator import manifests as m
from flywheel.operator.executor import JobRunner
from flywheel.operator.own_writes import PENDING_SECONDS
from flywheel.policy.reconcile import LIVENESS_GRACE_SECONDS
from tests import builders
from tests.operator.liveness_verdict import verdict

SETTINGS = m.OperatorSettings(etcd_endpoints="")


class Stopped:
    """kopf's DaemonStopped as the runner reads it: false until set; `wait()` until then."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


def runner() -> JobRunner:
    return JobRunner(None, SETTINGS, "ml", "j", "uid", logging.getLogger("t"))  # type: ignore[arg-type]


def passes_in(seconds: float, due_after: float | None, pokes: tuple[float, ...] = ()) -> list[float]:
    """The times (from the start) of the passes a runner runs in `seconds`, each pass saying a rule comes due
    `due_after` seconds later (None: none); `pokes`: when the job is poked."""
    async def scenario() -> list[float]:
        r, stopped, began, times = runner(), Stopped(), time.monotonic(), []

        async def one_pass() -> None:
            times.append(time.monotonic() - began)
            r.pass_due = time.time() + due_after if due_after is not None else None

        r.reconcile_once = one_pass  # type: ignore[method-assign]
        task = asyncio.ensure_future(r.run(stopped))  # type: ignore[arg-type]
        for at in pokes:
            await asyncio.sleep(at - (time.monotonic() - began))
            r.poke()
        await asyncio.sleep(seconds - (time.monotonic() - began))
        stopped.event.set()
        await asyncio.wait_for(task, 5)
        return times

    return asyncio.run(scenario())


def test_a_runner_with_nothing_due_runs_no_pass_until_poked() -> None:
    times = passes_in(1.6, None, pokes=(0.8,))
    assert len(times) == 2 and times[1] == pytest.approx(0.8, abs=0.2)


def test_a_runner_runs_its_pass_when_the_last_one_said_it_is_due() -> None:
    times = passes_in(1.1, 0.4)
    assert len(times) == 3 and times[1] == pytest.approx(0.4, abs=0.15)


def test_the_safety_tick_bounds_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "SAFETY_TICK_SECONDS", 0.3)
    times = passes_in(1.0, None)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert 3 <= len(times) <= 4 and all(gap >= 0.29 for gap in gaps)  # a loaded machine may run late, never early


def test_the_event_of_its_own_status_write_does_not_wake_the_runner() -> None:
    r = runner()
    r.records.written_versions.extend(["6", "7"])  # two writes in quick succession: the first one's event comes late
    r.job_event("7")
    r.job_event("6")
    assert not r.wake.is_set()
    r.job_event("8")  # anyone else's change
    assert r.wake.is_set()


def test_a_deleted_service_wakes_the_runner_and_is_looked_at_again() -> None:
    r = runner()
    r.actuator.service_checked_at = time.monotonic()
    r.service_gone()
    assert r.wake.is_set() and r.actuator.service_checked_at is None


def test_a_missing_liveness_key_is_due_when_its_grace_ends() -> None:
    r = runner()
    pod = builders.pod(0, uid="p")
    r.observer.etcd.live = {"0": LiveWorker("0", "h", 1, since=100.0, lease_id=1)}
    assert not verdict(r, pod, 100.0, 101.0) and r.next_due() is None  # registered
    r.observer.etcd.live = {}  # its key is gone
    assert not verdict(r, pod, 100.0, 102.0)
    due = r.next_due()
    assert due == 102.0 + LIVENESS_GRACE_SECONDS
    assert not verdict(r, pod, 100.0, due - 0.01) and verdict(r, pod, 100.0, due)


def test_an_unseen_own_write_is_due_when_the_cache_is_believed_again() -> None:
    r = runner()
    created = {"metadata": {"name": "j-worker-0", "uid": "p"}}
    r.observer.own.wrote_pod(created, 100.0)
    due = r.next_due()
    assert due == 100.0 + PENDING_SECONDS
    assert r.observer.own.pods([], due - 0.01) == [created] and r.observer.own.pods([], due) == []


def test_a_failed_etcd_watch_is_retried_without_a_change() -> None:
    class EtcdDown:
        async def session(self) -> None:
            raise ConnectionError("etcd is down")

    r = JobRunner(None, SETTINGS, "ml", "j", "uid", logging.getLogger("t"), etcd=EtcdDown())  # type: ignore[arg-type]
    before = time.time()
    asyncio.run(r.observer.etcd.start(None, False))  # type: ignore[arg-type]
    due = r.next_due()
    retry = etcd_views.ETCD_RETRY_SECONDS
    assert due is not None and before + retry <= due <= time.time() + retry


def test_a_pass_parses_the_job_again_only_when_its_spec_or_metadata_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.operator_scale_bed import job_doc

    parsed: list[dict[str, object]] = []
    real = executor.parse_cluster_job
    monkeypatch.setattr(executor, "parse_cluster_job", lambda obj: parsed.append(obj) or real(obj))
    r, obj = runner(), job_doc("j", 2)
    obj["metadata"]["resourceVersion"] = "1"
    first, _ = r._parse(obj)
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "2"}, "status": {"phase": "Running"}}
    assert r._parse(obj)[0] is first and len(parsed) == 1  # a status write: the same job
    obj["spec"] = {**obj["spec"], "replicas": {"min": 1, "max": 2}}
    again, _ = r._parse(obj)
    assert again is not None and again.spec.replicas.min == 1 and len(parsed) == 2
    obj["spec"] = {**obj["spec"], "replicas": {"min": 3, "max": 2}}
    job, invalid = r._parse(obj)
    assert job is None and invalid and "replicas" in invalid


def test_the_events_of_one_change_make_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's pods exiting together send their events within moments of each other: one pass (and one status
    write) for all of them, COALESCE_SECONDS after the first, not one per pod."""
    monkeypatch.setattr(executor, "COALESCE_SECONDS", 0.2)  # wide, so that a loaded machine's late wake-ups fit
    times = passes_in(0.8, None, pokes=(0.2, 0.25, 0.3))
    assert len(times) == 2 and times[1] >= 0.39


def test_an_etcd_report_that_changes_nothing_wakes_no_pass() -> None:
    """The progress watch's first report of a new job (no keys yet), or its keys gone with their lease: what the
    ledger holds is unchanged, so no pass; a record does wake one."""
    from flywheel.etcd.progress import ProgressRecord
    from flywheel.operator.progress_follower import JobProgress

    pokes: list[int] = []
    progress = JobProgress(lambda: pokes.append(1))
    progress._apply({})
    assert pokes == []
    progress._apply({"0": ProgressRecord(time=100.0, attempt=90.0, step=3)})
    assert pokes == [1] and progress.ledger.attempts


def test_the_periodic_full_collection_takes_at_most_its_share_of_the_time() -> None:
    from flywheel.operator.config import GC_FULL_SHARE, next_full_collection

    assert next_full_collection(10.0, 0.001) == 10.0  # a small heap: every 10 s
    assert next_full_collection(10.0, 0.5) == pytest.approx(0.5 / GC_FULL_SHARE)  # a large heap: less often
    assert 0.5 / GC_FULL_SHARE > 10.0
