"""The executor against the test cluster's real control plane (no kubelet serves the jobs' nodes): a deleted headless
Service is created again, and an action it cannot carry out is an error, never dropped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from flywheel.kube.client import Kube, KubeApiError
from flywheel.operator import job_actions
from flywheel.policy.decisions import CreatePod, Pass
from flywheel.spec.status import TrainingJobStatus
from tests.cluster.cluster import TestCluster as RunningCluster
from tests.operator.test_health_actions import NS, World, cluster, run  # noqa: F401 (the module's cluster fixture)


def test_a_deleted_service_comes_back_and_a_create_without_a_plan_is_an_error(
        cluster: RunningCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "svc", ("svc-a", "svc-b"), tmp_path)
        path = Kube.core(NS, "services", "svc-workers")
        assert await kube.get(path) is not None
        await kube.delete(path)
        assert await kube.get(path) is None
        await world.runner.reconcile_once()
        assert await kube.get(path) is None  # looked at again only every SERVICE_RECHECK_SECONDS
        monkeypatch.setattr(job_actions, "SERVICE_RECHECK_SECONDS", 0.0)
        await world.runner.reconcile_once()
        assert await kube.get(path) is not None
        obj = await kube.get(world.path)
        assert obj is not None
        with pytest.raises(RuntimeError, match="no plan"):
            await world.runner.actuator.act(obj, None, Pass(TrainingJobStatus(), [CreatePod(0, 0)]))
    run(cluster, scenario)


def test_a_refused_pod_create_is_reported_and_tried_again_soon(
        cluster: RunningCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Its pass counted the pod in status.replicas.current: the pass after the retry delay sees it missing."""
    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "refused", ("ref-a", "ref-b"), tmp_path)
        runner = world.runner
        real_create = refusing(monkeypatch, kube, "/pods", KubeApiError(403, {"message": "exceeded quota: pods"}))
        for i in (0, 1):  # the job's pods gone: a pass creates them again (a whole-job restart, same path)
            await kube.delete(Kube.core(NS, "pods", f"refused-worker-{i}"), grace_seconds=0)
        before = time.time()
        for _ in range(5):  # the pass that records the loss, then the one that creates
            await runner.reconcile_once()
            if runner.actuator.create_retry_due is not None:
                break
        assert runner.actuator.create_retry_due is not None
        assert before + job_actions.CREATE_RETRY_SECONDS <= runner.actuator.create_retry_due <= time.time() + 3
        assert runner.next_due() is not None and runner.next_due() <= runner.actuator.create_retry_due  # type: ignore[operator]
        events = await kube.request("GET", Kube.core(NS, "events"))
        failed = [e for e in events["items"] if e["reason"] == "CreateFailed"]
        assert failed and "exceeded quota: pods" in failed[0]["message"]
        await runner.reconcile_once()  # the retry's pass: the refusal is in the status too, while it lasts
        status, reason, message = _replica_failure(await kube.get(world.path))
        assert (status, reason) == ("True", "CreateFailed") and "exceeded quota: pods" in message
        monkeypatch.setattr(kube, "create", real_create)  # the quota raised
        for _ in range(3):
            await runner.reconcile_once()
        assert _replica_failure(await kube.get(world.path))[:2] == ("False", "Created")
    run(cluster, scenario)


def refusing(monkeypatch: pytest.MonkeyPatch, kube: Kube, suffix: str, error: Exception) -> Any:
    """`kube.create` raises `error` for paths ending in `suffix` (a quota, RBAC); the real create, returned, to
    set back."""
    real_create = kube.create

    async def create(path: str, body: dict[str, Any]) -> Any:
        if path.endswith(suffix):
            raise error
        return await real_create(path, body)

    monkeypatch.setattr(kube, "create", create)
    return real_create


def _replica_failure(obj: dict[str, Any] | None) -> tuple[str, str, str]:
    assert obj is not None
    [held] = [c for c in obj["status"]["conditions"] if c["type"] == "ReplicaFailure"]
    return held["status"], held["reason"], held["message"]


def test_the_jobs_disruption_budget_is_created_owned_patched_and_a_refusal_reported_once(
        cluster: RunningCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The first pass creates the job's PodDisruptionBudget (owned by the job: the garbage collector takes it with
    the job); a runner that finds one already there (an earlier operator's, or replicas.max moved) patches its
    minAvailable; a refused write is one CreateFailed event per cause, and the job runs on without it."""
    budgets = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"

    async def scenario(kube: Kube) -> None:
        world = await World.create(kube, "pdb", ("pdb-a", "pdb-b"), tmp_path)
        budget = await kube.get(f"{budgets}/pdb")
        assert budget is not None and budget["spec"]["minAvailable"] == 2, budget
        assert budget["spec"]["selector"]["matchLabels"] == {"flywheel.dev/job": "pdb", "flywheel.dev/role": "worker"}
        [owner] = budget["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingJob", "pdb", True)
        await kube.merge_patch(f"{budgets}/pdb", {"spec": {"minAvailable": 7}})
        monkeypatch.setattr(job_actions, "SERVICE_RECHECK_SECONDS", 0.0)
        world.runner.actuator.budget_min = None  # a new operator's runner
        await world.runner.reconcile_once()
        assert (await kube.get(f"{budgets}/pdb") or {})["spec"]["minAvailable"] == 2

        other = await World.create(kube, "refused-pdb", ("rp-a", "rp-b"), tmp_path)
        real_create = refusing(monkeypatch, kube, "/poddisruptionbudgets",
                               KubeApiError(403, {"message": "poddisruptionbudgets is forbidden"}))
        await kube.delete(f"{budgets}/refused-pdb")
        other.runner.actuator.budget_min = None
        for _ in range(3):
            await other.runner.reconcile_once()
        events = (await kube.request("GET", Kube.core(NS, "events")))["items"]
        failed = [e["message"] for e in events
                  if e["reason"] == "CreateFailed" and "PodDisruptionBudget" in e["message"]]
        assert len(failed) == 1 and "forbidden" in failed[0], failed
        assert (await other.status())["phase"] == "Running"
        monkeypatch.setattr(kube, "create", real_create)  # the grant added
        await other.runner.reconcile_once()
        assert await kube.get(f"{budgets}/refused-pdb") is not None
    run(cluster, scenario)
