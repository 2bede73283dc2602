"""`flywheel api` as a real server process (uvicorn, kubeconfig, its own watch cache) and `flywheel status` against
it: table and JSON, one job and the list, and refusals. The server has no token file: each caller's token is checked
by the cluster's API server (TokenReview) and each request by its RBAC (SubjectAccessReview). The callers are
ServiceAccounts with tokens from the TokenRequest API: one allowed to read TrainingJobs in `default` by a Role, one
with no rights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yaml

from flywheel.cli import main
from flywheel.spec.crd.generate import GROUP, PLURAL
from tests.api.conftest import ADMIN, REPO, ApiEnv, eventually, kubectl, service_account_token
from tests.etcd_process import free_port

READER, STRANGER = "job-reader", "stranger"
RBAC = [
    *({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}} for name in (READER, STRANGER)),
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": READER},
     "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": READER},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": READER},
     "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": "default"}]}]


@dataclass
class Callers:
    reader: str  # may get and list TrainingJobs in `default` (a Role), nothing across namespaces
    stranger: str  # authenticated, with no rights


@pytest.fixture(scope="module")
def callers(api_env: ApiEnv, tmp_path_factory: pytest.TempPathFactory) -> Callers:
    rbac = tmp_path_factory.mktemp("rbac") / "callers.yaml"
    rbac.write_text(yaml.safe_dump_all(RBAC))
    kubectl(api_env.cluster, "apply", "-f", str(rbac))
    return Callers(service_account_token(api_env.cluster, READER), service_account_token(api_env.cluster, STRANGER))


@pytest.fixture(scope="module")
def server(api_env: ApiEnv) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "flywheel.cli", "api", "--kubeconfig", str(api_env.cluster.kubeconfig),
            "--port", str(port), "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else "server exited"
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        eventually(ready, timeout=30, what="flywheel api to be ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_status_lists_and_shows_one_job(api_env: ApiEnv, server: str, callers: Callers,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    api_env.create_job("cli-a")
    api_env.add_pod("cli-a", 0, "Running", ready=True)
    api_env.set_status("cli-a", {"phase": "Running", "replicas": {"desired": 1, "current": 1, "ready": 1},
                                 "step": 12, "worldSize": 2})
    base = ["--server", server, "--token", callers.reader]

    def listed() -> bool:  # the reader's rights are in `default`: it lists that namespace
        main(["status", "-n", "default", *base, "-o", "json"])
        out = json.loads(capsys.readouterr().out)
        return any(j["name"] == "cli-a" and j["phase"] == "Running" for j in out["items"])

    eventually(listed, what="cli-a served by the server process's own cache")
    assert main(["status", "-n", "default", *base]) == 0
    table = capsys.readouterr().out
    assert "NAMESPACE" in table and "cli-a" in table and "Running" in table

    assert main(["status", "default/cli-a", *base, "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["name"] == "cli-a" and body["workers"][0]["pod"] == "cli-a-worker-0" and body["step"] == 12
    assert main(["status", "cli-a", *base]) == 0
    shown = capsys.readouterr().out
    assert "cli-a-worker-0" in shown and "0-1" in shown and "12 of 30" in shown


def test_status_reports_refusals_and_unreachable_servers(server: str, callers: Callers,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--server", server, "--token", "wrong"]) == 1  # the TokenReview does not authenticate it
    assert "401" in capsys.readouterr().err
    assert main(["status", "nope", "--server", server, "--token", callers.stranger]) == 1  # RBAC: no rights at all
    err = capsys.readouterr().err
    assert "403" in err and f"'system:serviceaccount:default:{STRANGER}' may not get trainingjobs.{GROUP}" in err
    assert main(["status", "--server", server, "--token", callers.reader]) == 1  # a Role: no rights across namespaces
    err = capsys.readouterr().err
    assert "403" in err and "may not list" in err and "ask for one namespace" in err
    assert main(["status", "nope", "--server", server, "--token", callers.reader]) == 1
    assert "TrainingJob default/nope not found" in capsys.readouterr().err
    assert main(["status", "--server", f"http://127.0.0.1:{free_port()}", "--token", callers.reader]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_module_app_is_configured_by_the_environment(api_env: ApiEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    """`uvicorn flywheel.api.app:app`: the cache, token file and actions come from FLYWHEEL_* at startup."""
    from fastapi.testclient import TestClient

    from flywheel.api import app as app_module

    api_env.create_job("env-job")
    monkeypatch.setenv("FLYWHEEL_KUBECONFIG", str(api_env.cluster.kubeconfig))
    monkeypatch.setenv("FLYWHEEL_API_TOKEN_FILE", str(api_env.token_file))
    monkeypatch.setenv("FLYWHEEL_API_READ_ONLY", "1")
    with TestClient(app_module.app) as http:
        assert http.get("/readyz").status_code == 200
        resp = http.get("/v1/jobs/default/env-job", headers={"Authorization": f"Bearer {ADMIN}"})
        assert resp.status_code == 200 and resp.json()["name"] == "env-job"
        refused = http.post("/v1/jobs/default/env-job/suspend", headers={"Authorization": f"Bearer {ADMIN}"})
        assert refused.status_code == 501
