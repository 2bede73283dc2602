"""The committed OpenAPI document of the REST API matches the app (like the CRD drift test)."""

import json
from pathlib import Path

from flywheel.api.openapi import DEFAULT_PATH, render_openapi

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_matches_the_app():
    committed = (ROOT / DEFAULT_PATH).read_text()
    assert committed == render_openapi(), ("docs/api/openapi.json drifted from flywheel/api: run "
                                           "`python -m flywheel.api.openapi` and commit the result")


def test_openapi_names_every_endpoint_and_bearer_auth():
    doc = json.loads(render_openapi())
    assert set(doc["paths"]) == {
        "/healthz", "/readyz", "/metrics", "/v1/jobs", "/v1/jobs/{namespace}/{name}",
        "/v1/jobs/{namespace}/{name}/events", "/v1/jobs/{namespace}/{name}/timeline",
        "/v1/jobs/{namespace}/{name}/suspend", "/v1/jobs/{namespace}/{name}/resume",
        "/v1/jobs/{namespace}/{name}/restart", "/v1/jobs/{namespace}/{name}/scale"}
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert doc["paths"]["/v1/jobs/{namespace}/{name}/scale"]["patch"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]
