"""The API with etcd endpoints reads the workers' progress records, the source the operator fills the status from:
step, loss, tokens/s, last checkpoint and goodput of a running job come from etcd; a finished job, or an API
without etcd, shows the TrainingJob status (api/progress.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flywheel.api.app import create_app
from flywheel.api.auth import TokenFileAuth
from flywheel.api.progress import ProgressFollower, run_id_of
from flywheel.etcd import keys
from flywheel.etcd.progress import CheckpointRecord, ProgressRecord, encode
from flywheel.etcd.session import EtcdSession
from tests.api.conftest import ApiEnv
from tests.rendezvous.etcd_server import EtcdServer, etcd_server  # noqa: F401 (the fixture)
from tests.waiting import eventually

RUNNING = {"phase": "Running", "step": 3, "lastCheckpoint": {"step": 0, "path": ""},
           "goodput": {"ratio": 0.0, "productiveSeconds": 0.0}}


@pytest.fixture
def followed(api_env: ApiEnv, etcd_server: EtcdServer) -> Iterator[tuple[TestClient, EtcdSession]]:  # noqa: F811
    follower = ProgressFollower(etcd_server.endpoint, api_env.cache.jobs, time.time).start()
    app = create_app(api_env.cache, TokenFileAuth.from_file(api_env.token_file), progress=follower)
    with TestClient(app) as http, EtcdSession(etcd_server.endpoint) as session:
        yield http, session
    follower.stop()


def _publish(session: EtcdSession, obj: dict[str, object], record: ProgressRecord) -> None:
    run_id = run_id_of(obj)
    assert run_id is not None
    session.call(lambda c: c.put(keys.progress_key(run_id, 0), encode(record)))


def test_a_running_job_shows_the_etcd_progress_then_its_final_status(
        api_env: ApiEnv, followed: tuple[TestClient, EtcdSession]) -> None:
    http, session = followed
    obj = api_env.create_job("etcd-live")
    api_env.set_status("etcd-live", RUNNING)
    start = time.time() - 20
    _publish(session, obj, ProgressRecord(time=start + 20, attempt=start, step=17, world_size=2, loss=2.5,
                                          tokens_per_second=1234.0, productive_seconds=10.0,
                                          checkpoint=CheckpointRecord(15, "/ckpt/etcd-live/step_15", start + 18)))
    auth = api_env.headers()

    def live() -> dict[str, object] | None:
        body = http.get("/v1/jobs/default/etcd-live", headers=auth).json()
        return body if body.get("progressSource") == "etcd" else None

    body = eventually(live, what="the etcd progress in the API")
    assert body["step"] == 17 and body["loss"] == 2.5 and body["tokensPerSecond"] == 1234.0
    assert body["worldSize"] == 2
    assert body["lastCheckpoint"]["step"] == 15 and body["lastCheckpoint"]["path"] == "/ckpt/etcd-live/step_15"
    assert body["goodput"]["ratio"] == pytest.approx(0.5, abs=0.01) and body["goodput"]["productiveSeconds"] == 10
    listed = http.get("/v1/jobs?namespace=default", headers=auth).json()["items"]
    assert next(s for s in listed if s["name"] == "etcd-live")["step"] == 17
    # The status stays the source for what etcd does not hold, and for a finished job.
    api_env.set_status("etcd-live", {"phase": "Succeeded", "step": 30, "lastCheckpoint": {"step": 30, "path": "/c"},
                                     "goodput": {"ratio": 0.9, "productiveSeconds": 27.0}})
    done = http.get("/v1/jobs/default/etcd-live", headers=auth).json()
    assert done["progressSource"] == "status" and done["step"] == 30 and done["loss"] is None
    assert done["lastCheckpoint"]["step"] == 30 and done["goodput"]["ratio"] == 0.9


def test_without_etcd_the_api_shows_the_status(api_env: ApiEnv) -> None:
    api_env.create_job("status-only")
    api_env.set_status("status-only", {**RUNNING, "lastCheckpoint": {"step": 2, "path": "/c2"}})
    body = api_env.get("/v1/jobs/default/status-only").json()
    assert body["progressSource"] == "status" and body["step"] == 3 and body["lastCheckpoint"]["step"] == 2
    assert body["loss"] is None and body["tokensPerSecond"] is None
