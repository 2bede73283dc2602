"""CheckpointCommitted events: the pure rate limit and coalescing (policy/checkpoint_events.py), the event-log fold
that numbers checkpoints, and the executor posting them once -- across an operator restart too -- against a
recording stand-in for the Kubernetes API."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from flywheel.api import views
from flywheel.etcd.progress import ProgressRecord
from flywheel.operator import manifests as m
from flywheel.operator.event_log import EventLogTail, events_file
from flywheel.operator.executor import JobRunner
from flywheel.policy.checkpoint_events import (
    CHECKPOINT_EVENT_INTERVAL_SECONDS,
    MAX_LISTED_STEPS,
    RECENT_CHECKPOINTS,
    CheckpointEventState,
    CommittedCheckpoint,
    event_due,
    next_event,
    notice_events,
    seed,
)
from flywheel.policy.conditions import iso

T0 = 1_800_000_000.0
INTERVAL = CHECKPOINT_EVENT_INTERVAL_SECONDS


def ckpts(*steps: int, start: int = 1, every: float = 5.0) -> tuple[CommittedCheckpoint, ...]:
    return tuple(CommittedCheckpoint(start + i, s, f"/ckpt/step-{s:08d}", T0 + every * (start + i))
                 for i, s in enumerate(steps))


def test_first_checkpoint_at_once_then_one_coalesced_event_per_interval() -> None:
    first, state = next_event(ckpts(10), CheckpointEventState(), T0 + 5)
    assert first is not None and first.message == "checkpoint at step 10 committed to /ckpt/step-00000010"
    assert (first.step, first.count, first.first_time, first.last_time) == (10, 1, T0 + 5, T0 + 5)
    assert next_event(ckpts(10), state, T0 + 999)[0] is None  # nothing new: nothing to post
    three = ckpts(10, 20, 30, 40)
    assert next_event(three, state, T0 + 5 + INTERVAL - 1)[0] is None  # within the interval: wait
    later, after = next_event(three, state, T0 + 5 + INTERVAL)
    assert later is not None and later.step == 40 and later.count == 3
    assert later.message.startswith("checkpoint at step 40 committed to /ckpt/step-00000040")
    assert "3 checkpoints since the last event, at steps 20, 30, 40" in later.message
    assert (later.first_time, later.last_time) == (T0 + 10, T0 + 20)  # commit times of step 20 and of step 40
    assert after == CheckpointEventState(handled=4, last_posted_at=T0 + 5 + INTERVAL)


def test_a_held_back_checkpoint_event_is_due_when_the_interval_ends() -> None:
    _, state = next_event(ckpts(10), CheckpointEventState(), T0 + 5)
    assert event_due(ckpts(10), state) is None  # nothing pending
    pending = ckpts(10, 20)
    due = event_due(pending, state)
    assert due == T0 + 5 + INTERVAL
    assert next_event(pending, state, due - 0.01)[0] is None and next_event(pending, state, due)[0] is not None


def test_a_finished_job_posts_what_is_pending_at_once() -> None:
    state = CheckpointEventState(handled=1, last_posted_at=T0)
    assert next_event(ckpts(10, 20), state, T0 + 1)[0] is None
    final, _ = next_event(ckpts(10, 20), state, T0 + 1, flush=True)
    assert final is not None and final.step == 20 and final.count == 1


def test_more_pending_than_remembered_are_counted_and_elided() -> None:
    recent = ckpts(*range(100, 100 + RECENT_CHECKPOINTS), start=200)  # ordinals 200.., 199 more before them
    event, state = next_event(recent, CheckpointEventState(handled=5, last_posted_at=T0), T0 + INTERVAL)
    assert event is not None and event.count == recent[-1].ordinal - 5
    listed = event.message.split("at steps ")[1].split(", ")
    assert listed[0] == "..." and len(listed) == MAX_LISTED_STEPS + 1 and listed[-1] == str(99 + RECENT_CHECKPOINTS)
    assert state.handled == recent[-1].ordinal


def test_seed_skips_what_the_status_already_shows() -> None:
    recent = ckpts(10, 20, 30)  # committed at T0+5, T0+10, T0+15
    assert seed(recent, None) == CheckpointEventState()
    assert seed(recent, T0 + 10) == CheckpointEventState(handled=2)  # step 30 came after the status was written
    assert seed(recent, T0 + 15) == CheckpointEventState(handled=3)
    assert seed(ckpts(30, start=3), T0 + 1) == CheckpointEventState(handled=2)  # older ones were forgotten


def test_the_fold_numbers_checkpoints_and_keeps_the_recent_ones(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    rows = [{"event": "checkpoint", "time": T0 + s, "step": s, "path": f"/c/{s}"}
            for s in range(1, RECENT_CHECKPOINTS + 3)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    progress = EventLogTail(log).poll()
    assert len(progress.checkpoints) == RECENT_CHECKPOINTS
    assert progress.checkpoints[-1] == CommittedCheckpoint(RECENT_CHECKPOINTS + 2, RECENT_CHECKPOINTS + 2,
                                                           f"/c/{RECENT_CHECKPOINTS + 2}", T0 + RECENT_CHECKPOINTS + 2)
    assert progress.checkpoints[0].ordinal == 3


class RecordingKube:
    """The calls JobRunner makes, answered from one TrainingJob object; pods are never seen (none run here)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job, self.events = job, []  # type: ignore[var-annotated]

    async def get(self, path: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.job))

    async def list(self, path: str, label_selector: str = "") -> list[dict[str, Any]]:
        return []

    async def create(self, path: str, body: dict[str, Any]) -> None:
        return None

    async def delete(self, *args: Any) -> None:
        return None

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        if path.endswith("/status"):
            self.job["status"] = patch["status"]
            self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        return self.job

    async def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str,
                         component: str = "", **times: Any) -> None:
        self.events.append({"reason": reason, "message": message, "type": event_type, **times})


