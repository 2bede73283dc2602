"""The same event log, folded by every reader (the local summary, the operator's progress, the API's local-run view,
the goodput benchmark), gives the same steps, lost steps, recovery times and failures. Before the one fold these
disagreed: 4 lost steps against 2, recovery counted from the restart against from the failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.goodput_faults import analyse_faults, read_events
from flywheel.api.localrun import EventLogSource
from flywheel.local.run_record import RunRecord
from flywheel.operator.event_log import EventLogTail
from flywheel.spec import parse_job
from tests.eventlog.test_fold import T0, start, step

JOB = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "tiny"},
       "spec": {"replicas": {"min": 2, "max": 2}, "trainer": {"training": {"steps": 8, "globalBatch": 8,
                                                                            "microBatch": 2}}}}


def replayed_twice() -> list[dict]:
    """Steps 1-6; a kill at 6.5 (the supervisor sees the worker exit at 6.7); a restart from 4 replays 5 and 6 and
    dies again at 11.5 (a rank's uncaught exception: no record); a restart from 4 again replays 5 and 6 again."""
    raw = [start(0)] + [step(n, n, loss=10.0 - n) for n in range(1, 7)]
    raw += [{"event": "checkpoint", "time": T0 + 4.2, "step": 4, "path": "/c/4", "blocking_seconds": 0.1,
             "total_seconds": 0.2},
            {"event": "fault", "time": T0 + 6.5, "kind": "kill", "rank": 1, "step": 7},
            {"event": "worker_exit", "time": T0 + 6.7, "replica": 1, "exit_code": 137, "kind": "Killed"},
            start(9, resumed_from=4, restart_count=1), step(5, 10, loss=5.0), step(6, 11, loss=4.0),
            start(14, resumed_from=4, restart_count=2), step(5, 15, loss=5.0), step(6, 16, loss=4.0),
            step(7, 17, loss=3.0), step(8, 18, loss=2.0),
            {"event": "done", "time": T0 + 18.5, "step": 8, "params_sha256": "ab"}]
    return raw


@pytest.fixture()
def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in replayed_twice()))
    return path


def test_every_reader_reports_the_same_numbers(log_file: Path) -> None:
    record = RunRecord()
    for r in read_events(log_file):
        record.add_event(r)
    summary = record.summary(job="tiny", status="Succeeded", exit_code=0, world_size=2, start_time=T0,
                             wall_seconds=20.0)
    progress = EventLogTail(log_file).poll()
    api = EventLogSource(parse_job(JOB), log_file).jobs()[0]["status"]
    bench = analyse_faults([{"kind": "kill", "time": T0 + 6.5}], read_events(log_file), [])

    lost, recovery = 2 + 2, (10 - 6.5 + 15 - 11) / 2  # from the kill; from the last step before the silent crash
    assert summary["lost_steps"] == progress.goodput["lostSteps"] == api["goodput"]["lostSteps"] == lost
    assert summary["mean_time_to_recover_seconds"] == pytest.approx(recovery)
    assert progress.goodput["meanTimeToRecoverSeconds"] == api["goodput"]["meanTimeToRecoverSeconds"] == recovery
    assert [seconds for _, seconds in progress.recoveries] == [pytest.approx(3.5), pytest.approx(4.0)]
    assert bench[0]["restart_s"] == pytest.approx(3.5) and bench[0]["lost_steps"] == 2
    assert summary["steps_completed"] == progress.step == api["step"] == 8
    assert summary["restarts"] == api["restarts"] == 2
    assert summary["productive_seconds"] == pytest.approx(progress.goodput["productiveSeconds"])
    assert [(f["kind"], f["recovered_seconds"]) for f in summary["failures"]] == \
        [("kill", pytest.approx(3.5)), ("Killed", pytest.approx(3.3))]
    assert api["lastRestartReason"] == "Killed"


