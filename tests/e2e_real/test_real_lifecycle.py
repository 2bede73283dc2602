"""Real-cluster twins of the lifecycle and start-failure scenarios of tests/operator (see conftest.py for the
settings; skipped without KUBECONFIG): an invalid or unpullable image, activeDeadlineSeconds,
ttlSecondsAfterFinished, a user's own script, a restart request, `flywheel render` against the pods the chart's
operator made, gang scheduling and the REST API's actions.

Two need what only some clusters have, and skip without it: `FLYWHEEL_E2E_GANG=scheduler-plugins` says the chart was
installed with `operator.gangScheduler: scheduler-plugins` and that scheduler runs; `FLYWHEEL_E2E_API_URL` (e.g.
`http://127.0.0.1:8700` through `kubectl port-forward svc/<release>-flywheel-api 8700`) and
`FLYWHEEL_E2E_API_TOKEN` (a bearer token the API accepts for a user allowed to patch TrainingJobs in the test
namespace) reach the chart's REST API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_real.conftest import RealCluster, eventually
from tests.operator.test_pod_template_cluster import _subset

LONG = {"trainer.training.steps": 400, "checkpoint.everySteps": 20}
# What `flywheel render` takes of the operator's flags (the chart's Deployment passes them as --flag=value).
RENDER_FLAGS = ("--etcd-endpoints", "--events-dir", "--events-claim", "--metrics-port-base", "--worker-env",
                "--gang-scheduler", "--security-profile", "--rdma-resource")
RENDER_SWITCHES = ("--no-disruption-budgets",)
# A torchrun-style script with no Flywheel import, inline (the image carries the package, not examples/).
USER_SCRIPT = ("import os, torch, torch.distributed as dist\n"
               "dist.init_process_group('gloo')\n"
               "t = torch.full((4,), float(dist.get_rank() + 1)); dist.all_reduce(t)\n"
               "w = dist.get_world_size(); assert t[0].item() == w * (w + 1) / 2, t\n"
               "print(f'user script: world={w} rank={dist.get_rank()} restart='\n"
               "      f\"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\", flush=True)\n"
               "dist.destroy_process_group()\n")


def _failed(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Failed" and c["status"] == "True")


def test_an_invalid_image_name_fails_the_job_at_once(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_cluster's: the kubelet's InvalidImageName fails the job at once, naming spec.image."""
    name = "e2e-bad-image"
    real.apply_job(name, tmp_path, image="Flywheel:Latest")
    status = real.wait_phase(name, "Failed", 300)
    failed = _failed(status)
    assert failed["reason"] == "ImagePullError" and "InvalidImageName" in failed["message"], failed
    assert "spec.image" in failed["message"] and status.get("restarts", 0) == 0
    eventually(lambda: real.pods(name) == [], 300, "the workers that cannot start to be deleted")


