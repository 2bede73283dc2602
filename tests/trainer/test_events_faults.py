import json
import signal
import subprocess
import sys
import textwrap

import pytest

from flywheel.contracts.faults import Fault, faults_from_env, parse_fault_flag
from flywheel.eventlog.writer import EventLog
from flywheel.trainer.ft import fault_injector as faults_mod
from flywheel.trainer.ft.fault_injector import FaultInjector


def faults_to_env(faults: list[Fault]) -> str:
    """The FLYWHEEL_FAULTS value for a list of faults, as `flywheel run --fault` hands them over."""
    return json.dumps([f.to_json() for f in faults], separators=(",", ":"))


def test_event_lines_are_json_with_event_and_time(tmp_path):
    path = tmp_path / "sub" / "events.jsonl"
    log = EventLog(path)
    log.emit("step", step=1, loss=2.5)
    log.emit("step", step=2, loss=float("nan"))
    EventLog(path).emit("done", step=2, params_sha256="ab")  # another writer appends
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["event"] for e in lines] == ["step", "step", "done"]
    assert lines[0]["loss"] == 2.5 and lines[1]["loss"] is None and isinstance(lines[2]["time"], float)
    EventLog(None).emit("step", step=1)  # disabled log: nothing to write, no error


def test_event_survives_sigkill_of_the_writer(tmp_path):
    path = tmp_path / "events.jsonl"
    code = textwrap.dedent(f"""
        import os, signal
        from flywheel.eventlog.writer import EventLog
        EventLog({str(path)!r}).emit("fault", kind="kill", rank=0, step=3)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL
    assert json.loads(path.read_text())["step"] == 3


def test_parse_fault_flags():
    assert parse_fault_flag("kill:rank=1:step=5") == Fault(id="f0", kind="kill", step=5, rank=1)
    assert parse_fault_flag("hang:step=3:rank=0", index=2) == Fault(id="f2", kind="hang", step=3, rank=0)
    lose = parse_fault_flag("lose-worker:replica=1:step=8", index=1)
    assert lose == Fault(id="f1", kind="lose-worker", step=8, replica=1)
    assert faults_from_env(faults_to_env([lose])) == [lose]
    assert json.loads(faults_to_env([lose])) == [{"id": "f1", "kind": "lose-worker", "step": 8, "replica": 1}]


@pytest.mark.parametrize(("flag", "message"), [
    ("explode:rank=1:step=5", "unknown kind"),
    ("kill:rank=1", "step= is missing"),
    ("kill:rank=x:step=5", "not an integer"),
    ("kill:step=5", "needs an integer rank"),
    ("kill:rank=1:step=0", "step >= 1"),
    ("kill:replica=1:rank=1:step=2", "takes rank=, not replica="),
    ("lose-worker:rank=1:step=2", "needs an integer replica"),
    ("kill:rank=1:rank=2:step=2", "repeated"),
])
def test_bad_fault_flags_say_what_is_wrong(flag, message):
    with pytest.raises(ValueError, match=message):
        parse_fault_flag(flag)


def test_bad_fault_env_is_rejected():
    with pytest.raises(ValueError, match="not JSON"):
        faults_from_env("[{")
    with pytest.raises(ValueError, match="lacks 'step'"):
        faults_from_env('[{"id": "f0", "kind": "kill", "rank": 0}]')


def test_a_step_delay_idles_every_step_before_its_faults(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(faults_mod.time, "sleep", lambda seconds: calls.append(("sleep", seconds)))
    monkeypatch.setattr(faults_mod.os, "kill", lambda pid, sig: calls.append(("kill", sig)))
    planned = [Fault(id="f0", kind="kill", step=2, rank=0)]
    injector = FaultInjector(planned, rank=0, fault_dir=str(tmp_path), events=EventLog(None), step_delay_s=0.05)
    for step in (1, 2, 3):
        injector.maybe_fire(step)
    assert calls == [("sleep", 0.05), ("sleep", 0.05), ("kill", signal.SIGKILL), ("sleep", 0.05)]
    FaultInjector([], rank=0, fault_dir=None, events=EventLog(None)).maybe_fire(1)  # no delay: no sleep
    assert len(calls) == 4


def test_fault_fires_once_on_its_rank_and_step(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(faults_mod.os, "kill", lambda pid, sig: sent.append(sig))
    events = EventLog(tmp_path / "events.jsonl")
    planned = [Fault(id="f0", kind="kill", step=3, rank=1), Fault(id="f1", kind="hang", step=4, rank=1),
               Fault(id="f2", kind="kill", step=3, rank=0), Fault(id="f3", kind="lose-worker", step=3, replica=1)]
    injector = FaultInjector(planned, rank=1, fault_dir=str(tmp_path / "faults"), events=events)
    for step in (1, 2, 3, 3, 4):  # step 3 replayed, as after a restart
        injector.maybe_fire(step)
    # The replay in a new process (same marker directory) does not fire either.
    FaultInjector(planned, rank=1, fault_dir=str(tmp_path / "faults"), events=events).maybe_fire(3)
    assert sent == [signal.SIGKILL, signal.SIGSTOP]
    assert sorted(p.name for p in (tmp_path / "faults").iterdir()) == ["f0.fired", "f1.fired"]
    fired = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["kind"], e["rank"], e["step"]) for e in fired] == [("fault", "kill", 1, 3),
                                                                              ("fault", "hang", 1, 4)]


def test_fault_kill_really_kills(tmp_path):
    code = textwrap.dedent(f"""
        from flywheel.eventlog.writer import EventLog
        from flywheel.contracts.faults import faults_from_env
        from flywheel.trainer.ft.fault_injector import FaultInjector
        faults = faults_from_env('[{{"id": "f0", "kind": "kill", "rank": 0, "step": 2}}]')
        injector = FaultInjector(faults, rank=0, fault_dir={str(tmp_path)!r}, events=EventLog(None))
        for step in (1, 2):
            injector.maybe_fire(step)
    """)
    assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0  # the marker exists: no second firing
