"""A job resumed from a checkpoint at its last step says "already complete at step N (checkpoint PATH)"."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import PYTHON, REPO, child_env, write_job

JOB = """  replicas: {{min: 1, max: 1}}
  procsPerReplica: 1
  trainer:
    parallelism: {{fsdp: false}}
    training: {{steps: 6, globalBatch: 4, microBatch: 2, warmupSteps: 1}}
  checkpoint: {{dir: {ckpt}, everySteps: 3}}
"""


def _run(job, out) -> tuple[int, dict, str]:
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=150)
    return proc.returncode, json.loads((out / "summary.json").read_text()), proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_run_resumed_at_its_last_step_says_already_complete(tmp_path) -> None:
    job = write_job(tmp_path / "job.yaml", "again", JOB.format(ckpt=tmp_path / "ckpt"))
    rc, first, output = _run(job, tmp_path / "out1")
    assert rc == 0 and first["message"] == "training finished at step 6", output
    rc, again, output = _run(job, tmp_path / "out2")
    assert rc == 0, output
    assert again["message"].startswith("already complete at step 6 (checkpoint ") and str(tmp_path / "ckpt") in \
        again["message"], again["message"]
    assert "already complete at step 6" in output


@pytest.mark.slow
def test_a_run_resumed_past_its_last_step_writes_no_checkpoint_of_a_step_it_does_not_hold(tmp_path) -> None:
    """Trained to 6, then run again with steps: 4 on the same dir: the state is step 6's, so no step-4 folder
    (that would hold step 6's weights under step 4's name); it says already complete with the step-6 checkpoint."""
    ckpt = tmp_path / "ckpt"
    rc, _, output = _run(write_job(tmp_path / "job.yaml", "again", JOB.format(ckpt=ckpt)), tmp_path / "out1")
    assert rc == 0, output
    shorter = JOB.format(ckpt=ckpt).replace("steps: 6", "steps: 4")
    rc, again, output = _run(write_job(tmp_path / "job4.yaml", "again", shorter), tmp_path / "out2")
    assert rc == 0, output
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000003", "step-00000006"], output
    assert again["message"].startswith("already complete at step 4 (checkpoint ") and "step-00000006" in \
        again["message"], again["message"]
