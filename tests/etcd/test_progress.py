"""The etcd progress record's codec, the publisher's record from rank 0's events, and the operator's ledger over
attempts (pure pieces of flywheel/etcd/progress.py, trainer/progress_publisher.py, monitor/etcd_progress.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

from flywheel.etcd import keys
from flywheel.etcd.progress import PHASE_EVALUATING, PHASE_SAVING, CheckpointRecord, ProgressRecord, decode, encode
from flywheel.eventlog import EventLog, Start, Step, fold
from flywheel.monitor.etcd_progress import GoodputSeed, ProgressLedger, merged
from flywheel.operator.event_log import progress_of
from flywheel.policy.observed import ObservedProgress
from flywheel.trainer.progress_publisher import (
    ProgressPublisher,
    ProgressState,
    PublishingEventLog,
    progress_events,
    publish_activity,
)


def test_codec_round_trip_and_bad_values() -> None:
    record = ProgressRecord(time=10.5, attempt=3.0, step=7, resumed_from=2, world_size=4, loss=1.25,
                            tokens_per_second=900.0, checkpoint=CheckpointRecord(5, "/ckpt/step-5", 9.0),
                            productive_seconds=4.5, done=True)
    assert decode(encode(record)) == record
    assert decode(encode(ProgressRecord(time=1.0, attempt=1.0))) == ProgressRecord(time=1.0, attempt=1.0)
    diverged = decode(encode(ProgressRecord(time=1.0, attempt=1.0, loss=math.nan, tokens_per_second=math.inf)))
    assert diverged is not None and diverged.loss is None and diverged.tokens_per_second is None
    assert decode(b"not json") is None
    assert decode(b'{"v": 2, "time": 1, "attempt": 1}') is None  # another version: not read
    assert decode(b'{"v": 1, "time": "x", "attempt": 1}') is None
    assert decode(b"[1]") is None


def test_progress_keys_live_under_their_run() -> None:
    assert keys.progress_key("job-1", 0) == b"/flywheel/progress/job-1/0"
    assert keys.progress_key("job-1", 0).startswith(keys.progress_prefix("job-1"))


def test_publisher_state_follows_rank_zero_events() -> None:
    state = ProgressState()
    assert state.observe("checkpoint", {"step": 1}, 1.0) is False  # before `start` or a step: nothing yet
    assert state.observe("start", {"world_size": 2, "resumed_from": 4}, 10.0) is True
    assert state.record == ProgressRecord(time=10.0, attempt=10.0, step=4, resumed_from=4, world_size=2)
    assert state.observe("step", {"step": 5, "loss": 2.0, "step_seconds": 0.5, "tokens_per_second": 100.0,
                                  "world_size": 2}, 11.0) is True  # the attempt's first step: at once (recovery end)
    # Later steps are rate-limited, not urgent.
    assert state.observe("step", {"step": 6, "loss": 1.5, "step_seconds": 0.25}, 12.0) is False
    assert state.observe("checkpoint", {"step": 6, "path": "/c/6"}, 13.0) is True
    assert state.observe("fault", {"rank": 0}, 13.5) is False
    assert state.observe("done", {"step": 6}, 14.0) is True
    r = state.record
    assert r is not None and (r.step, r.loss, r.productive_seconds, r.done) == (6, 1.5, 0.75, True)
    assert r.checkpoint == CheckpointRecord(6, "/c/6", 13.0) and r.stepped
    # A new start (in-process restart) is a new attempt that keeps the last checkpoint.
    state.observe("start", {"world_size": 2, "resumed_from": 6}, 20.0)
    assert state.record is not None and state.record.attempt == 20.0 and state.record.checkpoint == r.checkpoint


def test_a_user_scripts_first_step_opens_the_attempt() -> None:
    state = ProgressState()  # flywheel.progress emits steps only, no `start`
    state.observe("step", {"step": 3, "step_seconds": 0.5, "world_size": 2}, 7.0)
    assert state.record == ProgressRecord(time=7.0, attempt=7.0, step=3, resumed_from=2, world_size=2,
                                          productive_seconds=0.5)


def test_only_rank_zero_of_an_etcd_run_publishes() -> None:
    env = {"PET_RDZV_BACKEND": "etcd-v3", "PET_RDZV_ENDPOINT": "127.0.0.1:1", "PET_RDZV_ID": "run"}
    assert type(progress_events(None, 1, env)).__name__ == "EventLog"
    assert type(progress_events(None, 0, {**env, "PET_RDZV_BACKEND": "c10d"})).__name__ == "EventLog"
    assert type(progress_events(None, 0, {**env, "PET_RDZV_ID": ""})).__name__ == "EventLog"


def _rec(attempt: float, time: float, step: int, resumed: int = 0, productive: float = 0.0,
         checkpoint: CheckpointRecord | None = None, done: bool = False) -> ProgressRecord:
    return ProgressRecord(time=time, attempt=attempt, step=step, resumed_from=resumed, world_size=2,
                          productive_seconds=productive, checkpoint=checkpoint, done=done)


def test_ledger_adds_attempts_up() -> None:
    ledger = ProgressLedger()
    c10 = CheckpointRecord(10, "/c/10", 104.0)
    for r in (_rec(100, 100, 0), _rec(100, 103, 8, productive=3.0), _rec(100, 105, 12, productive=5.0,
                                                                       checkpoint=c10),
              _rec(110, 110, 10, resumed=10, checkpoint=c10), _rec(110, 112, 11, resumed=10, productive=1.0),
              _rec(110, 120, 20, resumed=10, productive=9.0, checkpoint=CheckpointRecord(20, "/c/20", 119.5),
                   done=True)):
        ledger.add(r)
    ledger.add(_rec(110, 111, 10, resumed=10))  # an older value re-listed: ignored
    p = ledger.progress(GoodputSeed())
    assert (p.step, p.done, p.world_size, p.done_time) == (20, True, 2, 120)
    assert (p.checkpoint_step, p.checkpoint_path, p.checkpoint_time) == (20, "/c/20", 119.5)
    assert [c.step for c in p.checkpoints] == [10, 20] and [c.ordinal for c in p.checkpoints] == [1, 2]
    # productive 5 + 9 over the wall from the first attempt's start (100) to the last record (120)
    assert p.goodput == {"ratio": 0.7, "productiveSeconds": 14.0, "lostSteps": 2, "meanTimeToRecoverSeconds": 7.0}
    assert p.recoveries == ((112.0, 7.0),)  # the new attempt's first step - the old attempt's last record


def test_ledger_seeded_by_a_previous_operator_counts_only_what_it_sees() -> None:
    ledger = ProgressLedger()
    # The attempt started at 100, before this operator (started at 150); it had 40 productive seconds then.
    ledger.add(_rec(100, 151, 60, productive=40.0))
    ledger.add(_rec(100, 161, 70, productive=48.0))
    seed = GoodputSeed(productive_seconds=40.0, ratio=0.8, lost_steps=3, mean_time_to_recover_seconds=2.0,
                       operator_started=150.0)
    g = ledger.progress(seed).goodput
    assert g["productiveSeconds"] == 48.0  # 40 counted before + 8 seen here, not 40 + 48
    assert g["ratio"] == round(48.0 / (50.0 + 10.0), 4)  # the old wall (40 / 0.8) + 10 s seen here
    assert (g["lostSteps"], g["meanTimeToRecoverSeconds"]) == (3, 2.0)
    assert ProgressLedger().progress(seed) == ObservedProgress()


def test_merged_prefers_etcd_for_step_and_checkpoint_and_the_log_for_history() -> None:
    etcd = ObservedProgress(step=12, world_size=2, checkpoint_step=10, checkpoint_path="/c/10", checkpoint_time=5.0,
                            goodput={"ratio": 0.5})
    log = ObservedProgress(step=11, world_size=2, checkpoint_step=10, checkpoint_path="/c/10", checkpoint_time=4.0,
                           goodput={"ratio": 0.6, "lostSteps": 1}, failure_reason="boom", recoveries=((1.0, 2.0),))
    both = merged(etcd, log)
    assert (both.step, both.checkpoint_time, both.goodput, both.failure_reason) == (12, 5.0, log.goodput, "boom")
    assert both.recoveries == log.recoveries
    assert merged(etcd, None) == etcd and merged(None, log) == log
    assert merged(etcd, ObservedProgress()) == etcd  # an empty event log (no volume mounted yet)
    assert merged(None, None) == ObservedProgress()


def test_the_exit_reason_is_written_only_when_set_and_read_by_older_shapes() -> None:
    failed = ProgressRecord(time=2.0, attempt=1.0, step=3, exit_reason="ValueError: bad batch")
    assert decode(encode(failed)) == failed
    assert b"exitReason" not in encode(ProgressRecord(time=1.0, attempt=1.0))  # a running record is unchanged
    assert decode(b'{"v": 1, "time": 1, "attempt": 1}') == ProgressRecord(time=1.0, attempt=1.0)


def test_the_publisher_keeps_the_first_exit_reason_of_a_started_attempt() -> None:
    state = ProgressState()
    assert not state.observe_exit("too early", 1.0)  # no attempt yet: nothing to carry it
    state.observe("start", {"world_size": 2, "resumed_from": 0}, 2.0)
    assert state.observe_exit("RuntimeError: boom", 3.0) and not state.observe_exit("killed by SIGTERM", 4.0)
    assert state.record is not None and state.record.exit_reason == "RuntimeError: boom"
    state.observe("start", {"world_size": 2, "resumed_from": 0}, 5.0)  # a new attempt starts clean
    assert state.record is not None and state.record.exit_reason == ""


def test_the_ledger_says_why_the_newest_attempt_exited_until_another_starts() -> None:
    ledger = ProgressLedger()
    ledger.add(ProgressRecord(time=5.0, attempt=1.0, step=4, resumed_from=0))
    ledger.add(ProgressRecord(time=6.0, attempt=1.0, step=4, exit_reason="OSError: disk full"))
    assert ledger.progress(GoodputSeed()).failure_reason == "OSError: disk full"
    ledger.add(ProgressRecord(time=9.0, attempt=8.0, step=4, resumed_from=4))
    assert ledger.progress(GoodputSeed()).failure_reason == ""


def test_the_ledger_names_the_newest_attempt_and_whether_it_stepped() -> None:
    ledger = ProgressLedger()
    ledger.add(ProgressRecord(time=5.0, attempt=1.0, step=500, resumed_from=400))
    assert (ledger.progress(GoodputSeed()).attempt, ledger.progress(GoodputSeed()).attempt_stepped) == (1.0, True)
    ledger.add(ProgressRecord(time=9.0, attempt=8.0, step=400, resumed_from=400))  # restored, not stepped yet
    assert (ledger.progress(GoodputSeed()).attempt, ledger.progress(GoodputSeed()).attempt_stepped) == (8.0, False)


def test_merged_takes_the_newest_attempt_and_its_reason_from_the_source_that_knows_it() -> None:
    etcd = ObservedProgress(step=3, checkpoint_path="/c", failure_reason="OSError: new", attempt=8.0)
    log = ObservedProgress(step=3, goodput={"ratio": 0.5}, failure_reason="ValueError: old", attempt=1.0,
                           attempt_stepped=True)
    both = merged(etcd, log)
    assert (both.attempt, both.attempt_stepped, both.failure_reason) == (8.0, False, "OSError: new")
    newer_log = merged(ObservedProgress(step=3, checkpoint_path="/c", attempt=1.0), replace(log, attempt=8.0))
    assert (newer_log.attempt, newer_log.attempt_stepped, newer_log.failure_reason) == (8.0, True, "ValueError: old")


def test_merged_takes_the_etcd_reason_when_the_log_has_none() -> None:
    etcd = ObservedProgress(step=3, checkpoint_path="/c", failure_reason="from etcd")
    assert merged(etcd, ObservedProgress(step=2, goodput={"ratio": 0.5})).failure_reason == "from etcd"
    assert merged(etcd, ObservedProgress(step=2, failure_reason="from log")).failure_reason == "from log"


def _failed(step: int, reason: str) -> dict[str, object]:
    return {"step": step, "reason": reason, "message": f"checkpoint at step {step} failed: {reason}"}


def test_checkpoint_notices_go_out_at_once_each_cause_once_and_a_restores_with_the_start() -> None:
    state = ProgressState()
    # A restore that skipped a damaged checkpoint says so before the attempt's `start`: it goes out with it.
    assert state.observe("checkpoint_bad", {"step": 4, "path": "/c/bad-step-4", "reason": "crc"}, 1.0) is False
    assert state.observe("start", {"world_size": 1, "resumed_from": 2}, 2.0) is True
    assert state.record is not None and state.record.notices_total == 1
    kind, words = state.record.notices[0]
    assert kind == "damaged" and words.startswith("checkpoint at step 4 is damaged (crc); kept as /c/bad-step-4")
    assert state.observe("checkpoint_failed", _failed(6, "no_space"), 3.0) is True  # a new cause: at once
    assert state.observe("checkpoint_failed", _failed(8, "no_space"), 4.0) is False  # the same cause: counted only
    assert state.observe("checkpoint", {"step": 10, "path": "/c/10"}, 5.0) is True
    assert state.observe("checkpoint_failed", _failed(12, "no_space"), 6.0) is True  # again after a commit
    r = state.record
    assert r.notices_total == 3 and [k for k, _ in r.notices] == ["damaged", "failed", "failed"]
    assert r.notices[1][1] == "checkpoint at step 6 failed: no_space" and decode(encode(r)) == r
    for step in range(14, 40, 2):  # a record carries the newest RECENT_NOTICES
        state.observe("checkpoint_failed", _failed(step, f"cause-{step}"), float(step))
    assert state.record.notices_total == 16 and len(state.record.notices) == 8
    assert state.record.notices[-1][1].startswith("checkpoint at step 38 failed")


def test_the_ledger_numbers_every_attempts_notices_once() -> None:
    ledger = ProgressLedger()
    first = ProgressRecord(time=1.0, attempt=1.0, notices=(("failed", "a"),), notices_total=1)
    ledger.add(first)
    ledger.add(first)  # the same record again (a re-listing): nothing new
    ledger.add(ProgressRecord(time=2.0, attempt=1.0, notices=(("failed", "a"), ("damaged", "b")), notices_total=2))
    ledger.add(ProgressRecord(time=3.0, attempt=3.0, notices=(("failed", "c"),), notices_total=1))  # a new attempt
    assert ledger.progress(GoodputSeed()).checkpoint_notices == ((1, "failed", "a"), (2, "damaged", "b"),
                                                                 (3, "failed", "c"))
    assert decode(encode(ProgressRecord(time=1.0, attempt=1.0))) == ProgressRecord(time=1.0, attempt=1.0)
    assert b"checkpointNotices" not in encode(ProgressRecord(time=1.0, attempt=1.0))  # written only when set


def test_an_attempt_already_complete_says_so_through_etcd() -> None:
    """A group that resumed at or past its last step trains nothing; its `done` names the checkpoint, so the
    operator's Succeeded condition says "already complete at step N (checkpoint PATH)" without an event log."""
    state = ProgressState()
    state.observe("start", {"world_size": 1, "resumed_from": 30}, 1.0)
    assert state.observe("done", {"step": 30, "already_complete_checkpoint": "/c/step-00000030"}, 2.0) is True
    record = state.record
    assert record is not None and record.already_complete == "/c/step-00000030" and decode(encode(record)) == record
    ledger = ProgressLedger()
    ledger.add(record)
    seen = ledger.progress(GoodputSeed())
    assert seen.done and seen.already_complete_checkpoint == "/c/step-00000030"
    assert merged(seen, ObservedProgress(step=30)).already_complete_checkpoint == "/c/step-00000030"
    assert b"alreadyComplete" not in encode(ProgressRecord(time=1.0, attempt=1.0, done=True))


