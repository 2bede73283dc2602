"""Folding the event log into a run summary (pure: synthetic events, no processes)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from flywheel.local.report import print_summary
from flywheel.local.run_record import EventTail, fold

T0 = 1000.0


def _step(step: int, t: float, loss: float, seconds: float = 0.5) -> dict:
    return {"event": "step", "time": T0 + t, "step": step, "loss": loss, "step_seconds": seconds,
            "tokens_per_second": 100.0, "world_size": 4}


def _run_with_replay() -> list[dict]:
    """Steps 1-6, checkpoint at 4, rank 1 killed at step 7, restart from 4 replays 5-6, then 7-8 and done."""
    events = [{"event": "start", "time": T0, "rank": 0, "world_size": 4, "dp": 4, "restart_count": 0,
               "resumed_from": None}]
    events += [_step(s, s, 10.0 - s) for s in range(1, 7)]
    events.insert(5, {"event": "checkpoint", "time": T0 + 4.2, "step": 4, "blocking_seconds": 0.01,
                      "total_seconds": 0.3, "path": "/c/step-4"})
    events += [{"event": "fault", "time": T0 + 6.5, "kind": "kill", "rank": 1, "step": 7},
               # the survivors' watchdogs may report the same outage: not a second failure
               {"event": "hang", "time": T0 + 6.9, "rank": 2, "seconds_since_step": 20.0},
               {"event": "start", "time": T0 + 9.0, "rank": 0, "world_size": 4, "dp": 4, "restart_count": 1,
                "resumed_from": 4},
               {"event": "restore", "time": T0 + 9.1, "step": 4, "path": "/c/step-4", "from_world_size": 4,
                "world_size": 4}]
    events += [_step(5, 10, 4.5, 0.7), _step(6, 11, 3.5, 0.7), _step(7, 12, 3.0), _step(8, 13, 2.0)]
    events += [{"event": "done", "time": T0 + 13.5, "step": 8, "params_sha256": "ab" * 32}]
    return events


def test_replayed_steps_keep_the_last_attempt():
    record = fold(_run_with_replay())
    summary = record.summary(job="j", status="Succeeded", exit_code=0, world_size=4, start_time=T0,
                             wall_seconds=20.0)
    assert summary["steps_completed"] == 8
    assert summary["losses"] == [9.0, 8.0, 7.0, 6.0, 4.5, 3.5, 3.0, 2.0]
    assert summary["lost_steps"] == 2
    assert summary["final_params_sha256"] == "ab" * 32
    # goodput counts only the last attempt of each step: 4 x 0.5 + 2 x 0.7 + 2 x 0.5 over 20 s of wall time
    assert summary["productive_seconds"] == pytest.approx(4.4)
    assert summary["goodput"] == pytest.approx(4.4 / 20.0)
    assert summary["checkpoints"] == [{"step": 4, "blocking_seconds": 0.01, "total_seconds": 0.3,
                                       "path": "/c/step-4"}]
    assert summary["resumed_from"] == [None, 4]
    # a restore record without `source` (an older writer) reads as disk
    assert summary["restores"] == [{"step": 4, "source": "disk", "path": "/c/step-4"}]
    assert summary["checkpoint_memory_bytes"] is None
    json.dumps(summary)  # summary.json must be serialisable as is


def test_a_restart_a_peers_failure_made_counts_as_an_agent_restart():
    """Rank 0's agent counts only its own ranks' failures in restart_count: rank 1 (another worker) died, so the
    restarted group's start still says 0; it is a restart in place all the same."""
    events = _run_with_replay()
    events[next(i for i, e in enumerate(events) if e["event"] == "start" and e["restart_count"])]["restart_count"] = 0
    summary = fold(events).summary(job="j", status="Succeeded", exit_code=0, world_size=4, start_time=T0,
                                   wall_seconds=20.0)
    assert summary["restarts"] == 1 and summary["agent_restarts"] == 1

def test_failures_restarts_and_recovery():
    summary = fold(_run_with_replay()).summary(job="j", status="Succeeded", exit_code=0, world_size=4,
                                               start_time=T0, wall_seconds=20.0)
    assert summary["restarts"] == 1 and summary["agent_restarts"] == 1
    assert [(f["rank"], f["kind"]) for f in summary["failures"]] == [(1, "kill")]
    failure = summary["failures"][0]
    assert failure["time"] == pytest.approx(6.5)
    assert failure["recovered_seconds"] == pytest.approx(10 - 6.5)  # first step after the failure
    assert summary["mean_time_to_recover_seconds"] == pytest.approx(3.5)


