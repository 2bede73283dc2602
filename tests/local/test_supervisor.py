"""`flywheel run` end to end: user scripts, a permanent error, and a worker lost whole (with the real trainer)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import PYTHON, REPO, SCRIPTS, child_env, processes_with_env, write_job


def _run(job, out, *args: str, timeout: float = 150, **env: str) -> tuple[int, dict, str]:
    start = time.monotonic()
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress", *args],
                          cwd=REPO, env=child_env(**env), capture_output=True, text=True, timeout=timeout)
    assert time.monotonic() - start < timeout
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return proc.returncode, summary, proc.stdout + proc.stderr


def _no_leftovers(out) -> None:
    """No agent or rank of this run may outlive `flywheel run` (they all carry its events file in their env)."""
    assert processes_with_env(f"FLYWHEEL_EVENTS_FILE={out / 'events.jsonl'}") == []


@pytest.mark.slow
def test_user_script_job_succeeds(tmp_path):
    job = write_job(tmp_path / "job.yaml", "user", "  replicas: {min: 2, max: 2}\n"
                    "  command: [examples/scripts/train_user.py]\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    rc, summary, output = _run(job, tmp_path / "out")
    assert rc == 0, output
    assert summary["status"] == "Succeeded" and summary["world_size"] == 2 and summary["failures"] == []
    _no_leftovers(tmp_path / "out")
    assert "train_user: world=2" in (tmp_path / "out" / "logs" / "worker-0.log").read_text()
    assert (tmp_path / "out" / "loss.png").stat().st_size > 0 and (tmp_path / "out" / "timeline.png").exists()


@pytest.mark.slow
def test_user_error_fails_the_job_without_restarts(tmp_path):
    job = write_job(tmp_path / "job.yaml", "usererror", "  replicas: {min: 2, max: 2}\n"
                    f"  command: [{SCRIPTS / 'exit_rank.py'}]\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n"
                    "  faultTolerance: {maxRestarts: 5, restartScope: worker}\n")
    attempts = tmp_path / "attempts.log"
    rc, summary, output = _run(job, tmp_path / "out", EXIT_RANK_LOG=str(attempts), EXIT_RANK_WHICH="1",
                               EXIT_RANK_CODE="3")
    assert rc == 1, output
    assert summary["status"] == "Failed" and summary["worker_recreations"] == []
    assert [(f["kind"], f["replica"], f["exit_code"]) for f in summary["failures"]] == [("UserError", 1, 3)]
    assert sorted(attempts.read_text().split("\n")[:-1]) == ["0 0", "1 0"]


# Disk saves written in the step (async: false): an async save still being written when the worker is lost at step 12
# (the next one skipped meanwhile, as under a loaded host) would leave nothing on disk to resume from.
TINY = """  replicas: {{min: 2, max: 2}}
  procsPerReplica: 1
  trainer:
    parallelism: {{fsdp: false}}
    training: {{steps: 30, globalBatch: 8, microBatch: 2, warmupSteps: 2}}
  checkpoint: {{dir: {ckpt}, everySteps: 5, async: false}}
  faultTolerance: {{maxRestarts: 3, restartScope: {scope}, progressTimeoutSeconds: 30}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("scope, action", [("worker", "RestartWorker"), ("job", "RestartJob")])
def test_a_worker_lost_whole_is_recreated(tmp_path, scope, action):
    job = write_job(tmp_path / "job.yaml", f"lose-{scope}", TINY.format(ckpt=tmp_path / "ckpt", scope=scope))
    out = tmp_path / "out"
    rc, summary, output = _run(job, out, "--fault", "lose-worker:replica=1:step=12")
    assert rc == 0, output
    assert summary["steps_completed"] == 30 and None not in summary["losses"] and len(summary["losses"]) == 30
    assert summary["final_params_sha256"]
    assert [(f["kind"], f["replica"], f["detail"]) for f in summary["failures"]] == \
        [("Killed", 1, "injected lose-worker")]
    assert summary["failures"][0]["recovered_seconds"] is not None
    recreated = summary["worker_recreations"]
    assert [r["action"] for r in recreated] == [action]
    assert recreated[0]["replicas"] == ([1] if scope == "worker" else [0, 1])
    assert summary["restarts"] >= 1
    assert max(s for s in summary["resumed_from"] if s is not None) >= 5  # resumed from a checkpoint, not step 0
    _no_leftovers(out)


@pytest.mark.slow
def test_workers_lingering_after_done_are_stopped_after_the_finish_grace(tmp_path):
    """A worker still running finishGraceSeconds after the trainer's done report (a rank stuck or restarted in
    its teardown) is stopped and the job Succeeds; without it `flywheel run` waited for the stuck worker."""
    job = write_job(tmp_path / "job.yaml", "linger", "  replicas: {min: 2, max: 2}\n"
                    f"  command: [{SCRIPTS / 'linger_after_done.py'}]\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n"
                    "  faultTolerance: {finishGraceSeconds: 2}\n")
    start = time.monotonic()
    rc, summary, output = _run(job, tmp_path / "out", timeout=90)
    assert rc == 0, output
    assert time.monotonic() - start < 60, "the lingering worker was waited for"
    assert summary["status"] == "Succeeded" and summary["failures"] == []
    # worker 0 waits in the exit barrier for worker 1: still running too
    assert "worker(s) 0, 1 still running 2 s after training finished were stopped" in output
    _no_leftovers(tmp_path / "out")
