"""A fatal GPU XID on a Running job's worker node is drained ahead (health_executor.py -> the findings inbox ->
policy/drain.py) instead of the monitor deleting the pods at once; other jobs keep the old path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flywheel.monitor.findings import FindingsInbox
from flywheel.operator.health_executor import KubeHealthActions
from flywheel.policy.xid import NodeFault, WatchedPod


class FakeKube:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.events: list[tuple[Any, ...]] = []

    async def merge_patch(self, path: str, body: Any) -> dict[str, Any]:
        return {}

    async def delete(self, path: str, *args: Any) -> None:
        self.deleted.append(path.rsplit("/", 1)[1])

    async def post_event(self, obj: Any, *args: Any) -> None:
        self.events.append(args)


class Reads:
    async def job(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}}


class Inventory:
    def __init__(self, phase: str) -> None:
        self.phases, self.reads = {("ml", "j"): phase}, Reads()


POD = WatchedPod("j-worker-1", "ml", "j", "1", "gpu-3", "Running", 0.0)
FAULT = NodeFault("gpu-3", (79,), (POD,), cordon=True)


@pytest.mark.parametrize("phase, drained", [("Running", True), ("Restarting", False)])
def test_a_running_jobs_fatal_xid_goes_to_its_inbox_not_to_a_delete(phase: str, drained: bool) -> None:
    kube, inbox = FakeKube(), FindingsInbox()
    actions = KubeHealthActions(kube, Inventory(phase), lambda ns, name: inbox)  # type: ignore[arg-type]
    asyncio.run(actions.replace_pods([POD], FAULT))
    faults = inbox.snapshot().node_faults
    if drained:
        assert kube.deleted == [] and faults == (("gpu-3", FAULT.message),)
    else:
        assert kube.deleted == ["j-worker-1"] and faults == ()
    assert [e[1] for e in kube.events] == ["GPUFatalXid"]


def test_a_node_fault_is_consumed_by_the_pass_that_read_it() -> None:
    inbox = FindingsInbox()
    inbox.report_node_fault("gpu-3", "XID 79")
    seen = inbox.snapshot()
    inbox.report_hang("stuck", 0)  # a later finding survives the consumption
    inbox.consumed(seen)
    after = inbox.snapshot()
    assert after.node_faults == () and after.hang is not None and after.hang.message == "stuck"