def test_an_unpullable_image_fails_after_the_pull_grace(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_cluster's: ErrImagePull / ImagePullBackOff from a registry that does not resolve is given
    startFailureGraceSeconds, then fails the job with the same condition."""
    name, grace = "e2e-no-pull", 30
    real.apply_job(name, tmp_path, image="registry.invalid/flywheel:latest",
                   **{"faultTolerance.startFailureGraceSeconds": grace})
    status = real.wait_phase(name, "Failed", grace + 600)
    failed = _failed(status)
    assert failed["reason"] == "ImagePullError" and "registry.invalid" in failed["message"], failed
    assert "ImagePullError" in real.kubectl("describe", "tj", name).stdout


def test_the_deadline_fails_the_job_and_stops_the_workers(real: RealCluster, tmp_path: Path) -> None:
    name = "e2e-deadline"
    real.apply_job(name, tmp_path, **{**LONG, "trainer.training.steps": 1_000_000,
                                      "runPolicy.activeDeadlineSeconds": 60})
    status = real.wait_phase(name, "Failed", 600)
    assert _failed(status)["reason"] == "DeadlineExceeded"
    eventually(lambda: all(p["status"].get("phase") in ("Succeeded", "Failed") for p in real.pods(name)), 300,
               "the workers to stop")


def test_ttl_deletes_the_finished_job_and_its_pods(real: RealCluster, tmp_path: Path) -> None:
    name = "e2e-ttl"
    real.apply_job(name, tmp_path, **{"runPolicy.ttlSecondsAfterFinished": 5})
    real.wait_phase(name, "Succeeded", 900)
    eventually(lambda: real.kubectl("get", "tj", name, check=False).returncode != 0, 300, "the TTL deletion")
    eventually(lambda: real.pods(name) == [], 300, "garbage collection of the pods")


def test_a_user_script_runs_under_the_same_agent(real: RealCluster, tmp_path: Path) -> None:
    name = "e2e-user-script"
    real.apply_job(name, tmp_path, command=["python", "-c", USER_SCRIPT], **{"faultTolerance.restartScope": "worker"})
    real.wait_phase(name, "Succeeded", 900)
    logs = "".join(real.kubectl("logs", f"{name}-worker-{i}").stdout for i in range(2))
    assert "user script: world=2 rank=0" in logs and "user script: world=2 rank=1" in logs, logs


def test_a_restart_request_restarts_every_worker_once(real: RealCluster, tmp_path: Path) -> None:
    """The annotation the REST API's restart sets: one restart from the last checkpoint, no budget spent."""
    name, at = "e2e-restart-request", "2026-11-22T09:00:00Z"
    real.apply_job(name, tmp_path, **LONG)
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    real.kubectl("annotate", "tj", name, f"flywheel.dev/restart-requested-at={at}")
    status = real.wait_phase(name, "Succeeded", 1800)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "RestartRequested", status
    assert status["restartRequestHandled"] == at and status["restartBudget"].get("used", 0) == 0


def test_quick_changes_of_mind_are_no_restarts(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's: scaled down and straight back up, then suspended and straight resumed,
    each while the pods it deleted may still be terminating: no restart is counted and the job Succeeds."""
    name = "e2e-changes"
    real.apply_job(name, tmp_path, **{**LONG, "replicas": {"min": 1, "max": 2}})
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")

    def leaving(count: int) -> bool:  # a pod terminating, or already down to `count` pods
        pods = real.pods(name)
        return any(p["metadata"].get("deletionTimestamp") for p in pods) or len(pods) == count
    real.kubectl("scale", "tj", name, "--replicas", "1")
    eventually(lambda: leaving(1), 300, "worker 1 leaving")
    real.kubectl("scale", "tj", name, "--replicas", "2")
    eventually(lambda: len([p for p in real.pods(name) if not p["metadata"].get("deletionTimestamp")]) == 2
               and real.status(name).get("phase") == "Running", 900, "two workers running again")
    real.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    eventually(lambda: leaving(0), 300, "the suspended workers leaving")
    real.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    status = real.wait_phase(name, "Succeeded", 1800)
    assert status["restarts"] == 0 and status["step"] == 400, status


def test_an_edit_the_workers_do_not_see_is_said_and_applied_by_suspend_and_resume(real: RealCluster,
                                                                                  tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's: steps raised mid-run is a SpecChanged condition naming the workers and the
    fix; suspended and resumed, the job ends at the new last step."""
    name = "e2e-edited"
    real.apply_job(name, tmp_path, **LONG)
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    real.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"trainer": {"training": {"steps": 600}}}}')
    changed = eventually(lambda: next((c for c in real.status(name).get("conditions", [])
                                       if c["type"] == "SpecChanged" and c["status"] == "True"), None), 300,
                         "the SpecChanged condition")
    assert "suspend and resume" in changed["message"]
    real.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    real.wait_phase(name, "Suspended", 300)
    real.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    status = real.wait_phase(name, "Succeeded", 1800)
    assert status["step"] == 600 and status["restarts"] == 0, status


