"""Read endpoints against the test cluster's real API server through the watch-backed cache: list (filters, pages),
detail, events, timeline, probes, metrics, not-found and bad input."""

from __future__ import annotations

from tests.api.conftest import ApiEnv, eventually

RESTART_MSG = "worker rd-worker-1 failed: Killed (exit code 137, reason ); restart 1 of 3 (restart_job)"


def test_probes_and_metrics_need_no_token(api_env: ApiEnv) -> None:
    assert api_env.http.get("/healthz").json() == {"status": "ok", "detail": ""}
    assert api_env.http.get("/readyz").status_code == 200
    api_env.get("/v1/jobs")
    text = api_env.http.get("/metrics").text
    assert 'flywheel_api_requests_total{code="200",method="GET",route="/v1/jobs"}' in text
    assert "flywheel_api_cache_jobs" in text


def test_list_filters_by_namespace_and_phase_and_pages(api_env: ApiEnv) -> None:
    for name, ns in (("ls-a", "default"), ("ls-b", "default"), ("ls-c", "team-b")):
        api_env.create_job(name, ns)
    api_env.set_status("ls-b", {"phase": "Running", "replicas": {"desired": 3, "current": 3, "ready": 2},
                                "step": 7, "restarts": 1})
    team_b = api_env.get("/v1/jobs", params={"namespace": "team-b"}).json()
    assert [(j["namespace"], j["name"]) for j in team_b["items"]] == [("team-b", "ls-c")]
    running = api_env.get("/v1/jobs", params={"phase": "Running"}).json()["items"]
    assert [j["name"] for j in running if j["name"].startswith("ls-")] == ["ls-b"]
    assert running[0]["replicas"] == {"desired": 3, "current": 3, "ready": 2} and running[0]["step"] == 7
    first = api_env.get("/v1/jobs", params={"limit": 1}).json()
    assert first["total"] >= 3 and len(first["items"]) == 1 and first["nextOffset"] == 1
    names, offset = [], 0
    while offset is not None:
        page = api_env.get("/v1/jobs", params={"limit": 2, "offset": offset}).json()
        names += [(j["namespace"], j["name"]) for j in page["items"]]
        offset = page["nextOffset"]
    assert names == sorted(names) and {("default", "ls-a"), ("team-b", "ls-c")} <= set(names)


def test_list_bad_input_is_422_naming_the_field(api_env: ApiEnv) -> None:
    for params, field in (({"phase": "Sleeping"}, "phase"), ({"limit": 0}, "limit"), ({"offset": -1}, "offset"),
                          ({"limit": "ten"}, "limit"), ({"namespace": "Bad_NS"}, "namespace")):
        resp = api_env.get("/v1/jobs", params=params)
        assert resp.status_code == 422, params
        assert resp.json()["detail"][0]["loc"] == ["query", field]


