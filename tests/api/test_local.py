"""The local job (`flywheel run --api-port`): the event log folded into the cluster API's schema, and the real
`flywheel run` serving it on localhost while it trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from flywheel.api.app import create_app
from flywheel.api.auth import Principal, TokenFileAuth
from flywheel.api.localrun import EventLogSource
from flywheel.spec import parse_job
from tests.api.conftest import REPO, eventually
from tests.etcd_process import free_port

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
JOB = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "tiny"},
       "spec": {"replicas": {"min": 2, "max": 2}, "procsPerReplica": 2,
                "trainer": {"training": {"steps": 6, "globalBatch": 8, "microBatch": 2}}}}


def _log(path: Path, *events: dict[str, object]) -> None:
    with path.open("a") as f:
        for ev in events:
            f.write(json.dumps(ev) + "\n")


def test_event_log_becomes_status_workers_restarts_and_timeline(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    source = EventLogSource(parse_job(JOB), log)
    app = create_app(source, TokenFileAuth({"t": Principal("me")}))
    auth = {"Authorization": "Bearer t"}
    with TestClient(app) as http:
        assert http.get("/v1/jobs/local/tiny", headers=auth).json()["phase"] == "Pending"
        _log(log, {"event": "start", "time": T0, "rank": 0, "world_size": 4},
             *({"event": "step", "time": T0 + s, "step": s, "loss": 1.0, "step_seconds": 0.5, "world_size": 4}
               for s in (1, 2, 3)),
             {"event": "checkpoint", "time": T0 + 3.5, "step": 2, "path": "/ck/step-2"},
             {"event": "fault", "time": T0 + 4, "kind": "kill", "rank": 1, "step": 4})
        body = http.get("/v1/jobs/local/tiny", headers=auth).json()
        assert body["phase"] == "Restarting" and body["step"] == 3 and body["restarts"]["lastReason"] == "Killed"
        assert [(w["pod"], w["firstRank"], w["lastRank"]) for w in body["workers"]] == [
            ("tiny-worker-0", 0, 1), ("tiny-worker-1", 2, 3)]
        _log(log, {"event": "start", "time": T0 + 6, "rank": 0, "world_size": 4},
             {"event": "step", "time": T0 + 7, "step": 3, "loss": 1.0, "step_seconds": 0.5, "world_size": 4},
             {"event": "done", "time": T0 + 8, "step": 3})
        body = http.get("/v1/jobs/local/tiny", headers=auth).json()
        assert body["phase"] == "Succeeded" and body["restarts"]["count"] == 1
        assert body["goodput"]["lostSteps"] == 1 and body["lastCheckpoint"]["path"] == "/ck/step-2"
        assert [c["step"] for c in body["checkpoints"]] == [2]  # the history, not only the last one
        assert [r["reason"] for r in body["restarts"]["history"]] == ["Killed"]
        timeline = http.get("/v1/jobs/local/tiny/timeline", headers=auth).json()["items"]
        assert [(t["kind"], t["step"]) for t in timeline if t["kind"] in ("checkpoint", "restart")] == [
            ("checkpoint", 2), ("restart", None)]
        assert http.get("/v1/jobs", headers=auth).json()["items"][0]["name"] == "tiny"
        assert http.get("/v1/jobs/default/tiny", headers=auth).status_code == 404
        assert http.post("/v1/jobs/local/tiny/suspend", headers=auth).status_code == 501


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_flywheel_run_serves_its_job_while_training(tmp_path: Path) -> None:
    job = {**JOB, "spec": {**JOB["spec"], "replicas": {"min": 1, "max": 1}, "procsPerReplica": 1,
                           "trainer": {"model": {"preset": "gpt-tiny"}, "parallelism": {"fsdp": False},
                                       "training": {"steps": 4, "globalBatch": 2, "microBatch": 2}},
                           "checkpoint": {"dir": str(tmp_path / "ckpt"), "everySteps": 2}}}
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(json.dumps(job))
    port, out = free_port(), tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "run", str(spec_file), "--out", str(out),
                             "--no-progress", "--api-port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        token = eventually(lambda: (out / "api-token").exists() and (out / "api-token").read_text().strip(),
                           timeout=30, what="the run's API token")
        auth = {"Authorization": f"Bearer {token}"}
        seen: list[tuple[str, int]] = []

        def progressed() -> bool:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/v1/jobs/local/tiny", headers=auth, timeout=2).json()
            except httpx.HTTPError:
                return proc.poll() is not None
            seen.append((body["phase"], body["step"]))
            return body["step"] >= 1 or proc.poll() is not None

        eventually(progressed, timeout=90, what="a step served by the run's API")
        assert any(phase in ("Running", "Succeeded") and step >= 1 for phase, step in seen), seen
        assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs", timeout=2).status_code == 401
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.stdout.read() if proc.stdout else ""
    assert f"API: http://127.0.0.1:{port}/v1/jobs/local/tiny" in output
    assert oct((out / "api-token").stat().st_mode & 0o777) == "0o600"
    time.sleep(0)  # the server thread stopped with the run: nothing listens any more
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
