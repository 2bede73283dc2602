"""What the operator holds for the jobs it runs, without a cluster: the watched objects pass on to kopf without
their managedFields (kopf keeps each job's last body), and at most REQUESTS_IN_FLIGHT of its API requests are under
way at once (each holds a connection and its TLS buffers for as long as the pool keeps it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from kopf._cogs.clients import watching
from kopf._cogs.structs import references

from flywheel.kube.auth import Connection
from flywheel.operator import api_slots, job_actions
from flywheel.operator.api_slots import OperatorKube
from flywheel.operator.watch_relist import reconcile_relists

JOBS = references.Resource(group="flywheel.dev", version="v1", plural="trainingjobs", kind="TrainingJob",
                           namespaced=True)


def test_watched_objects_pass_on_without_their_managed_fields() -> None:
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                        "managedFields": [{"manager": "kopf", "fieldsV1": {"f:metadata": {}}}]},
           "spec": {"replicas": {"min": 1}}}

    async def stream() -> AsyncIterator[Any]:
        yield {"type": None, "object": job}
        yield watching.Bookmark.LISTED
        yield {"type": "MODIFIED", "object": {**job, "metadata": {**job["metadata"], "resourceVersion": "2"}}}

    async def passed() -> list[Any]:
        return [event async for event in reconcile_relists(stream(), JOBS, whole=True)]

    events = asyncio.run(passed())
    objects = [e["object"] for e in events if isinstance(e, dict)]
    assert [o["metadata"]["resourceVersion"] for o in objects] == ["1", "2"]
    assert all("managedFields" not in o["metadata"] and o["spec"] == {"replicas": {"min": 1}} for o in objects)


class CountingKube(OperatorKube):
    """Answers every request after a round trip, counting those under way at once."""

    def __init__(self, in_flight: int) -> None:
        super().__init__(Connection("http://unused"), in_flight)
        self.under_way = self.most = 0

    async def _send(self, method: str, path: str, body: Any, params: dict[str, str] | None,
                    content_type: str) -> tuple[int, Any, Connection]:
        self.under_way += 1
        self.most = max(self.most, self.under_way)
        await asyncio.sleep(0.001)
        self.under_way -= 1
        return 201, body, self.conn


def test_at_most_the_slots_requests_are_under_way_and_each_gets_its_answer() -> None:
    kube = CountingKube(4)

    async def creates() -> list[Any]:
        return await asyncio.gather(*(kube.create("/api/v1/namespaces/ns/pods", {"n": i}) for i in range(20)))

    assert asyncio.run(creates()) == [{"n": i} for i in range(20)]
    assert kube.most == 4
    assert api_slots.REQUESTS_IN_FLIGHT >= 2 * job_actions.CREATES_IN_FLIGHT  # a wide job's creates and others' writes