def test_executor_posts_each_checkpoint_once_across_an_operator_restart(tmp_path: Path) -> None:
    job = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "j", "namespace": "ml", "uid": "uid-1", "resourceVersion": "1", "generation": 1},
           "spec": {"replicas": {"min": 1, "max": 1}, "trainer": {"training": {"globalBatch": 4, "microBatch": 1}}}}
    kube = RecordingKube(job)
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", events_dir=str(tmp_path))
    log = events_file(str(tmp_path), "ml", "j", "uid-1")

    def append(*rows: dict[str, Any]) -> None:
        with open(log, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))

    def checkpoint_events() -> list[dict[str, Any]]:
        return [e for e in kube.events if e["reason"] == "CheckpointCommitted"]

    def runner() -> JobRunner:
        return JobRunner(kube, settings, "ml", "j", "uid-1", logging.getLogger("test"))  # type: ignore[arg-type]

    first = runner()
    append({"event": "start", "time": T0}, {"event": "checkpoint", "time": T0 + 1, "step": 5, "path": "/c/5"})
    asyncio.run(first.reconcile_once())
    append({"event": "checkpoint", "time": T0 + 2, "step": 10, "path": "/c/10"})
    asyncio.run(first.reconcile_once())  # within the interval: coalesced into a later event
    assert [e["message"] for e in checkpoint_events()] == ["checkpoint at step 5 committed to /c/5"]
    assert job["status"]["lastCheckpoint"] == {"step": 10, "path": "/c/10", "time": iso(T0 + 2)}
    # The operator restarts: the new runner reads the whole log again; step 10 is in the status it wrote, so its
    # event counts as handled (lost with the old process rather than posted twice); step 15 is new.
    append({"event": "checkpoint", "time": T0 + 4, "step": 15, "path": "/c/15"})
    second = runner()
    asyncio.run(second.reconcile_once())
    asyncio.run(second.reconcile_once())
    assert [e["message"] for e in checkpoint_events()][1:] == ["checkpoint at step 15 committed to /c/15"]
    # Finishing flushes what is pending at once, before the interval is up.
    append({"event": "checkpoint", "time": T0 + 6, "step": 20, "path": "/c/20"},
           {"event": "checkpoint", "time": T0 + 7, "step": 25, "path": "/c/25"},
           {"event": "done", "time": T0 + 8, "step": 25})
    asyncio.run(second.reconcile_once())
    assert job["status"]["phase"] == "Succeeded"
    last = checkpoint_events()[-1]
    assert last["message"].startswith("checkpoint at step 25") and last["count"] == 2
    assert (last["first_time"], last["last_time"]) == (T0 + 6, T0 + 7)
    asyncio.run(second.reconcile_once())
    assert len(checkpoint_events()) == 3
    # The API's timeline shows each event as a checkpoint at its step, at the newest commit time.
    raw = [{"reason": e["reason"], "message": e["message"], "type": "Normal",
            "involvedObject": {"kind": "TrainingJob", "name": "j"},
            "firstTimestamp": iso(e.get("first_time") or T0), "lastTimestamp": iso(e.get("last_time") or T0)}
           for e in kube.events]
    timeline = views.timeline(job, raw)
    assert [(i.step, i.time) for i in timeline.items if i.kind == "checkpoint"] == [
        (5, iso(T0 + 1)), (15, iso(T0 + 4)), (25, iso(T0 + 7))]


