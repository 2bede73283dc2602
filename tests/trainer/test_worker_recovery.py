"""Failures of two-rank runs: a killed rank resumes bitwise from the last checkpoint, SIGTERM takes an emergency
checkpoint on every rank and exits STOPPED, a stalled rank makes its peer's watchdog exit HANG."""

import signal
import time
from pathlib import Path

import pytest

from flywheel.contracts import exitcodes

from . import workers

STEPS = 30


def spec(**checkpoint: object) -> dict:
    doc = workers.job_spec(2, steps=STEPS, fsdp=True, lr=1e-2, progress_timeout=30)
    doc["checkpoint"].update(checkpoint)
    return doc


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, float], str]:
    """Losses and final params hash of an uninterrupted run (checkpoint settings do not change the math)."""
    workdir = tmp_path_factory.mktemp("reference")
    assert workers.run(2, spec(), workdir) == [0, 0], workers.logs(workdir)
    return workers.losses(workdir), done_digest(workdir)


def done_digest(workdir: Path) -> str:
    (done,) = [e for e in workers.events(workdir) if e["event"] == "done"]
    return done["params_sha256"]


def started(workdir: Path) -> list[dict]:
    return [e for e in workers.events(workdir) if e["event"] == "start"]


@pytest.mark.slow
def test_killed_rank_resumes_bitwise_and_the_fault_fires_once(tmp_path, reference):
    doc = spec(everySteps=4, **{"async": False})
    codes = workers.run(2, doc, tmp_path, faults=[{"id": "f0", "kind": "kill", "rank": 1, "step": 6}])
    assert codes[1] == -signal.SIGKILL
    assert codes[0] in (exitcodes.COLLECTIVE_TIMEOUT, exitcodes.CRASH), workers.logs(tmp_path)
    # The restart replays step 6 with the same fault list; the marker keeps it from firing again.
    assert workers.run(2, doc, tmp_path, restart_count=1,
                       faults=[{"id": "f0", "kind": "kill", "rank": 1, "step": 6}]) == [0, 0], workers.logs(tmp_path)
    faults = [e for e in workers.events(tmp_path) if e["event"] == "fault"]
    assert [(f["kind"], f["rank"], f["step"]) for f in faults] == [("kill", 1, 6)]
    assert [s["resumed_from"] for s in started(tmp_path)] == [None, 4]
    assert started(tmp_path)[1]["restart_count"] == 1
    losses, expected = workers.losses(tmp_path), reference[0]
    assert losses == expected  # steps 5.. replayed from the checkpoint match the uninterrupted run exactly
    assert done_digest(tmp_path) == reference[1]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_all_with_an_emergency_checkpoint(tmp_path, reference):
    doc = spec(everySteps=0)  # only the emergency checkpoint
    procs = workers.launch(2, doc, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not any(e["event"] == "step" and e["step"] >= 3 for e in workers.events(tmp_path)):
            assert time.monotonic() < deadline and procs[0].poll() is None, workers.logs(tmp_path)
            time.sleep(0.02)
        procs[1].send_signal(signal.SIGTERM)  # the agent signals every rank; one suffices: they agree each step
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [exitcodes.STOPPED] * 2, workers.logs(tmp_path)
    checkpoints = [e["step"] for e in workers.events(tmp_path) if e["event"] == "checkpoint"]
    stopped_at = max(workers.losses(tmp_path))
    assert checkpoints == [stopped_at] and 3 <= stopped_at < STEPS

    assert workers.run(2, doc, tmp_path, restart_count=1) == [0, 0], workers.logs(tmp_path)
    assert started(tmp_path)[1]["resumed_from"] == stopped_at
    assert workers.losses(tmp_path) == reference[0]
    assert done_digest(tmp_path) == reference[1]


@pytest.mark.slow
def test_stalled_peer_makes_the_watchdog_exit_hang(tmp_path):
    doc = workers.job_spec(2, steps=STEPS, lr=1e-2, progress_timeout=2)
    procs = workers.launch(2, doc, tmp_path, faults=[{"id": "h0", "kind": "hang", "rank": 1, "step": 3}])
    code, stopped = workers.wait_while_peer_stopped(procs, timeout=90)
    assert code == exitcodes.HANG, workers.logs(tmp_path)
    assert stopped
    events = workers.events(tmp_path)
    assert [(e["kind"], e["rank"], e["step"]) for e in events if e["event"] == "fault"] == [("hang", 1, 3)]
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert hang["rank"] == 0 and hang["seconds_since_step"] >= 2
    assert max(workers.losses(tmp_path)) == 2
    assert "most recent call first" in (tmp_path / "rank0.log").read_text()  # stacks were dumped


@pytest.mark.slow
def test_resume_at_another_world_size_continues_at_the_next_sample(tmp_path, reference):
    doc = spec(everySteps=4, **{"async": False})
    codes = workers.run(2, doc, tmp_path, faults=[{"id": "f0", "kind": "kill", "rank": 0, "step": 10}])
    assert codes[0] == -signal.SIGKILL, workers.logs(tmp_path)
    solo = workers.job_spec(1, steps=STEPS, fsdp=True, lr=1e-2, progress_timeout=30)
    solo["checkpoint"] = doc["checkpoint"]
    assert workers.run(1, solo, tmp_path, restart_count=1) == [0], workers.logs(tmp_path)
    (restore,) = [e for e in workers.events(tmp_path) if e["event"] == "restore"]
    assert (restore["step"], restore["from_world_size"], restore["world_size"]) == (8, 2, 1)
    assert started(tmp_path)[1]["dp"] == 1
    # Same samples in the same order, only the reduction order differs: equal up to float rounding.
    losses = workers.losses(tmp_path)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert [losses[s] for s in range(9, STEPS + 1)] == pytest.approx(
        [reference[0][s] for s in range(9, STEPS + 1)], rel=1e-4)
