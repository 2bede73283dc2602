"""The executor against the API emulator (no kubelet): a deleted headless Service is created again, and an action
it cannot carry out is an error, never dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.kube.client import Kube
from flywheel.operator import job_actions
from flywheel.policy.decisions import CreatePod, Pass
from flywheel.spec_status import TrainingJobStatus
from tests.k8s_emulator.fixtures import RunningCluster
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
            await world.runner._act(obj, None, Pass(TrainingJobStatus(), [CreatePod(0, 0)]))
    run(cluster, scenario)