def test_notice_events_post_each_notice_once_and_a_new_executor_only_what_is_new() -> None:
    assert notice_events([(1, "failed", "a")], None) == ([], 1)  # a new executor: what was there is not posted again
    assert notice_events([(1, "failed", "a"), (2, "damaged", "b")], 1) == ([("CheckpointDamaged", "b")], 2)
    assert notice_events([(1, "failed", "a"), (2, "failed", "b")], 1) == ([("CheckpointFailed", "b")], 2)
    assert notice_events([(1, "failed", "a"), (2, "damaged", "b")], 2) == ([], 2)
    assert notice_events([], 0) == ([], 0)


def test_executor_warns_once_per_cause_of_failing_checkpoints(tmp_path: Path) -> None:
    job = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "j", "namespace": "ml", "uid": "uid-1", "resourceVersion": "1", "generation": 1},
           "spec": {"replicas": {"min": 1, "max": 1}, "trainer": {"training": {"globalBatch": 4, "microBatch": 1}}}}
    kube = RecordingKube(job)
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", events_dir=str(tmp_path))
    log = events_file(str(tmp_path), "ml", "j", "uid-1")
    runner = JobRunner(kube, settings, "ml", "j", "uid-1", logging.getLogger("test"))  # type: ignore[arg-type]

    def append(*rows: dict[str, Any]) -> None:
        with open(log, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))

    def failed(step: int, reason: str) -> dict[str, Any]:
        return {"event": "checkpoint_failed", "time": T0 + step, "step": step, "reason": reason,
                "message": f"checkpoint at step {step} failed: {reason}; training continues"}

    append({"event": "start", "time": T0}, {"event": "checkpoint", "time": T0 + 1, "step": 5, "path": "/c/5"})
    asyncio.run(runner.reconcile_once())
    append(failed(10, "no_space"), failed(15, "no_space"))
    asyncio.run(runner.reconcile_once())
    append(failed(20, "no_space"), failed(25, "permission"),
           {"event": "checkpoint_bad", "time": T0 + 26, "step": 5, "path": "/c/bad-step-5", "reason": "crc"})
    asyncio.run(runner.reconcile_once())
    warnings = [(e["type"], e["reason"], e["message"]) for e in kube.events if e["type"] == "Warning"]
    assert warnings == [
        ("Warning", "CheckpointFailed", "checkpoint at step 10 failed: no_space; training continues"),
        ("Warning", "CheckpointFailed", "checkpoint at step 25 failed: permission; training continues"),
        ("Warning", "CheckpointDamaged", "checkpoint at step 5 is damaged (crc); kept as /c/bad-step-5; the previous "
         "good checkpoint was used")]


def test_without_an_events_dir_the_notices_come_from_etcd(tmp_path: Path) -> None:
    """A plain helm install (etcd only): failing saves and damaged checkpoints still reach `kubectl describe`."""
    job = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": "j", "namespace": "ml", "uid": "uid-1", "resourceVersion": "1", "generation": 1},
           "spec": {"replicas": {"min": 1, "max": 1}, "trainer": {"training": {"globalBatch": 4, "microBatch": 1}}}}
    kube = RecordingKube(job)
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379")
    runner = JobRunner(kube, settings, "ml", "j", "uid-1", logging.getLogger("test"))  # type: ignore[arg-type]
    ledger = runner.observer.etcd.progress.ledger
    ledger.add(ProgressRecord(time=T0, attempt=T0, step=3, notices=(("damaged", "d"),), notices_total=1))
    asyncio.run(runner.reconcile_once())  # a new executor: what etcd holds already is not posted again
    ledger.add(ProgressRecord(time=T0 + 1, attempt=T0, step=4, notices=(("damaged", "d"), ("failed", "f")),
                              notices_total=2))
    asyncio.run(runner.reconcile_once())
    ledger.add(ProgressRecord(time=T0 + 5, attempt=T0 + 5, step=4, notices=(("damaged", "g"),), notices_total=1))
    asyncio.run(runner.reconcile_once())
    warnings = [(e["reason"], e["message"]) for e in kube.events if e["type"] == "Warning"]
    assert warnings == [("CheckpointFailed", "f"), ("CheckpointDamaged", "g")]