def test_an_edit_the_workers_do_not_see_is_applied_when_a_worker_is_replaced(real: RealCluster,
                                                                             tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's: after steps is raised mid-run, a deleted worker's replacement is not
    created beside a worker on the old spec: every worker is created again with the new one (RecreatingWithNewSpec),
    one restart (PodDeleted) is counted and the job ends at the new last step."""
    name = "e2e-edited-replaced"
    real.apply_job(name, tmp_path, **LONG)
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    real.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"trainer": {"training": {"steps": 600}}}}')
    eventually(lambda: any(c["type"] == "SpecChanged" and c["status"] == "True"
                           for c in real.status(name).get("conditions", [])), 300, "the SpecChanged condition")
    real.kubectl("delete", "pod", f"{name}-worker-1", "--wait=false")
    status = real.wait_phase(name, "Succeeded", 1800)
    assert status["step"] == 600 and status["restarts"] == 1 and status["lastRestartReason"] == "PodDeleted", status
    described = real.kubectl("describe", "tj", name).stdout
    assert "RecreatingWithNewSpec" in described, described


def test_a_job_deleted_and_applied_again_at_once_waits_for_the_old_pods(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's: the same YAML applied again as soon as the deleted job is gone, while its
    pods may still be terminating (they hold the new pods' names): the new job runs to Succeeded with no restart,
    its pods all its own; with a shared claim (FLYWHEEL_E2E_CKPT_CLAIM) it resumes from the old job's checkpoints."""
    name = "e2e-again"
    real.apply_job(name, tmp_path, **LONG)
    eventually(lambda: real.status(name).get("lastCheckpoint", {}).get("step", 0) >= 20, 900, "a checkpoint")
    real.kubectl("delete", "tj", name, "--wait=false")
    eventually(lambda: real.kubectl("get", "tj", name, check=False).returncode != 0, 300, "the old job to go")
    real.kubectl("apply", "-f", str(tmp_path / f"{name}.yaml"))
    new = json.loads(real.kubectl("get", "tj", name, "-o", "json").stdout)["metadata"]["uid"]
    status = real.wait_phase(name, "Succeeded", 1800)
    assert status["restarts"] == 0, status
    assert {o["uid"] for p in real.pods(name) for o in p["metadata"]["ownerReferences"]} == {new}
    if os.environ.get("FLYWHEEL_E2E_CKPT_CLAIM"):
        assert "(resumed from " in real.kubectl("logs", f"{name}-worker-0").stdout


def _operator_args(real: RealCluster) -> list[str]:
    """The chart's operator flags that `flywheel render` takes, from its Deployment."""
    out = real.kubectl("get", "deployments", "-l", real.operator_selector, "-o", "json",
                       namespace=real.operator_ns).stdout
    deployments = json.loads(out)["items"]
    assert deployments, f"no operator Deployment matches {real.operator_selector} in {real.operator_ns}"
    args = deployments[0]["spec"]["template"]["spec"]["containers"][0].get("args") or []
    return [a for a in args if (a.split("=", 1)[0] in RENDER_FLAGS and "=" in a) or a in RENDER_SWITCHES]


def test_render_prints_the_pods_the_operator_created(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_pod_template_cluster's: `flywheel render` with the job's uid and the chart's operator flags
    prints what the operator created (each rendered field as the live object has it, server defaults aside)."""
    name = "e2e-render"
    real.apply_job(name, tmp_path, **{"trainer.training.steps": 10})
    real.wait_phase(name, "Succeeded", 900)
    uid = json.loads(real.kubectl("get", "tj", name, "-o", "json").stdout)["metadata"]["uid"]
    rendered_run = subprocess.run([sys.executable, "-m", "flywheel.cli", "render", str(tmp_path / f"{name}.yaml"),
                                   "-o", "json", "--uid", uid, *_operator_args(real)],
                                  capture_output=True, text=True, timeout=120)
    assert rendered_run.returncode == 0, rendered_run.stderr
    rendered = json.loads(rendered_run.stdout)["items"]
    assert sorted(o["metadata"]["name"] for o in rendered if o["kind"] == "Pod") == \
        sorted(p["metadata"]["name"] for p in real.pods(name))
    for obj in rendered:  # the Service, the budget, the pods, and a PodGroup where the chart sets a gang scheduler
        live = _live(real, obj)
        assert _subset(obj["spec"], live["spec"]) == [], obj["metadata"]["name"]
        assert obj["metadata"].get("labels") == live["metadata"].get("labels"), obj["metadata"]["name"]


def _live(real: RealCluster, obj: dict[str, Any]) -> dict[str, Any]:
    group = obj["apiVersion"].rpartition("/")[0]
    resource = f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()
    return dict(json.loads(real.kubectl("get", resource, obj["metadata"]["name"], "-o", "json").stdout))


@pytest.mark.skipif(os.environ.get("FLYWHEEL_E2E_GANG") != "scheduler-plugins",
                    reason="set FLYWHEEL_E2E_GANG=scheduler-plugins on a cluster running that scheduler, with the "
                           "chart's operator.gangScheduler set to it")
def test_gang_jobs_get_a_podgroup(real: RealCluster, tmp_path: Path) -> None:
    name = "e2e-gang"
    real.apply_job(name, tmp_path)
    group = eventually(lambda: json.loads(real.kubectl("get", "podgroups.scheduling.x-k8s.io", name, "-o", "json",
                                                       check=False).stdout or "null"), 300, "a PodGroup")
    assert group["spec"]["minMember"] == 2 and group["metadata"]["ownerReferences"][0]["name"] == name
    for pod in eventually(lambda: len(p := real.pods(name)) == 2 and p, 300, "the pods"):
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == name
    real.wait_phase(name, "Succeeded", 900)


API_URL, API_TOKEN = os.environ.get("FLYWHEEL_E2E_API_URL", ""), os.environ.get("FLYWHEEL_E2E_API_TOKEN", "")


@pytest.mark.skipif(not (API_URL and API_TOKEN), reason="set FLYWHEEL_E2E_API_URL and FLYWHEEL_E2E_API_TOKEN to "
                    "reach the chart's REST API (this file's docstring)")
def test_the_rest_api_acts_through_the_trainingjob(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's REST API test: suspend, resume, restart and scale through the API, each
    seen in `kubectl get tj`."""
    import httpx

    name = "e2e-api"
    real.apply_job(name, tmp_path, **{**LONG, "trainer.training.steps": 20000, "replicas": {"min": 1, "max": 2}})
    base, auth = f"{API_URL}/v1/jobs/{real.namespace}/{name}", {"Authorization": f"Bearer {API_TOKEN}"}

    def act(method: str, action: str, **body: Any) -> dict[str, Any]:
        resp = httpx.request(method, f"{base}/{action}", headers=auth, timeout=30, **({"json": body} if body else {}))
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    try:
        eventually(lambda: real.status(name).get("step", 0) >= 20, 900, "step 20")
        assert httpx.get(base, timeout=30).status_code == 401
        act("POST", "suspend")
        real.wait_phase(name, "Suspended", 300)
        act("POST", "resume")
        real.wait_phase(name, "Running", 600)
        act("POST", "restart")
        eventually(lambda: real.status(name).get("restarts") == 1, 300, "the requested restart")
        assert real.status(name)["lastRestartReason"] == "RestartRequested"
        assert act("PATCH", "scale", replicas=1)["job"]["spec"]["replicasTarget"] == 1
        eventually(lambda: [p["metadata"]["name"] for p in real.pods(name)] == [f"{name}-worker-0"], 300,
                   "worker 1 to go")
    finally:
        real.kubectl("delete", "tj", name, "--wait=false", check=False)


def test_the_product_client_lists_in_pages(real: RealCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twin of tests/emulator_fidelity/test_list_paging.py's client check: 7 ConfigMaps read 3 at a time by the
    client the operator and the REST API use."""
    import asyncio

    from flywheel.kube import client as kube_client
    from flywheel.kube.auth import load_credentials

    names = [f"e2e-page-{i}" for i in range(7)]
    for name in names:
        real.kubectl("create", "configmap", name)
    monkeypatch.setattr(kube_client, "LIST_PAGE", 3)

    async def listed() -> list[str]:
        kube = kube_client.Kube(await load_credentials(real.kubeconfig))
        try:
            items = await kube.list(kube_client.Kube.core(real.namespace, "configmaps"))
            return [item["metadata"]["name"] for item in items]
        finally:
            await kube.close()

    try:
        assert [n for n in asyncio.run(listed()) if n.startswith("e2e-page-")] == names
    finally:
        real.kubectl("delete", "configmap", *names, check=False)
