"""Users' own training scripts under `flywheel run` on 2 workers, with the real libraries: the Hugging Face Trainer
and Lightning examples (each with its FlywheelCallback) through a rank SIGKILLed after the first checkpoint and a
worker lost later, and a plain torchrun script without any Flywheel import through a rank killed from outside."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from conftest import PYTHON, REPO, child_env, processes_with_env, write_job

from flywheel.eventlog import fold, read_records
from flywheel.local import procs

pytestmark = pytest.mark.slow

# Enough steps after the lost worker that it is lost while the group trains (a warm restart resumes in ~1 s).
STEPS, SAVE_STEPS = 80, 10
KILL_AT, LOSE_AT = 13, 24  # after the first checkpoint (10); after the second (20)


def _run(job, out, *args: str, timeout: float = 420, **env: str) -> tuple[int, dict, str]:
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress", *args],
                          cwd=REPO, env=child_env(**env), capture_output=True, text=True, timeout=timeout)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return proc.returncode, summary, proc.stdout + proc.stderr


# Lightning's run takes the HF one's paths (the callback's steps and saves, the agent's records): `make test-heavy`.
@pytest.mark.parametrize(("script", "steps_env"), [
    ("hf_trainer.py", "HF"), pytest.param("lightning_train.py", "LIGHTNING", marks=pytest.mark.heavy)])
def test_a_framework_script_survives_a_rank_kill_and_a_lost_worker(tmp_path, script, steps_env):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", "framework", "  replicas: {min: 2, max: 2}\n"
                    f"  command: [{REPO / 'examples' / 'scripts' / script}]\n"
                    f"  checkpoint: {{dir: {ckpt}}}\n"
                    "  faultTolerance: {maxRestarts: 5, restartScope: worker}\n")
    rc, summary, output = _run(job, out, "--fault", f"kill:rank=1:step={KILL_AT}",
                               "--fault", f"lose-worker:replica=1:step={LOSE_AT}",
                               **{f"{steps_env}_STEPS": str(STEPS), f"{steps_env}_SAVE_STEPS": str(SAVE_STEPS)})
    assert rc == 0 and summary["status"] == "Succeeded", output
    # Both failures, each with its cause; the restarts they made.
    kinds = [(f["kind"], f["rank"], f["replica"], f["detail"]) for f in summary["failures"]]
    assert kinds[0] == ("signal-SIGKILL", 1, None, "rank 1: killed by SIGKILL"), kinds
    assert len(kinds) == 2 and kinds[1][2] == 1 and "lose-worker" in kinds[1][3], kinds
    assert summary["restarts"] >= 2 and len(summary["worker_recreations"]) == 1, summary
    # Steps and loss came through the callback; each checkpoint the framework saved was reported.
    assert summary["steps_reported"] and summary["steps_completed"] == STEPS and summary["final_loss"] is not None
    assert {c["step"] for c in summary["checkpoints"]} >= {10, 20, 30}
    # Each recovery resumed from the framework's newest checkpoint before its failure: the lost steps are the steps
    # trained since that checkpoint.
    log = fold(read_records(out / "events.jsonl"))
    assert len(log.incidents) == 2
    for incident in log.incidents:
        newest = max(c.step for c in log.checkpoints if c.time < incident.began)
        assert incident.resumed_from == newest and incident.restore is not None and incident.restore.step == newest
        assert incident.lost_steps == incident.step_at_failure - newest
    assert summary["lost_steps"] == sum(i.lost_steps for i in log.incidents) > 0
    assert 0 < summary["goodput"] < 1
    assert processes_with_env(f"FLYWHEEL_EVENTS_FILE={out / 'events.jsonl'}") == []


def test_a_plain_torchrun_script_gets_its_failures_and_restarts_counted(tmp_path):
    """No Flywheel import, no steps reported: the agent's records still count the kill and the restart, and the
    summary says the steps are not reported instead of a goodput of 0."""
    out = tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", "plain", "  replicas: {min: 2, max: 2}\n"
                    "  command: [examples/scripts/train_user.py]\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n"
                    "  faultTolerance: {maxRestarts: 3, restartScope: worker}\n")
    proc = subprocess.Popen([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                            cwd=REPO, env=child_env(TRAIN_USER_STEPS="400", TRAIN_USER_STEP_SECONDS="0.05"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (ranks := procs.with_env(processes_with_env("TRAIN_USER_STEP_SECONDS=0.05"), "RANK", "1")):
            assert time.monotonic() < deadline and proc.poll() is None, "rank 1 never started"
            time.sleep(0.2)
        time.sleep(2)  # in its loop of collectives
        for pid in ranks:
            procs.signal_quietly(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    summary = json.loads((out / "summary.json").read_text())
    assert proc.returncode == 0 and summary["status"] == "Succeeded", output
    assert [(f["kind"], f["rank"]) for f in summary["failures"]] == [("signal-SIGKILL", 1)], summary["failures"]
    assert summary["restarts"] == 1 and not summary["steps_reported"] and summary["goodput"] is None
    assert "steps not reported" in output and "flywheel.progress.step" in output
