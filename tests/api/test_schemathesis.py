"""Property-based conformance of the served OpenAPI document (schemathesis): every operation of the real app,
generated valid and invalid inputs, against a populated in-memory cache with a token file and fake actions.

Checks on every response: no 5xx, the status code is documented, the content type and the body match the schema
(and schemathesis' default checks: invalid input is rejected, valid input accepted, missing auth gives 401).
Deterministic (derandomized, no example database) and bounded (the coverage phase plus at most 100 generated
cases per operation, ~12 s), in process over ASGI: no network.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.core import NOT_SET

from bench.api_jobs import populate
from flywheel.api.app import create_app
from flywheel.api.auth import Principal, TokenFileAuth
from flywheel.api.deps import DNS
from flywheel.api.job_actions import ActionError
from flywheel.contracts.labels import RESTART_ANNOTATION
from tests.api.memory_source import MemorySource

ADMIN = "schemathesis-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
MAX_EXAMPLES = 100
_DNS = re.compile(DNS)


class MemoryActions:
    """Actions applied to the MemorySource, as the API server would apply the patches (no cluster here).
    Names starting with "conflict" answer 409, as a racing update would."""

    def __init__(self, source: MemorySource) -> None:
        self.source = source

    def _change(self, namespace: str, name: str, edit: Any) -> dict[str, Any]:
        if name.startswith("conflict"):
            raise ActionError(409, "Conflict", "Kubernetes API: the object has been modified; retry")
        obj = copy.deepcopy(self.source.job(namespace, name))
        if obj is None:
            raise ActionError(404, "NotFound", f"Kubernetes API: trainingjobs {name!r} not found")
        edit(obj)
        self.source.put("job", obj)
        return obj

    async def suspend(self, namespace: str, name: str, value: bool) -> dict[str, Any]:
        return self._change(namespace, name, lambda o: o["spec"].__setitem__("suspend", value))

    async def restart(self, namespace: str, name: str) -> dict[str, Any]:
        return self._change(namespace, name, lambda o: o["metadata"].setdefault("annotations", {}).__setitem__(
            RESTART_ANNOTATION, "2026-01-01T12:00:00Z"))

    async def scale(self, namespace: str, name: str, replicas: int) -> dict[str, Any]:
        return self._change(namespace, name, lambda o: o["spec"]["replicas"].__setitem__("target", replicas))


def _source() -> tuple[MemorySource, list[dict[str, str]]]:
    source = MemorySource()
    populate(source, 12)  # two jobs of each phase in several namespaces, with pods, events and restarts
    conflict = copy.deepcopy(source.jobs()[0])
    conflict["metadata"]["name"] = "conflict-job"
    source.put("job", conflict)
    known = sorted(({"namespace": o["metadata"]["namespace"], "name": o["metadata"]["name"]} for o in source.jobs()
                    if o is not conflict), key=lambda k: (k["namespace"], k["name"]))
    return source, known + [{"namespace": "default", "name": "conflict-job"}]  # last: Hypothesis favours the first


SOURCE, KNOWN = _source()
APP = create_app(SOURCE, TokenFileAuth({ADMIN: Principal("alice", "u1")}), MemoryActions(SOURCE))
CONFIG = schemathesis.Config.from_dict({
    "headers": AUTH,
    "cache": {"enabled": False},  # no schemathesis cache files (Hypothesis keeps its git-ignored .hypothesis/)
    "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True},
    # A schema-valid replicas count outside the job's own [min, max] is refused with a documented 422: the range
    # is per job, so the schema cannot state it (test_actions_auth checks the message).
    "operations": [{"include-path": "/v1/jobs/{namespace}/{name}/scale", "checks": {
        "positive_data_acceptance": {"expected-statuses": ["2xx", 401, 403, 404, 409, 422]}}}],
})
schema = schemathesis.openapi.from_asgi("/openapi.json", APP, config=CONFIG)


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any]) -> Any:
    """Random valid names almost never exist (404 only): send most valid ones to the cached jobs, so
    the 200 bodies are checked too. Invalid names (negative cases) pass through untouched."""
    if set(path_parameters or ()) != {"namespace", "name"} or not all(
            isinstance(v, str) and _DNS.match(v) and len(v) <= 63 for v in path_parameters.values()):
        return st.just(path_parameters)
    return st.one_of(st.sampled_from(KNOWN), st.just(path_parameters))


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Likewise a valid scale body: mostly a count near the cached jobs' [min, max], so some scales succeed."""
    replicas = body.get("replicas") if isinstance(body, dict) and set(body) == {"replicas"} else None
    if type(replicas) is not int or replicas < 1:
        return st.just(body)
    return st.one_of(st.integers(1, 5).map(lambda n: {"replicas": n}), st.just(body))


@schema.parametrize()
# Derandomized and no example database: the same cases every run, nothing written. No deadline or health checks:
# a shared 2-core machine must not turn a slow draw into a failure; the checks below are the test.
@hypothesis.settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
def test_api_conforms_to_its_openapi(case: schemathesis.Case) -> None:
    case.call_and_validate()


@pytest.mark.parametrize("job", KNOWN, ids=lambda k: f"{k['namespace']}/{k['name']}")
def test_every_cached_job_conforms_on_every_operation(job: dict[str, str]) -> None:
    """Each cached job through every operation with a job path, valid input: the bodies of real jobs (all phases,
    restarts, checkpoints, pending restart requests, 409 from the API server) validate against the schema."""
    for path in schema:
        for method, operation in schema[path].items():
            if "{name}" not in path:
                continue
            scale = path.endswith("/scale")  # 2 lies within every cached job's [min, max]
            case = operation.Case(path_parameters=job, body={"replicas": 2} if scale else NOT_SET,
                                  media_type="application/json" if scale else None)
            response = case.call_and_validate(headers=AUTH)
            expected = 409 if method != "get" and job["name"].startswith("conflict") else 200
            assert response.status_code == expected, (method, path, response.text)
