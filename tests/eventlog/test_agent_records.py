"""The agent's records in the one fold (flywheel/eventlog/fold.py): any command's starts and failed ranks make the
run's restarts, failures and recoveries, as the embedded trainer's records do; and the agent's writer
(flywheel/agent/events.py)."""

from __future__ import annotations

import json
import signal

import pytest

from flywheel.agent import events as agent_events
from flywheel.contracts import exitcodes, termination_log
from flywheel.eventlog import EventName, fold, parse_record

T0 = 1000.0


def _fold(raw: list[dict]):
    records = [parse_record(r) for r in raw]
    assert None not in records, raw
    return fold(records)


def agent_start(t: float, group: str, restart_count: int = 0) -> dict:
    return {"event": "start", "time": T0 + t, "world_size": 2, "restart_count": restart_count, "group": group,
            "source": "agent"}


def trainer_start(t: float, group: str, resumed_from: int | None = None, restart_count: int = 0) -> dict:
    return {"event": "start", "time": T0 + t, "world_size": 2, "restart_count": restart_count, "group": group,
            "resumed_from": resumed_from}


def rank_exit(t: float, group: str, rank: int, code: int, message: str = "") -> dict:
    return {"event": "rank_exit", "time": T0 + t, "group": group,
            **agent_events.rank_exit_fields(rank, code, message)}


def step(n: int, t: float) -> dict:
    return {"event": "step", "time": T0 + t, "step": n, "step_seconds": 0.5, "loss": 1.0 / n}


SIGKILLED = 128 + signal.SIGKILL
GLOO = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer"


def user_script_with_a_kill(crash_first: bool) -> list[dict]:
    """A script reporting steps 1-6 (its own checkpoint at 4, unknown to Flywheel); rank 1 SIGKILLed at 6.5, rank 0
    then fails on the broken connection; the agents restart the group, which resumes from 4 and reaches 8."""
    kill = rank_exit(6.6, "a:1", 1, SIGKILLED)
    broken = rank_exit(6.5 if crash_first else 6.7, "a:1", 0, exitcodes.CRASH, GLOO)
    exits = [broken, kill] if crash_first else [kill, broken]
    return [agent_start(0, "a:1"), *[step(n, n) for n in range(1, 7)], *exits,
            agent_start(8, "a:2", restart_count=1), *[step(n, n + 4) for n in range(5, 9)]]


def test_a_user_scripts_kill_is_one_failure_one_restart_and_its_lost_steps():
    log = _fold(user_script_with_a_kill(crash_first=False))
    assert log.restarts == 1
    assert [(f.record.kind, f.record.rank, f.detail) for f in log.failures] == [
        ("signal-SIGKILL", 1, "rank 1: killed by SIGKILL")]
    [incident] = log.incidents
    assert incident.recovery_seconds == pytest.approx(9 - 6.6) and incident.lost_steps == 6 - 4


def test_the_peers_signal_death_is_the_cause_even_when_the_broken_connection_is_recorded_first():
    log = _fold(user_script_with_a_kill(crash_first=True))
    [entry] = log.failures
    assert entry.record.rank == 1 and entry.record.kind == "signal-SIGKILL"
    assert entry.incident.cause == "signal-SIGKILL" and entry.incident.reason == "rank 1: killed by SIGKILL"
    assert entry.incident.began == T0 + 6.5  # the outage began at the first record of it


def test_a_crash_alone_is_the_failure_with_the_ranks_own_message():
    raw = [agent_start(0, "a:1"), step(1, 1),
           rank_exit(2, "a:1", 0, exitcodes.CRASH, "ValueError: bad batch"), agent_start(3, "a:2", 1), step(2, 4)]
    [entry] = _fold(raw).failures
    assert entry.detail == "rank 0: exit code 1 (crash): ValueError: bad batch"


def test_the_agents_and_the_trainers_start_of_one_group_are_one_start():
    raw = [agent_start(0, "a:1"), trainer_start(2, "a:1"), step(1, 3), step(2, 4),
           {"event": "fault", "time": T0 + 4.5, "kind": "kill", "rank": 1, "step": 3, "group": "a:1"},
           rank_exit(4.7, "a:1", 1, SIGKILLED),
           agent_start(6, "a:2", 1), trainer_start(7, "a:2", resumed_from=2, restart_count=1), step(3, 8)]
    log = _fold(raw)
    assert log.restarts == 1 and [s.resumed_from for s in log.starts] == [None, 2]
    assert [s.time for s in log.starts] == [T0, T0 + 6]  # the group started when its agent started it
    # The trainer's own record of the fault is the failure; its agent's account of the same death is not another.
    assert [(f.record.event, f.record.kind) for f in log.failures] == [(EventName.FAULT, "kill")]


