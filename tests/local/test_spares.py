"""`flywheel run --spares N` end to end: a worker lost whole is replaced by a warm spare (issue 21), the run
equals the fault-free one bit for bit, and no spare outlives the run."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import PYTHON, REPO, child_env, processes_with_env, write_job

JOB = """  replicas: {{min: 2, max: 2}}
  procsPerReplica: 1
  trainer:
    parallelism: {{fsdp: false}}
    training: {{steps: 30, globalBatch: 8, microBatch: 2, warmupSteps: 2}}
  checkpoint: {{dir: {ckpt}, everySteps: 5}}
  faultTolerance: {{maxRestarts: 3, restartScope: worker, progressTimeoutSeconds: 30}}
"""


def _run(tmp_path, name: str, *args: str, timeout: float = 240) -> tuple[dict, str]:
    job = write_job(tmp_path / f"{name}.yaml", name, JOB.format(ckpt=tmp_path / f"ckpt-{name}"))
    out = tmp_path / name
    proc = subprocess.run([PYTHON, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress", *args],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert processes_with_env(f"FLYWHEEL_EVENTS_FILE={out / 'events.jsonl'}") == []  # spares stopped with the job
    return json.loads((out / "summary.json").read_text()), output


@pytest.mark.slow
def test_a_lost_worker_is_replaced_by_a_warm_spare_and_the_run_is_bitwise_the_fault_free_one(tmp_path):
    reference, _ = _run(tmp_path, "ref")
    began = time.monotonic()
    summary, output = _run(tmp_path, "spare", "--spares", "1", "--fault", "lose-worker:replica=1:step=12")
    logs = tmp_path / "spare" / "logs"
    spare_log = (logs / "spare-0.log").read_text()
    assert "spare spare-0 promoted to replica 1 after" in spare_log, spare_log[-3000:]
    assert "spare-0 promoted to worker 1" in output
    assert "continues as spare-0" in (logs / "worker-1.log").read_text()
    assert (logs / "spare-1.log").exists()  # a new spare was started behind the promoted one
    recreated = summary["worker_recreations"]
    assert [(r["replicas"], r["spare"]) for r in recreated] == [([1], "spare-0")]
    assert [(f["kind"], f["replica"]) for f in summary["failures"]] == [("Killed", 1)]
    assert summary["steps_completed"] == 30
    assert summary["final_params_sha256"] == reference["final_params_sha256"] is not None
    assert summary["losses"] == reference["losses"]
    print(f"spare run: fault -> recovered {summary['failures'][0]['recovered_seconds']} s, "
          f"wall {time.monotonic() - began:.1f} s")
