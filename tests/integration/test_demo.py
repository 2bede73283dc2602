"""`make demo` (the README's first command) trains the tiny example with one injected kill and ends with a summary
that shows the failure and the recovery."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_shows_the_failure_and_the_recovery():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(["make", "-s", "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "tiny: Succeeded" in out
    assert "failures and recoveries" in out and "injected at step 25" in out and "kill" in out
    summary = json.loads((REPO / "runs" / "tiny" / "summary.json").read_text())
    assert summary["steps_completed"] == 60 and summary["restarts"] >= 1
    assert [f["kind"] for f in summary["failures"]] == ["kill"]
    assert summary["failures"][0]["recovered_seconds"] > 0
    for artifact in ("loss.png", "timeline.png", "events.jsonl"):
        assert (REPO / "runs" / "tiny" / artifact).stat().st_size > 0