def test_the_event_log_names_the_newest_start_and_whether_it_stepped() -> None:
    assert (progress_of(fold([])).attempt, progress_of(fold([])).attempt_stepped) == (0.0, False)
    trained = progress_of(fold([Start(time=10.0, resumed_from=400), Step(time=11.0, step=401)]))
    assert (trained.attempt, trained.attempt_stepped) == (10.0, True)
    restored = progress_of(fold([Start(time=10.0), Step(time=11.0, step=1), Start(time=20.0, resumed_from=1)]))
    assert (restored.attempt, restored.attempt_stepped) == (20.0, False)


def test_the_record_carries_evaluation_and_final_save_activity() -> None:
    record = ProgressRecord(time=5.0, attempt=1.0, step=3, resumed_from=0, phase=PHASE_EVALUATING, heartbeat=5.0)
    assert decode(encode(record)) == record
    assert b"phase" not in encode(replace(record, phase="", heartbeat=0.0))  # written only when set
    state = ProgressState()
    assert state.observe_activity(PHASE_EVALUATING, 1.0) is False  # before `start`: no record to carry it
    state.observe("start", {"world_size": 2}, 2.0)
    state.observe("step", {"step": 1, "step_seconds": 0.5}, 3.0)
    # Evaluation batches are rate-limited like steps; each one moves the heartbeat.
    assert state.observe_activity(PHASE_EVALUATING, 4.0) is False
    assert state.observe_activity(PHASE_EVALUATING, 4.5) is False
    assert state.record is not None and (state.record.phase, state.record.heartbeat) == (PHASE_EVALUATING, 4.5)
    state.observe("eval", {"step": 1, "loss": 2.0}, 5.0)  # the evaluation is over
    assert state.record is not None and (state.record.phase, state.record.heartbeat) == ("", 0.0)
    # The final save's start goes out at once (the operator pauses its check); its checkpoint keeps the phase.
    assert state.observe_activity(PHASE_SAVING, 6.0) is True
    state.observe("checkpoint", {"step": 1, "path": "/c/1"}, 7.0)
    assert state.record is not None and state.record.phase == PHASE_SAVING
    state.observe("done", {"step": 1}, 8.0)
    assert state.record is not None and state.record.phase == "" and state.record.done


def test_activity_reaches_only_a_publishing_event_log() -> None:
    seen: list[str] = []
    publisher = cast(ProgressPublisher, SimpleNamespace(activity=seen.append, observe=lambda *a: None))
    publish_activity(PublishingEventLog(None, publisher), PHASE_SAVING)
    publish_activity(EventLog(None), PHASE_SAVING)  # no etcd progress: nothing to tell
    assert seen == [PHASE_SAVING]


def test_done_time_is_the_first_record_saying_done() -> None:
    """The finish grace counts from the done report: later writes of the same attempt (a rank's exit reason in its
    teardown) do not move it; the view of a run not done has none."""
    ledger = ProgressLedger()
    ledger.add(_rec(100, 101, 5))
    assert ledger.progress(GoodputSeed()).done_time is None
    ledger.add(_rec(100, 120, 20, done=True))
    ledger.add(_rec(100, 150, 20, done=True))
    assert ledger.progress(GoodputSeed()).done_time == 120
