"""Actions change the TrainingJob through the Kubernetes API (seen on the object itself), and auth failures
answer 401/403 with a clear body."""

from __future__ import annotations

import pytest

from flywheel.contracts.labels import RESTART_ANNOTATION
from tests.api.conftest import ADMIN, VIEWER, ApiEnv, eventually


def test_missing_or_bad_token_is_401_with_a_clear_body(api_env: ApiEnv) -> None:
    api_env.create_job("au")
    for headers in ({}, {"Authorization": "Basic YWxpY2U6eA=="}, {"Authorization": "Bearer "},
                    {"Authorization": "Bearer not-a-known-token"}):
        for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/jobs/default/au"),
                             ("POST", "/v1/jobs/default/au/suspend")):
            resp = api_env.http.request(method, path, headers=headers)
            assert resp.status_code == 401, (headers, path)
            assert resp.headers["www-authenticate"] == "Bearer"
            body = resp.json()
            assert body["reason"] == "Unauthorized" and "token" in body["detail"]
    assert api_env.job("au")["spec"].get("suspend") is False  # nothing changed


def test_viewer_reads_but_may_not_act(api_env: ApiEnv) -> None:
    api_env.create_job("ro")
    assert api_env.get("/v1/jobs/default/ro", token=VIEWER).status_code == 200
    for method, path, body in (("POST", "suspend", None), ("POST", "resume", None), ("POST", "restart", None),
                               ("PATCH", "scale", {"replicas": 2})):
        resp = api_env.http.request(method, f"/v1/jobs/default/ro/{path}", json=body, headers=api_env.headers(VIEWER))
        assert resp.status_code == 403, path
        assert resp.json() == {"reason": "Forbidden", "detail": "user 'bob' is in flywheel:viewers and may only read"}
    obj = api_env.job("ro")
    assert obj["spec"]["suspend"] is False and "target" not in obj["spec"]["replicas"]
    assert RESTART_ANNOTATION not in (obj["metadata"].get("annotations") or {})


def test_suspend_resume_restart_and_scale_change_the_trainingjob(api_env: ApiEnv, caplog) -> None:
    caplog.set_level("INFO", logger="flywheel.api.routes_actions")
    api_env.create_job("act", rmin=1, rmax=3)
    resp = api_env.http.post("/v1/jobs/default/act/suspend", headers=api_env.headers(ADMIN))
    assert resp.status_code == 200 and resp.json()["action"] == "suspend"
    assert resp.json()["job"]["spec"]["suspend"] is True
    assert api_env.job("act")["spec"]["suspend"] is True
    eventually(lambda: api_env.get("/v1/jobs/default/act").json()["spec"]["suspend"], what="suspend in the cache")

    assert api_env.http.post("/v1/jobs/default/act/resume", headers=api_env.headers()).status_code == 200
    assert api_env.job("act")["spec"]["suspend"] is False

    resp = api_env.http.post("/v1/jobs/default/act/restart", headers=api_env.headers())
    stamp = api_env.job("act")["metadata"]["annotations"][RESTART_ANNOTATION]
    assert resp.status_code == 200 and stamp.endswith("Z") and resp.json()["job"]["restartRequestedAt"] == stamp

    resp = api_env.http.patch("/v1/jobs/default/act/scale", json={"replicas": 2}, headers=api_env.headers())
    assert resp.status_code == 200 and resp.json()["job"]["spec"]["replicasTarget"] == 2
    assert api_env.job("act")["spec"]["replicas"] == {"min": 1, "max": 3, "target": 2, "spares": 0}  # CRD default
    # The audit log names the server's account: the server's own log names the caller of each action.
    actions = [r.getMessage() for r in caplog.records if r.name == "flywheel.api.routes_actions"]
    assert [a.split()[0] for a in actions] == ["suspend", "resume", "restart", "scale"]
    assert all("default/act by 'alice'" in a for a in actions), actions


@pytest.mark.parametrize("body, message", [
    ({"replicas": -1}, "greater than or equal to 1"),
    ({"replicas": "two"}, "valid integer"),
    ({"replicas": 9}, "within [min, max] = [1, 3]"),
    ({}, "Field required"),
])
def test_bad_scale_is_422_naming_the_field(api_env: ApiEnv, body: dict[str, object], message: str) -> None:
    if api_env.cache.job("default", "sc") is None:
        api_env.create_job("sc", rmin=1, rmax=3)
    resp = api_env.http.patch("/v1/jobs/default/sc/scale", json=body, headers=api_env.headers())
    assert resp.status_code == 422
    error = resp.json()["detail"][0]
    assert error["loc"] == ["body", "replicas"] and message in error["msg"]
    assert "target" not in api_env.job("sc")["spec"]["replicas"]


def test_actions_on_unknown_jobs_are_404(api_env: ApiEnv) -> None:
    for method, path, body in (("POST", "suspend", None), ("POST", "restart", None),
                               ("PATCH", "scale", {"replicas": 1})):
        resp = api_env.http.request(method, f"/v1/jobs/default/ghost/{path}", json=body, headers=api_env.headers())
        assert resp.status_code == 404 and resp.json()["reason"] == "NotFound"
