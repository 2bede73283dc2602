"""A collective timeout through the real trainer: two gloo ranks, rank 1 SIGSTOPs itself mid-run (the hang fault),
and rank 0 -- waiting in the step's collective -- gives up when the short collective timeout (0.8 x
progressTimeoutSeconds, set after the first step) fires, before its progress watchdog would: it exits
COLLECTIVE_TIMEOUT (5), not HANG (4), and counts flywheel_collective_failures_total."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from flywheel.contracts import exitcodes
from flywheel.spec import parse_spec
from flywheel.spec.timeouts import collective_timeouts
from tests.warm_ranks import start_rank

from . import workers

PROGRESS_TIMEOUT = 15  # collective timeout 12 s after the first step; the watchdog would fire at 15 s


def launch(spec: dict, workdir: Path, faults: list[dict]) -> list[subprocess.Popen[bytes]]:
    """workers.launch's environment, with tests/trainer/exit_metrics_worker.py as the rank's program."""
    port, procs = workers.free_port(), []
    for rank in range(2):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(workers.REPO), RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0", FLYWHEEL_JOB="tests/tiny",
                   FLYWHEEL_REPLICA_INDEX="0", FLYWHEEL_SPEC=json.dumps(spec),
                   FLYWHEEL_CHECKPOINT_DIR=str(workdir / "ckpt"), FLYWHEEL_METRICS_PORT="0",
                   FLYWHEEL_EVENTS_FILE=str(workdir / "events.jsonl"), FLYWHEEL_FAULT_DIR=str(workdir / "faults"),
                   FLYWHEEL_FAULTS=json.dumps(faults), FLYWHEEL_TEST_METRICS_OUT=str(workdir / f"metrics{rank}.txt"))
        with open(workdir / f"rank{rank}.log", "ab") as log:
            procs.append(start_rank("tests.trainer.exit_metrics_worker", env, log))
    return procs


def sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
def test_collective_timeout_exits_5_and_is_counted(tmp_path: Path):
    spec = workers.job_spec(2, steps=400, progress_timeout=PROGRESS_TIMEOUT)
    steady = collective_timeouts(parse_spec(spec).fault_tolerance).steady.total_seconds()
    assert steady < PROGRESS_TIMEOUT  # the collective gives up first
    procs = launch(spec, tmp_path, [{"id": "h0", "kind": "hang", "rank": 1, "step": 3}])
    code, stopped = workers.wait_while_peer_stopped(procs, timeout=120)
    ended = time.time()
    assert code == exitcodes.COLLECTIVE_TIMEOUT, workers.logs(tmp_path)
    assert stopped
    events = workers.events(tmp_path)
    (fault,) = [e for e in events if e["event"] == "fault"]
    assert (fault["kind"], fault["rank"], fault["step"]) == ("hang", 1, 3)
    assert not [e for e in events if e["event"] == "hang"]  # the watchdog did not fire
    (timeout,) = [e for e in events if e["event"] == "collective_timeout"]
    assert timeout["rank"] == 0 and timeout["error"]
    assert steady - 1 <= ended - fault["time"] < PROGRESS_TIMEOUT + 5, ended - fault["time"]
    metrics = (tmp_path / "metrics0.txt").read_text()
    assert sample(metrics, "flywheel_collective_failures_total") == 1.0
    assert sample(metrics, "flywheel_watchdog_fired_total") == 0.0
    assert sample(metrics, "flywheel_train_steps_total") == 2.0  # steps 1 and 2; step 3 never finished
    log0 = (tmp_path / "rank0.log").read_text()
    assert "training failed" in log0 and "no progress" not in log0
