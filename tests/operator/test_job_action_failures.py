"""A failure after the status write (operator/job_actions.py), without I/O: a refused headless Service is reported
once per cause and tried again soon without holding up the pods; a failed action does not drop the others; a wide
job's pods are created concurrently after a slow start, and a refused pod stops the rest of its pass's creates."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from flywheel.kube.client import Kube, KubeApiError
from flywheel.operator import job_actions
from flywheel.operator import manifests as m
from flywheel.operator.create_failures import CreateFailures
from flywheel.operator.job_actions import Actuator
from flywheel.operator.observe import Acted
from flywheel.policy.decisions import CreatePod, DeleteJob, DeletePod, Pass
from flywheel.spec import TrainingJob
from flywheel.spec.status import TrainingJobStatus
from tests import builders
from tests.builders import job_doc

OBJ = job_doc(namespace="ml", **{"metadata.uid": "u-1"})


def job(replicas: int = 2) -> TrainingJob:
    return builders.job({"replicas": {"min": replicas, "max": replicas},
                         "trainer": {"training": {"globalBatch": 4 * replicas, "microBatch": 4}}},
                        namespace="ml", **{"metadata.uid": "u-1"})


class FakeKube:
    """Records creates, deletes and events; `refuse` maps a path suffix to the error its create/delete raises."""

    def __init__(self, refuse: dict[str, Exception]) -> None:
        self.refuse, self.created, self.deleted, self.events = refuse, [], [], []
        self.in_flight, self.most_in_flight, self.order = 0, 0, []  # creates under way; every create/delete asked

    def _check(self, path: str) -> None:
        for suffix, err in self.refuse.items():
            if suffix in path:
                raise err

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.order.append(("create", body["metadata"]["name"]))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)  # an API round trip: the next create may start meanwhile
            self._check(path + "/" + body["metadata"]["name"])
        finally:
            self.in_flight -= 1
        self.created.append(path)
        return body

    async def delete(self, path: str, uid: str | None = None, grace_seconds: int | None = None) -> None:
        self.order.append(("delete", path.rsplit("/", 1)[-1]))
        self._check(path)
        self.deleted.append(path)

    async def post_event(self, obj: dict[str, Any], etype: str, reason: str, message: str) -> None:
        self.events.append((etype, reason, message))


class NoService:
    async def service_exists(self, namespace: str, name: str) -> bool:
        return False


def actuator(kube: FakeKube) -> Actuator:
    """An actuator with no etcd, whose observer's parts are bare: no I/O but the fake API's."""
    own = SimpleNamespace(deleted_pod=lambda *_: None, wrote_pod=lambda *_: None)
    observer = SimpleNamespace(reads=NoService(), own=own, acted=Acted(), events_path=None,
                               etcd=SimpleNamespace(etcd=None, drain=None), create_failures=CreateFailures())
    actions = Actuator(kube, m.OperatorSettings(etcd_endpoints=""), logging.getLogger("test"),  # type: ignore[arg-type]
                       ("ml", "j", "u-1"), observer)  # type: ignore[arg-type]
    actions.pod_group_tried = True
    actions.budget_min = 2  # the job's budget written already
    return actions


@pytest.mark.parametrize("error", [KubeApiError(403, {"message": "exceeded quota: services"}),
                                   aiohttp.ClientConnectionError("connection reset")])
def test_a_refused_service_is_reported_once_per_cause_and_tried_again_soon(error: Exception) -> None:
    kube = FakeKube({"/services": error})
    actions = actuator(kube)

    async def passes(n: int) -> None:
        for _ in range(n):
            actions.create_retry_due = None  # as every pass starts
            await actions.ensure_service(OBJ, job())  # does not raise: the pass goes on to its pods
            assert actions.create_retry_due is not None  # woken again to retry, not only at the safety tick
    asyncio.run(passes(3))
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "CreateFailed")]  # once, with the API's message
    assert str(error).split(":")[-1].strip() in kube.events[0][2] and "Service j-workers" in kube.events[0][2]
    kube.refuse["/services"] = KubeApiError(403, {"message": "denied by policy require-labels"})
    asyncio.run(passes(1))
    assert len(kube.events) == 2 and "require-labels" in kube.events[1][2]  # a new cause: reported
    del kube.refuse["/services"]
    actions.create_retry_due = None
    asyncio.run(actions.ensure_service(OBJ, job()))
    assert kube.created == [Kube.core("ml", "services")] and actions.create_retry_due is None
    assert actions.service_failure == "" and actions.service_checked_at is not None


def test_a_failed_action_does_not_drop_the_others_and_the_pass_still_fails() -> None:
    kube = FakeKube({"pods/a": KubeApiError(503, {"message": "etcd leader changed"})})
    actions = actuator(kube)
    result = Pass(TrainingJobStatus(), [DeletePod("a", "uid-a"), DeletePod("b", "uid-b"), DeleteJob()])
    with pytest.raises(KubeApiError, match="leader changed"):  # retried by the runner's loop
        asyncio.run(actions.act(OBJ, job(), result))
    assert kube.deleted == [Kube.core("ml", "pods", "b"), actions.path]


def test_an_event_lost_to_a_connection_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Down(FakeKube):
        async def post_event(self, *args: Any) -> None:
            raise TimeoutError()
    asyncio.run(actuator(Down({})).event(OBJ, "Warning", "X", "y"))
    assert "could not post event X" in caplog.text


def test_retry_keeps_the_earliest_due() -> None:
    actions = actuator(FakeKube({}))
    actions._retry_create_at(10.0)
    actions._retry_create_at(20.0)
    assert actions.create_retry_due == 10.0
    assert job_actions.CREATE_RETRY_SECONDS > 0


def test_a_wide_jobs_pods_are_created_together_after_a_slow_start_in_the_passes_order() -> None:
    kube = FakeKube({})
    actions = actuator(kube)
    creates = [CreatePod(i, 1) for i in range(64)]
    result = Pass(TrainingJobStatus(), [DeletePod("j-worker-0", "uid-old"), *creates, DeleteJob()])
    asyncio.run(actions.act(OBJ, job(64), result))
    assert kube.order[0] == ("delete", "j-worker-0")  # before the create of the same name
    assert kube.order[-1] == ("delete", "j")  # after every create
    assert sorted(name for what, name in kube.order if what == "create") == sorted(f"j-worker-{i}" for i in range(64))
    assert kube.most_in_flight == job_actions.CREATES_IN_FLIGHT  # 1, 2, 4, 8, then 16 at once


def test_a_refused_pod_stops_the_rest_of_its_passs_creates_and_is_tried_again_soon() -> None:
    kube = FakeKube({"/j-worker-": KubeApiError(403, {"message": "exceeded quota: pods"})})
    actions = actuator(kube)
    result = Pass(TrainingJobStatus(), [CreatePod(i, 1) for i in range(64)])
    asyncio.run(actions.act(OBJ, job(64), result))  # a refused create is a condition, not the pass's failure
    assert [name for _, name in kube.order] == ["j-worker-0"]  # one try per pass, not 64
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "CreateFailed")] and "quota" in kube.events[0][2]
    assert actions.create_retry_due is not None
    kube.refuse = {"/j-worker-3": KubeApiError(403, {"message": "exceeded quota: pods"})}
    kube.order.clear()
    asyncio.run(actions.act(OBJ, job(64), result))
    assert len(kube.order) == 1 + 2 + 4  # the batch holding worker 3 ran whole; none after it


def test_a_refused_pod_after_the_slow_start_starts_no_further_create() -> None:
    kube = FakeKube({"/j-worker-20": KubeApiError(403, {"message": "exceeded quota: pods"})})
    actions = actuator(kube)
    asyncio.run(actions.act(OBJ, job(64), Pass(TrainingJobStatus(), [CreatePod(i, 1) for i in range(64)])))
    tried = [name for _, name in kube.order]
    assert len(tried) <= 1 + 2 + 4 + 8 + job_actions.CREATES_IN_FLIGHT  # those under way when it failed, no more
    assert "j-worker-20" in tried and "j-worker-63" not in tried
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "CreateFailed")]