def test_a_lost_worker_is_the_failure_and_the_survivors_broken_connection_its_symptom():
    raw = [agent_start(0, "a:1"), step(1, 1), step(2, 2),
           {"event": "worker_exit", "time": T0 + 2.5, "replica": 1, "exit_code": 137, "kind": "Killed",
            "detail": "injected lose-worker"},
           rank_exit(2.8, "a:1", 0, exitcodes.CRASH, GLOO), agent_start(5, "a:2", 1), step(2, 6)]
    log = _fold(raw)
    assert [f.record.event for f in log.failures] == [EventName.WORKER_EXIT]
    assert log.restarts == 1 and log.incidents[0].lost_steps == 1


def test_failed_ranks_leave_out_those_the_agent_stopped_after_them():
    failures = {0: (-signal.SIGTERM, 5.0), 1: (-signal.SIGKILL, 4.0), 2: (exitcodes.STOPPED, 5.0)}
    assert agent_events.failed_ranks(failures) == [(1, SIGKILLED)]
    assert agent_events.failed_ranks({0: (-signal.SIGTERM, 5.0)}) == [(0, 128 + signal.SIGTERM)]


def test_the_agent_writes_its_records_to_the_event_log(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    said = tmp_path / "said"
    said.write_text("ValueError: bad batch")
    monkeypatch.setenv(termination_log.ENV, str(said))
    events = agent_events.AgentEvents({"FLYWHEEL_EVENTS_FILE": str(path)})
    events.started("127.0.0.1:5000", world_size=4, restart_count=0)
    events.ranks_failed("127.0.0.1:5000", {2: (1, 9.0), 3: (-signal.SIGTERM, 9.5)}, first_rank=2)
    events.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["event"], r["group"]) for r in lines] == [("start", "127.0.0.1:5000"), ("rank_exit", "127.0.0.1:5000")]
    assert lines[1]["rank"] == 2 and lines[1]["reason"] == "ValueError: bad batch" and lines[1]["exit_code"] == 1


def test_without_an_event_log_the_agent_writes_nothing(tmp_path):
    events = agent_events.AgentEvents({})
    events.started("127.0.0.1:5000", world_size=1, restart_count=0)  # no file, no error
    assert not list(tmp_path.iterdir())


def test_a_save_broken_by_a_peers_death_says_so_and_is_no_fault_of_the_storage():
    raw = [agent_start(0, "a:1"), step(1, 1), {"event": "checkpoint", "time": T0 + 1.5, "step": 1, "path": "/c/1"},
           step(2, 2), {"event": "fault", "time": T0 + 2.5, "kind": "kill", "rank": 1, "step": 3, "group": "a:1"},
           {"event": "checkpoint_failed", "time": T0 + 2.6, "step": 2, "reason": "other", "error": GLOO,
            "message": f"checkpoint at step 2 failed: rank 0: {GLOO}; training continues"},
           agent_start(4, "a:2", 1), step(2, 5),
           {"event": "checkpoint_failed", "time": T0 + 5.5, "step": 2, "reason": "other", "error": "ValueError: x"}]
    log = _fold(raw)
    abandoned, own = log.checkpoint_notices
    assert abandoned.words == ("checkpoint at step 2 abandoned: rank 1: kill (injected at step 3) during the save; "
                               "newest good checkpoint: step 1")
    assert abandoned.error == GLOO  # the transport's text is kept
    assert own.words == "checkpoint at step 2 failed: ValueError: x"  # a new group's own failure is its own


def test_a_storage_failure_during_a_failure_keeps_its_own_words():
    raw = [agent_start(0, "a:1"), step(1, 1), rank_exit(1.5, "a:1", 1, SIGKILLED),
           {"event": "checkpoint_failed", "time": T0 + 1.6, "step": 1, "reason": "no_space",
            "message": "checkpoint at step 1 failed: no space left on /ckpt"}]
    [notice] = _fold(raw).checkpoint_notices
    assert notice.words == "checkpoint at step 1 failed: no space left on /ckpt"