def test_job_detail_has_spec_workers_restarts_checkpoint_goodput(api_env: ApiEnv) -> None:
    api_env.create_job("rd", rmin=1, rmax=3, procs=2)
    api_env.add_pod("rd", 0, "Running", ready=True, generation=1)
    api_env.add_pod("rd", 1, "Failed", ready=False, generation=1,
                    terminated={"exitCode": 137, "reason": "Error", "startedAt": "2026-01-01T00:00:00Z",
                                "finishedAt": "2026-01-01T00:00:05Z"})
    api_env.set_status("rd", {
        "phase": "Restarting", "replicas": {"desired": 2, "current": 2, "ready": 1}, "worldSize": 4, "step": 20,
        "restarts": 1, "lastRestartReason": "Killed", "observedGeneration": 1,
        "conditions": [{"type": "Restarting", "status": "True", "reason": "Restarting", "message": RESTART_MSG,
                        "lastTransitionTime": "2026-01-01T00:00:06Z"}],
        "lastCheckpoint": {"step": 15, "time": "2026-01-01T00:00:04Z", "path": "/ckpt/rd/step-15"},
        "goodput": {"ratio": 0.8, "productiveSeconds": 40.0, "lostSteps": 5, "meanTimeToRecoverSeconds": 3.5}})
    api_env.add_event("rd", "Restarting", RESTART_MSG, event_type="Warning", ts="2026-01-01T00:00:06Z")
    api_env.add_event("rd", "Started", "container started", kind="Pod", obj_name="rd-worker-0")

    body = api_env.get("/v1/jobs/default/rd").json()
    assert body["phase"] == "Restarting" and body["worldSize"] == 4 and body["step"] == 20
    assert body["spec"] == {**body["spec"], "replicasMin": 1, "replicasMax": 3, "procsPerReplica": 2,
                            "workload": "trainer", "model": "gpt-tiny", "steps": 30, "checkpointDir": "/ckpt/rd"}
    workers = [(w["index"], w["pod"], w["firstRank"], w["lastRank"], w["phase"], w["ready"], w["exitCode"])
               for w in body["workers"]]
    assert workers == [(0, "rd-worker-0", 0, 1, "Running", True, None), (1, "rd-worker-1", 2, 3, "Failed", False, 137)]
    assert body["restarts"]["count"] == 1 and body["restarts"]["lastReason"] == "Killed"
    assert [(r["reason"], r["time"]) for r in body["restarts"]["history"]] == [("Killed", "2026-01-01T00:00:06Z")]
    assert body["lastCheckpoint"] == {"step": 15, "time": "2026-01-01T00:00:04Z", "path": "/ckpt/rd/step-15"}
    assert body["goodput"]["ratio"] == 0.8 and body["goodput"]["meanTimeToRecoverSeconds"] == 3.5
    assert body["conditions"][0]["type"] == "Restarting"

    events = api_env.get("/v1/jobs/default/rd/events").json()["items"]
    assert {(e["object"], e["reason"]) for e in events} >= {("TrainingJob/rd", "Restarting"),
                                                           ("Pod/rd-worker-0", "Started")}

    timeline = api_env.get("/v1/jobs/default/rd/timeline").json()["items"]
    kinds = [(t["kind"], t["time"]) for t in timeline]
    assert ("checkpoint", "2026-01-01T00:00:04Z") in kinds and ("restart", "2026-01-01T00:00:06Z") in kinds
    assert [t["time"] for t in timeline] == sorted(t["time"] for t in timeline)
    assert next(t for t in timeline if t["kind"] == "checkpoint")["step"] == 15


def test_unknown_job_is_404_and_bad_names_are_422(api_env: ApiEnv) -> None:
    for path in ("/v1/jobs/default/nope", "/v1/jobs/default/nope/events", "/v1/jobs/default/nope/timeline"):
        resp = api_env.get(path)
        assert resp.status_code == 404 and resp.json() == {"detail": "TrainingJob default/nope not found",
                                                           "reason": "NotFound"}
    resp = api_env.get("/v1/jobs/default/Not_A_Name")
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["path", "name"]


def test_cache_follows_deletes_and_survives_dropped_watches(api_env: ApiEnv) -> None:
    api_env.create_job("gone")
    api_env.cluster.api.drop_watches()  # the cache must re-watch (or relist) and keep following
    api_env.custom.delete_namespaced_custom_object("flywheel.dev", "v1alpha1", "default", "trainingjobs", "gone")
    eventually(lambda: api_env.get("/v1/jobs/default/gone").status_code == 404, what="delete seen through the API")
    api_env.create_job("back")
    assert api_env.get("/v1/jobs/default/back").status_code == 200


def test_a_restart_request_is_pending_until_the_operator_records_it() -> None:
    from flywheel.api.views import detail
    from flywheel.contracts.labels import RESTART_ANNOTATION

    at = "2026-11-22T09:00:00Z"
    job = {"metadata": {"name": "r", "namespace": "default", "annotations": {RESTART_ANNOTATION: at}},
           "spec": {"procsPerReplica": 1}, "status": {"phase": "Running"}}
    assert detail(job, [], []).restart_requested_at == at
    job["status"]["restartRequestHandled"] = at
    assert detail(job, [], []).restart_requested_at is None