def test_worker_exits_and_recreations_from_the_supervisor():
    record = fold(_run_with_replay()[:9])  # up to the kill fault: no restart yet
    record.add_event({"event": "worker_exit", "time": T0 + 6.6, "replica": 1, "exit_code": -9, "kind": "Killed",
                      "detail": "injected lose-worker"})
    record.add_recreation(T0 + 6.7, (0, 1), "RestartJob", "Killed")
    record.add_event({"event": "start", "time": T0 + 11, "resumed_from": 4})
    record.add_event(_step(5, 12, 4.0))
    summary = record.summary(job="j", status="Failed", exit_code=1, world_size=4, start_time=T0, wall_seconds=13)
    kinds = [(f["kind"], f["rank"], f["replica"]) for f in summary["failures"]]
    assert kinds == [("kill", 1, None), ("Killed", None, 1)]
    assert summary["failures"][1]["recovered_seconds"] == pytest.approx(12 - 6.6)
    # one incident, from its first failure record (the fault at 6.5) to the first step of the new group
    assert summary["mean_time_to_recover_seconds"] == pytest.approx(12 - 6.5)
    assert summary["lost_steps"] == 2  # steps 5 and 6 were reached and are trained again
    assert summary["worker_recreations"][0]["replicas"] == [0, 1]
    assert summary["final_params_sha256"] is None and summary["steps_completed"] == 6


def test_a_second_epoch_counts_its_own_failure():
    events = _run_with_replay()[:-1]
    events += [{"event": "hang", "time": T0 + 14, "rank": 3, "seconds_since_step": 20.0},
               {"event": "start", "time": T0 + 16, "rank": 0, "world_size": 4, "dp": 4, "restart_count": 2,
                "resumed_from": 4}]
    record = fold(events)
    assert [f.record.kind for f in record.log.failures] == ["kill", "hang"]
    summary = record.summary(job="j", status="Succeeded", exit_code=0, world_size=4, start_time=T0, wall_seconds=20.0)
    assert record.restarts == 2 and summary["agent_restarts"] == 2


def test_steps_before_a_resume_from_an_earlier_run_are_null():
    events = [{"event": "start", "time": T0, "rank": 0, "world_size": 2, "dp": 2, "restart_count": 0,
               "resumed_from": 2}, _step(3, 1, 1.5), _step(4, 2, 1.25)]
    assert fold(events).log.losses() == [None, None, 1.5, 1.25]


def test_event_tail_waits_for_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read_new() == []  # no file yet
    with open(path, "w") as f:
        f.write(json.dumps(_step(1, 1, 2.0)) + "\n" + '{"event": "step", "ti')
    assert [e.step for e in tail.read_new()] == [1]
    with open(path, "a") as f:
        f.write('me": 1, "step": 2, "loss": 1.0}\nnot json\n')
    assert [e.step for e in tail.read_new()] == [2]
    assert tail.read_new() == []


def test_the_restore_source_and_memory_bytes_reach_the_summary():
    events = _run_with_replay()
    for e in events:
        if e["event"] == "restore":
            e["source"] = "memory-peer"
        if e["event"] == "done":
            e["checkpoint_memory_bytes"] = 4096
    summary = fold(events).summary(job="j", status="Succeeded", exit_code=0, world_size=4, start_time=T0,
                                   wall_seconds=20.0)
    assert summary["restores"] == [{"step": 4, "source": "memory-peer", "path": "/c/step-4"}]
    assert summary["checkpoint_memory_bytes"] == 4096
    # the failure names the checkpoint its recovery loaded, in summary.json and in the terminal's table
    assert [f["restored_from"] for f in summary["failures"]] == [{"source": "memory-peer", "step": 4}]
    console = Console(file=io.StringIO(), width=200)
    print_summary(console, summary, Path("/out"))
    assert "step 4 (memory-peer)" in console.file.getvalue()


def test_a_failure_not_recovered_names_no_restore():
    events = [e for e in _run_with_replay() if e["event"] in ("start", "step", "fault")][:8]
    summary = fold(events).summary(job="j", status="Failed", exit_code=1, world_size=4, start_time=T0,
                                   wall_seconds=20.0)
    assert [(f["recovered_seconds"], f["restored_from"]) for f in summary["failures"]] == [(None, None)]
