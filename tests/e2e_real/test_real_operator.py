"""The tests/operator scenarios on a real cluster (see conftest.py for the settings); skipped without KUBECONFIG."""

from __future__ import annotations

import random
import time
from pathlib import Path

from tests.e2e_real.conftest import RealCluster, eventually

LONG = {"trainer.training.steps": 400, "checkpoint.everySteps": 20}


def test_tiny_job_succeeds_with_columns(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-tiny", tmp_path)
    status = real.wait_phase("e2e-tiny", "Succeeded", 900)
    assert status["restarts"] == 0 and status["replicas"]["desired"] == 2
    header = real.kubectl("get", "tj", "e2e-tiny").stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "READY", "DESIRED", "STEP", "RESTARTS", "AGE"]
    assert "TrainingSucceeded" in real.kubectl("describe", "tj", "e2e-tiny").stdout


def test_force_deleted_worker_pod_is_replaced(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-kill", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-kill").get("step", 0) >= 40, 900, "step 40")
    old = next(p["metadata"]["uid"] for p in real.pods("e2e-kill") if p["metadata"]["name"].endswith("-1"))
    real.kubectl("delete", "pod", "e2e-kill-worker-1", "--grace-period=0", "--force")
    eventually(lambda: any(p["metadata"]["name"].endswith("-1") and p["metadata"]["uid"] != old
                           for p in real.pods("e2e-kill")), 300, "a replacement pod")
    status = real.wait_phase("e2e-kill", "Succeeded", 900)
    assert status["step"] == 400


def test_operator_restarts_do_not_duplicate_pods(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-chaos", tmp_path, **{**LONG, "trainer.training.steps": 2000})
    eventually(lambda: len(real.pods("e2e-chaos")) == 2, 600, "the pods")
    uids = {p["metadata"]["uid"] for p in real.pods("e2e-chaos")}
    rng = random.Random(3)
    for _ in range(10):
        real.kubectl("delete", "pod", "-l", real.operator_selector, "--wait=false", namespace=real.operator_ns)
        time.sleep(rng.uniform(2, 8))
        assert {p["metadata"]["uid"] for p in real.pods("e2e-chaos")} == uids
    status = real.wait_phase("e2e-chaos", "Succeeded", 1800)
    assert status["restarts"] == 0


def test_invalid_job_rejected_or_marked(real: RealCluster, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"apiVersion: flywheel.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: e2e-bad, namespace: "
                    f"{real.namespace}}}\nspec: {{replicas: {{min: 3, max: 2}}}}\n")
    assert real.kubectl("apply", "-f", str(path), check=False).returncode != 0
    real.apply_job("e2e-preset", tmp_path, **{"trainer.model.preset": "gpt-huge"})
    status = real.wait_phase("e2e-preset", "Failed", 120)
    assert any(c["type"] == "Invalid" and c["status"] == "True" for c in status["conditions"])


def test_scale_and_suspend(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-elastic", tmp_path,
                   **{**LONG, "trainer.training.steps": 1000, "replicas": {"min": 1, "max": 2}})
    eventually(lambda: real.status("e2e-elastic").get("step", 0) >= 40, 900, "step 40")
    real.kubectl("scale", "tj", "e2e-elastic", "--replicas", "1")
    eventually(lambda: len(real.pods("e2e-elastic")) == 1, 300, "one worker")
    real.kubectl("patch", "tj", "e2e-elastic", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    real.wait_phase("e2e-elastic", "Suspended", 300)
    real.kubectl("patch", "tj", "e2e-elastic", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    real.kubectl("scale", "tj", "e2e-elastic", "--replicas", "2")
    real.wait_phase("e2e-elastic", "Succeeded", 1800)
