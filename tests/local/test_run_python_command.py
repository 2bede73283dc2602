"""`flywheel run` of `command: [python, x.py]` from a virtualenv that is not activated: `python` is the interpreter
`flywheel run` runs under, and a script that reports steps without a loss succeeds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, child_env, write_job

SCRIPT = """\
from flywheel import progress

for n in range(1, 4):
    progress.step(n)  # no loss, no tokens: the documented minimum
print("steps reported")
"""


@pytest.mark.slow
def test_python_command_without_an_activated_venv_succeeds(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text(SCRIPT)
    job = write_job(tmp_path / "job.yaml", "pycmd", "  replicas: {min: 1, max: 1}\n"
                    "  command: [python, x.py]\n"
                    f"  checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    venv_bin = str(Path(PYTHON).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != Path(venv_bin).resolve() and p != venv_bin)
    env = child_env(PATH=path)
    env.pop("VIRTUAL_ENV", None)
    out = tmp_path / "out"
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                          cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=150)
    log = (out / "logs" / "worker-0.log").read_text() if (out / "logs" / "worker-0.log").exists() else ""
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "Succeeded" and summary["steps_completed"] == 3
    assert summary["losses"] == [None, None, None] and summary["final_loss"] is None
    assert "steps reported" in log
