"""The one fold of the event log (flywheel/eventlog/fold.py): synthetic records in, the run's numbers out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flywheel.eventlog import EventName, Failure, fold, parse_record

T0 = 1000.0
ROOT = Path(__file__).resolve().parents[2]


def _records(raw: list[dict]) -> list:
    out = [parse_record(r) for r in raw]
    assert None not in out, raw
    return out


def step(n: int, t: float, **fields) -> dict:
    return {"event": "step", "time": T0 + t, "step": n, "step_seconds": 0.5, "world_size": 2, **fields}


def start(t: float, resumed_from: int | None = None, restart_count: int = 0) -> dict:
    return {"event": "start", "time": T0 + t, "world_size": 2, "restart_count": restart_count,
            "resumed_from": resumed_from}


def two_failures() -> list[dict]:
    """Steps 1-6 (checkpoint at 4), a kill at 6.5 and every other rank's collective timeout, a restart from 4 that
    replays 5-6 and reaches 7; a hang at 12.5 with no other record, a restart from 6 that replays 7."""
    raw = [start(0)] + [step(n, n) for n in range(1, 7)]
    raw += [{"event": "checkpoint", "time": T0 + 4.2, "step": 4, "path": "/c/4"},
            {"event": "fault", "time": T0 + 6.5, "kind": "kill", "rank": 1, "step": 7},
            {"event": "collective_timeout", "time": T0 + 6.8, "rank": 0, "error": "gloo: Connection closed"},
            start(9, resumed_from=4, restart_count=1), step(5, 10), step(6, 11), step(7, 12),
            {"event": "checkpoint", "time": T0 + 11.2, "step": 6, "path": "/c/6"},
            {"event": "hang", "time": T0 + 12.5, "rank": 0, "seconds_since_step": 30},
            start(14, resumed_from=6, restart_count=2), step(7, 15), step(8, 16),
            {"event": "done", "time": T0 + 16.5, "step": 8, "params_sha256": "ab"}]
    return raw


def test_lost_steps_are_the_highest_step_before_each_failure_minus_the_step_resumed_from():
    log = fold(_records(two_failures()))
    assert [(i.step_at_failure, i.resumed_from, i.lost_steps) for i in log.incidents] == [(6, 4, 2), (7, 6, 1)]
    assert log.lost_steps == 3 == len(log.attempts) - len(log.steps)  # every replayed attempt, once


def test_recovery_time_runs_from_the_failure_to_the_first_step_after():
    log = fold(_records(two_failures()))
    assert [i.recovery_seconds for i in log.incidents] == [pytest.approx(10 - 6.5), pytest.approx(15 - 12.5)]
    assert log.mean_time_to_recover == pytest.approx((3.5 + 2.5) / 2)
    assert log.open_incident is None


def test_a_step_logged_by_the_failed_group_is_no_recovery_but_was_reached():
    raw = [start(0), step(1, 1), step(2, 2), {"event": "fault", "time": T0 + 2.5, "kind": "kill", "rank": 1},
           step(3, 2.6),  # in flight when the rank died
           start(5, resumed_from=1), step(2, 6)]
    [incident] = fold(_records(raw)).incidents
    assert incident.recovered_at == T0 + 6 and incident.lost_steps == 3 - 1


def test_a_restart_without_a_failure_record_is_an_incident_from_the_last_step():
    raw = [start(0), step(1, 1), step(2, 2), start(7, resumed_from=1), step(2, 8)]
    [incident] = fold(_records(raw)).incidents
    assert incident.cause == "restart" and incident.recovery_seconds == pytest.approx(6.0)
    assert incident.lost_steps == 1


def test_collective_timeout_is_a_failure_with_its_error_as_reason():
    raw = [start(0), step(1, 1), {"event": "collective_timeout", "time": T0 + 2, "rank": 1,
                                  "error": "Timed out\n waiting for allreduce"}]
    log = fold(_records(raw))
    [entry] = log.failures
    assert entry.record.kind == "collective-timeout" and entry.reason == "Timed out waiting for allreduce"
    assert log.open_incident is not None and log.lost_steps == 0  # not recovered: nothing replayed yet


def test_one_outage_reported_by_every_rank_is_one_failure():
    log = fold(_records(two_failures()))
    assert [(f.record.event, f.record.kind) for f in log.failures] == [(EventName.FAULT, "kill"),
                                                                       (EventName.HANG, "hang")]
    assert log.incidents[0].reason == "gloo: Connection closed"  # the duplicate still gives its reason


def test_a_step_without_loss_or_throughput_is_valid():
    log = fold(_records([{"event": "step", "time": T0, "step": 1}, {"event": "step", "time": T0 + 1, "step": 2,
                                                                       "loss": None, "step_seconds": 0.2}]))
    assert log.last_step == 2 and log.last_loss is None and log.losses() == [None, None]
    assert log.last is not None and log.last.tokens_per_second is None
    assert log.productive_seconds == pytest.approx(0.2)


def test_a_user_error_reason_reaches_the_worker_exit():
    raw = [start(0), {"event": "user_error", "time": T0 + 1, "rank": 0,
                      "reason": "ParallelismError: tp 2 does not divide 3 heads"},
           {"event": "worker_exit", "time": T0 + 2, "replica": 0, "exit_code": 3, "kind": "UserError"}]
    log = fold(_records(raw))
    assert [f.detail for f in log.failures] == ["ParallelismError: tp 2 does not divide 3 heads",
                                                "exit 3 (user-error): ParallelismError: tp 2 does not divide 3 heads"]
    assert log.failure_reason == "ParallelismError: tp 2 does not divide 3 heads"


def test_a_user_script_log_without_starts_recovers_at_the_next_step():
    raw = [step(1, 1), step(2, 2), {"event": "worker_exit", "time": T0 + 3, "replica": 1, "exit_code": 137,
                                    "kind": "Killed"}, step(1, 5), step(2, 6), step(3, 7)]
    log = fold(_records(raw))
    [incident] = log.incidents
    assert incident.recovery_seconds == pytest.approx(2.0) and incident.lost_steps == 2


def test_unknown_names_and_missing_fields_are_skipped():
    assert parse_record({"event": "something_new", "time": 1}) is None
    assert parse_record({"event": "step", "time": 1}) is None  # a step needs its number
    assert isinstance(parse_record({"event": "fault", "time": 1, "kind": "hang", "rank": 0}), Failure)


def _emitted_names() -> set[str]:
    """Every literal name passed to `.emit(...)` in flywheel/ (the writers of the log)."""
    names = set()
    for path in (ROOT / "flywheel").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                names.add(node.args[0].value)
    return names


def test_every_emitted_name_is_in_the_enum_and_documented():
    emitted = _emitted_names()
    assert {"start", "step", "checkpoint", "done"} <= emitted  # the walk finds the writers
    assert emitted <= {n.value for n in EventName}
    contracts = (ROOT / "docs" / "contracts.md").read_text()
    assert all(f"| `{n.value}` |" in contracts for n in EventName)


def test_a_failure_logged_by_a_group_that_is_no_longer_current_is_no_incident():
    """A cut-off worker's ranks resume when their node comes back, find their peers gone and log a collective
    timeout before they die: that group was replaced long ago (the start of the current one names another group),
    so it opens no incident. It opened one that stayed open until the next start, and bench/goodput_operator read a
    0.9 s rank restart 23 s later as a 24 s recovery."""
    old, new = "127.0.0.1:4000", "127.0.0.1:5000"
    raw = [{**start(0), "group": old}, step(1, 1), step(2, 2),
           {"event": "fault", "time": T0 + 2.5, "kind": "lose-node", "rank": 3},
           {**start(5, resumed_from=2), "group": new}, step(3, 6), step(4, 7),
           {"event": "collective_timeout", "time": T0 + 7.5, "rank": 2, "error": "closed by peer", "group": old},
           step(5, 8), {"event": "collective_timeout", "time": T0 + 8.5, "rank": 2, "error": "reset", "group": new},
           {**start(9, resumed_from=5, restart_count=1), "group": "127.0.0.1:6000"}, step(6, 10)]
    log = fold(_records(raw))
    assert [(i.cause, i.recovery_seconds) for i in log.incidents] == [
        ("lose-node", pytest.approx(6 - 2.5)), ("collective-timeout", pytest.approx(10 - 8.5))]
    assert log.open_incident is None


def test_the_writer_tags_every_record_with_its_group(tmp_path):
    import json

    from flywheel.eventlog import EventLog
    from flywheel.eventlog.writer import group_of

    assert group_of({"MASTER_ADDR": "h", "MASTER_PORT": "29500"}) == "h:29500" and group_of({}) == ""
    log = EventLog(tmp_path / "e.jsonl", "h:29500")
    log.emit("collective_timeout", rank=1, error="x")
    log.close()
    record = json.loads((tmp_path / "e.jsonl").read_text())
    assert record["group"] == "h:29500" and parse_record(record).group == "h:29500"  # type: ignore[union-attr]
