"""`flywheel run`'s start-up failure rule: a script that fails on an import (the same crash before the first step
twice) fails the run after 2 attempts (not maxRestarts), printing the reason; one that trains before it crashes
spends its restart budget."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, child_env, write_job


def _run_failing(job: Path, out: Path, timeout: int) -> tuple[str, dict[str, Any]]:
    """`flywheel run` of a job that must fail: its output and summary."""
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                          cwd=job.parent, env={**child_env(), "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=timeout)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    return text, json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_a_script_failing_on_an_import_stops_after_two_attempts(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("import flywheel_no_such_module  # noqa\n")
    job = write_job(tmp_path / "job.yaml", "badimport", "  replicas: {min: 1, max: 1}\n"
                    "  command: [python, x.py]\n"
                    "  faultTolerance: {maxRestarts: 10}\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    text, summary = _run_failing(job, tmp_path / "out", timeout=150)
    assert "StartupFailure" in text or "2 attempts in a row" in text, text
    assert "ModuleNotFoundError: No module named 'flywheel_no_such_module'" in text, text
    assert summary["status"] == "Failed" and len(summary["failures"]) == 2, summary


@pytest.mark.slow
def test_a_script_that_trains_then_crashes_the_same_way_each_time_spends_its_restarts(tmp_path: Path) -> None:
    """Each attempt trains (steps 1-3) and then crashes with the same error at the same step: not a start-up
    failure (that needs no step before the crash), so the run goes on to its restart budget."""
    (tmp_path / "x.py").write_text("from flywheel import progress\n"
                                   "for step in range(1, 4):\n"
                                   "    progress.step(step, loss=1.0)\n"
                                   "raise ValueError('bad batch at step 3')\n")
    job = write_job(tmp_path / "job.yaml", "crashlater", "  replicas: {min: 1, max: 1}\n"
                    "  command: [python, x.py]\n"
                    "  faultTolerance: {maxRestarts: 3}\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    text, summary = _run_failing(job, tmp_path / "out", timeout=240)
    assert "StartupFailure" not in text and "2 attempts in a row" not in text, text
    assert "after 3 restarts (maxRestarts=3)" in text, text
    assert summary["status"] == "Failed", summary
    # 4 worker attempts (the first and 3 restarts), each of whose agent restarted the crashed rank in place 3 times
    # (its PET_MAX_RESTARTS) before the worker failed: every crash is counted, the agent's as well.
    workers = [f for f in summary["failures"] if f["replica"] is not None]
    ranks = [f for f in summary["failures"] if f["rank"] is not None]
    assert len(workers) == 4 and len(ranks) == 4 * 3 and len(summary["failures"]) == 16, summary["failures"]
    assert all("ValueError: bad batch at step 3" in f["detail"] for f in summary["failures"]), summary["failures"]
