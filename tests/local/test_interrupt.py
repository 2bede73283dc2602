"""Ctrl-C on `flywheel run`: workers get SIGTERM, the run exits 130 with a report, and no process is left behind."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from conftest import PYTHON, REPO, alive, child_env, processes_with_env, write_job

from flywheel.local.procs import descendants

LONG_JOB = """  replicas: {{min: 2, max: 2}}
  procsPerReplica: 1
  trainer:
    parallelism: {{fsdp: false}}
    training: {{steps: 100000, globalBatch: 8, microBatch: 2}}
  checkpoint: {{dir: {ckpt}, everySteps: 1000}}
"""


def _wait_for_step(events, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if events.exists() and any(json.loads(line).get("event") == "step" and json.loads(line)["step"] >= step
                                   for line in events.read_text().splitlines() if line.endswith("}")):
            return
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_leaves_no_orphans(tmp_path, presses):
    job = write_job(tmp_path / "job.yaml", "interrupt", LONG_JOB.format(ckpt=tmp_path / "ckpt"))
    out = tmp_path / "out"
    run = subprocess.Popen([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                           cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        _wait_for_step(out / "events.jsonl", 3, timeout=90)
        tree = descendants(run.pid)
        assert len(tree) >= 4, tree  # 2 agents, 2 ranks (plus helpers)
        started = time.monotonic()
        for _ in range(presses):
            run.send_signal(signal.SIGINT)
            time.sleep(0.3)
        output, _ = run.communicate(timeout=60)
        assert run.returncode == 130, output
        if presses == 2:
            assert time.monotonic() - started < 10  # the second Ctrl-C kills at once
        assert [pid for pid in tree if alive(pid)] == []
        assert processes_with_env(f"FLYWHEEL_EVENTS_FILE={out / 'events.jsonl'}") == []
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "Interrupted" and summary["steps_completed"] >= 3
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