def test_a_worker_that_exits_user_error_says_why_in_every_view(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    reason = "ParallelismError: tp 2 does not divide 3 heads"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        start(0), {"event": "user_error", "time": T0 + 1, "rank": 0, "reason": reason},
        {"event": "user_error", "time": T0 + 1.1, "rank": 1, "reason": reason},
        {"event": "worker_exit", "time": T0 + 2, "replica": 0, "exit_code": 3, "kind": "UserError"}]))
    record = RunRecord()
    for r in read_events(path):
        record.add_event(r)
    summary = record.summary(job="tiny", status="Failed", exit_code=1, world_size=2, start_time=T0,
                             wall_seconds=3.0)
    assert summary["failure_reason"] == reason
    assert [f["detail"] for f in summary["failures"]] == [reason, f"exit 3 (user-error): {reason}"]
    tail = EventLogTail(path)
    tail.poll()
    assert tail.failure_reason == reason
    api = EventLogSource(parse_job(JOB), path).jobs()[0]["status"]
    assert api["phase"] == "Restarting" and api["conditions"][0]["message"] == reason


def test_the_failures_table_prints_a_reason_that_looks_like_markup(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from flywheel.local.report import print_summary

    error = "[/__w/pytorch/third_party/gloo/pair.cc:553] Connection closed by peer"
    record = RunRecord()
    for r in [start(0), step(1, 1), {"event": "collective_timeout", "time": T0 + 2, "rank": 0, "error": error}]:
        record.add_event(r)
    summary = record.summary(job="tiny", status="Failed", exit_code=1, world_size=2, start_time=T0,
                             wall_seconds=3.0)
    out = io.StringIO()
    print_summary(Console(file=out, width=300), summary, tmp_path)
    assert "pair.cc:553] Connection closed" in out.getvalue()


def test_checkpoint_failures_are_reported_once_per_cause_by_the_summary_and_the_operator(tmp_path: Path) -> None:
    def failed(t: float, reason: str) -> dict:
        return {"event": "checkpoint_failed", "time": T0 + t, "step": int(t), "reason": reason,
                "message": f"checkpoint at step {int(t)} failed: {reason}", "error": "x"}

    raw = [start(0), failed(2, "no_space"), failed(4, "no_space"), failed(6, "permission"),
           {"event": "checkpoint", "time": T0 + 8, "step": 8, "path": "/c/8"}, failed(10, "permission"),
           {"event": "checkpoint_failed", "time": T0 + 12, "step": 12, "error": "older trainer"}]
    record = RunRecord()
    for ev in raw:
        record.add_event(ev)
    summary = record.summary(job="j", status="Succeeded", exit_code=0, world_size=1, start_time=T0,
                             wall_seconds=10.0)
    assert summary["checkpoint_failures"] == 5
    assert [(r["step"], r["reason"], r["count"]) for r in summary["checkpoint_failure_reports"]] == [
        (2, "no_space", 2), (6, "permission", 1), (10, "permission", 1), (12, None, 1)]
    assert summary["checkpoint_failure_reports"][-1]["message"] == "checkpoint at step 12 failed: older trainer"
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in raw))
    progress = EventLogTail(log).poll()
    assert [o for o, _, _ in progress.checkpoint_notices] == [1, 2, 3, 4]
    assert progress.checkpoint_notices[0][1:] == ("failed", "checkpoint at step 2 failed: no_space")


def test_a_damaged_checkpoint_is_in_the_summary_in_words_for_its_tier() -> None:
    record = RunRecord()
    for ev in [start(0), {"event": "checkpoint_bad", "time": T0 + 1, "step": 4, "path": "/c/bad-step-00000004-1",
                          "reason": "__0_0.distcp: crc32 1, committed as 2"},
               {"event": "checkpoint_bad", "time": T0 + 2, "step": 6, "path": "/dev/shm/f/own-rank-00001/s.bin",
                "reason": "xxh3 of model.w does not match", "source": "memory"}]:
        record.add_event(ev)
    summary = record.summary(job="j", status="Succeeded", exit_code=0, world_size=1, start_time=T0, wall_seconds=1.0)
    disk, memory = summary["bad_checkpoints"]
    assert disk == {"step": 4, "path": "/c/bad-step-00000004-1", "reason": "__0_0.distcp: crc32 1, committed as 2",
                    "source": "disk", "words": "checkpoint at step 4 is damaged (__0_0.distcp: crc32 1, committed as "
                    "2); kept as /c/bad-step-00000004-1; the previous good checkpoint was used"}
    assert memory["source"] == "memory" and memory["words"].startswith(
        "memory copy of step 6 is damaged (xxh3 of model.w does not match); deleted (/dev/shm/f/own-rank-00001/")
